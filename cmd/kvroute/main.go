// Command kvroute is a cache-aware, load-aware router for OpenAI-compatible
// LLM inference servers, with an emulated engine, a benchmark and a
// virtual-time simulator. This package only wires the subcommands; each
// lives in its own file and registers itself in commands.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strings"

	"github.com/kvroute/kvroute/internal/workload"
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
	if args[0] == "--version" || args[0] == "-version" {
		args = []string{"version"}
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

// parseFlags parses a subcommand's args into fs. When ok is false the
// command must return code: 0 after --help, 2 for a bad flag (fs has said
// which) or, with noArgs, for a stray argument.
func parseFlags(fs *flag.FlagSet, args []string, noArgs bool) (code int, ok bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0, false
		}
		return 2, false
	}
	if noArgs && fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "kvroute %s: unexpected argument %q\n", fs.Name(), fs.Arg(0))
		return 2, false
	}
	return 0, true
}

// printDefaults prints fs's flags as the usage lines write them, with two
// dashes (--backend): the flag package accepts both and prints one.
func printDefaults(fs *flag.FlagSet) {
	var b strings.Builder
	out := fs.Output()
	fs.SetOutput(&b)
	fs.PrintDefaults()
	fs.SetOutput(out)
	fmt.Fprint(out, singleDash.ReplaceAllString(b.String(), "$1--"))
}

// singleDash is the start of a flag's line in flag.PrintDefaults' output.
var singleDash = regexp.MustCompile(`(?m)^(  )-`)

// writeBuiltins lists the built-in workloads for a command's --help.
func writeBuiltins(w io.Writer) {
	fmt.Fprintln(w, "\nbuilt-in workloads:")
	for _, b := range workload.Builtins() {
		fmt.Fprintf(w, "  %-8s %s\n", b[0], b[1])
	}
}
