// Command hello stands in for kvroute in the image test: a small static
// program that prints the version internal/version reads, as kvroute
// version does.
package main

import (
	"fmt"

	"github.com/kvroute/kvroute/internal/version"
)

func main() { fmt.Println(version.Get().Version) }
