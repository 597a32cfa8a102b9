package version

import (
	"runtime/debug"
	"testing"
)

func TestRead(t *testing.T) {
	defer func(v string, f func() (*debug.BuildInfo, bool)) { Version, readBuildInfo = v, f }(Version, readBuildInfo)
	bi := &debug.BuildInfo{GoVersion: "go1.99.1", Main: debug.Module{Path: "github.com/kvroute/kvroute", Version: "v0.4.0"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.modified", Value: "true"}}}
	readBuildInfo = func() (*debug.BuildInfo, bool) { return bi, true }
	tests := []struct {
		name, linked string
		want         Info
	}{
		{"module version", "", Info{Version: "v0.4.0", Revision: "abc123-dirty", GoVersion: "go1.99.1"}},
		{"link-time version wins", "v1.2.3", Info{Version: "v1.2.3", Revision: "abc123-dirty", GoVersion: "go1.99.1"}},
	}
	for _, tt := range tests {
		Version = tt.linked
		if got := read(); got != tt.want {
			t.Errorf("%s: read() = %+v, want %+v", tt.name, got, tt.want)
		}
	}
	readBuildInfo = func() (*debug.BuildInfo, bool) { return nil, false }
	Version = ""
	if got := read(); got.Version != "unknown" || got.Revision != "unknown" || got.GoVersion == "" {
		t.Errorf("without build info: %+v, want unknown version and revision and the runtime's Go version", got)
	}
}

// TestGetFromTestBinary reads the test binary's own build info: whatever
// its module version, every field is filled.
func TestGetFromTestBinary(t *testing.T) {
	i := Get()
	if i.Version == "" || i.Revision == "" || i.GoVersion == "" {
		t.Errorf("Get() = %+v: a field is empty", i)
	}
	if s := i.String(); s == "" {
		t.Error("String() is empty")
	}
}
