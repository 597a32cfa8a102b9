package main

import (
	"fmt"
	"io"
	"os"

	"github.com/kvroute/kvroute/internal/version"
)

// versionOut is where `kvroute version` prints; a test seam.
var versionOut io.Writer = os.Stdout

func init() {
	commands["version"] = command{
		summary: "print kvroute's version, VCS revision and Go version (also --version)",
		run: func(args []string) int {
			if len(args) > 0 {
				fmt.Fprintf(os.Stderr, "kvroute version: unexpected argument %q\n", args[0])
				return 2
			}
			fmt.Fprintln(versionOut, version.Get())
			return 0
		},
	}
}
