// Package version says which kvroute this is: the version the module was
// built as (runtime/debug.ReadBuildInfo: a tagged `go install` gives its
// tag) or the one set at link time, the VCS revision and the Go version.
// It is read by `kvroute version`, the kvroute_build_info metric and the
// tracer's service.version. It must not import other kvroute packages.
package version

import (
	"runtime"
	"runtime/debug"
	"sync"
)

// Version is set at link time by release builds:
//
//	go build -ldflags "-X github.com/kvroute/kvroute/internal/version.Version=v1.2.3" ./cmd/kvroute
//
// It wins over the module's version. Empty otherwise.
var Version string

// Info is the build's identity.
type Info struct {
	// Version is Version, else the main module's version (a pseudo-version
	// stamped from the commit for a build in a git checkout, "(devel)" without
	// VCS stamping),
	// else "unknown".
	Version string
	// Revision is the VCS revision the binary was built from, with
	// "-dirty" when the tree had changes; "unknown" without VCS stamping.
	Revision string
	// GoVersion is the toolchain's, e.g. go1.26.10.
	GoVersion string
}

// readBuildInfo is debug.ReadBuildInfo; a test seam.
var readBuildInfo = debug.ReadBuildInfo

var (
	once sync.Once
	info Info
)

// Get returns the build's identity, read once.
func Get() Info {
	once.Do(func() { info = read() })
	return info
}

func read() Info {
	i := Info{Version: Version, Revision: "unknown", GoVersion: runtime.Version()}
	bi, ok := readBuildInfo()
	if ok {
		if i.Version == "" && bi.Main.Version != "" {
			i.Version = bi.Main.Version
		}
		var rev string
		dirty := false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if rev != "" {
			i.Revision = rev
			if dirty {
				i.Revision += "-dirty"
			}
		}
		if bi.GoVersion != "" {
			i.GoVersion = bi.GoVersion
		}
	}
	if i.Version == "" {
		i.Version = "unknown"
	}
	return i
}

// String is the one line `kvroute version` prints.
func (i Info) String() string {
	return "kvroute " + i.Version + " (revision " + i.Revision + ", " + i.GoVersion + ")"
}
