// Command kvroute is a cache-aware, load-aware router for OpenAI-compatible
// LLM inference servers, with an emulated engine, a benchmark and a
// virtual-time simulator. This package only wires the subcommands; each
// lives in its own file and registers itself in commands.
package main

import (
	"fmt"
	"os"
	"sort"
)

// command is one subcommand: run gets the arguments after its name and
// returns the process exit code.
type command struct {
	summary string
	run     func(args []string) int
}

var commands = map[string]command{}

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage()
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(os.Stderr, "kvroute: unknown command %q\n\n", args[0])
		usage()
		return 2
	}
	return c.run(args[1:])
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: kvroute <command> [flags]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(os.Stderr, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(os.Stderr, "\nRun 'kvroute <command> -h' for a command's flags.")
}
