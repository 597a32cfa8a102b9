package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/version"
)

// TestVersion: `kvroute version` and `kvroute --version` print the build's
// version, revision and Go version on one line.
func TestVersion(t *testing.T) {
	old := versionOut
	t.Cleanup(func() { versionOut = old })
	v := version.Get()
	for _, args := range [][]string{{"version"}, {"--version"}, {"-version"}} {
		var out bytes.Buffer
		versionOut = &out
		if code := run(args); code != 0 {
			t.Errorf("kvroute %v: exit %d", args, code)
		}
		line := strings.TrimSpace(out.String())
		if strings.Count(out.String(), "\n") != 1 || !strings.Contains(line, v.Version) || !strings.Contains(line, v.Revision) || !strings.Contains(line, v.GoVersion) {
			t.Errorf("kvroute %v printed %q, want one line with %+v", args, out.String(), v)
		}
	}
	if code := run([]string{"version", "extra"}); code != 2 {
		t.Errorf("kvroute version extra: exit %d, want 2", code)
	}
}
