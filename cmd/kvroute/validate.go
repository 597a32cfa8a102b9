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

Checks the config as 'kvroute serve' would use it (with the same flags
applied) and prints "ok", or the problems and exits with status 1.

flags:
`)
		fs.PrintDefaults()
	}
	if code, ok := parseFlags(fs, args, true); !ok {
		return code
	}
	if _, err := load(); err != nil {
		fmt.Fprintf(os.Stderr, "kvroute validate: %v\n", err)
		return 1
	}
	fmt.Println("ok")
	return 0
}
