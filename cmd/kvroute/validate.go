package main

import (
	"flag"
	"fmt"
	"os"
)

func init() {
	commands["validate"] = command{"check a serve config file and exit non-zero if it is wrong", runValidate}
}

func runValidate(args []string) int {
	fs := flag.NewFlagSet("validate", flag.ContinueOnError)
	load := configFlags(fs)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: kvroute validate --config FILE [serve's override flags]

Runs every check 'kvroute serve' runs before it starts, on the config as
serve would use it (the same flags and KVROUTE_* environment variables
applied, the admin token, API keys and TLS files read), and prints "ok",
or the problems and exits with status 1.

flags:
`)
		printDefaults(fs)
	}
	if code, ok := parseConfigFlags(fs, args); !ok {
		return code
	}
	if _, err := load(); err != nil {
		fmt.Fprintf(os.Stderr, "kvroute validate: %v\n", err)
		return 1
	}
	fmt.Println("ok")
	return 0
}
