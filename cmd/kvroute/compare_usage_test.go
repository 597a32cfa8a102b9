package main

import (
	"flag"
	"strings"
	"testing"
)

// TestCompareUsageTiers: compare's usage line names the cache sizes it
// takes (the engines' GPU and CPU tiers), which it registers as flags.
func TestCompareUsageTiers(t *testing.T) {
	fs := flag.NewFlagSet("compare", flag.ContinueOnError)
	var w fleetFlags
	compareFlags(fs, &w)
	for _, f := range []string{"kv-blocks", "cpu-kv-blocks", "duration"} {
		if fs.Lookup(f) == nil {
			t.Errorf("compare takes no --%s", f)
		}
		if !strings.Contains(compareUsage, "--"+f+" ") {
			t.Errorf("usage does not list --%s: %s", f, compareUsage)
		}
	}
}
