package config

import (
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestDocsListEveryKey keeps docs/configuration.md and the config in
// step: every key the YAML decoder accepts has a row in the Keys table,
// and every row names a key that exists.
func TestDocsListEveryKey(t *testing.T) {
	doc, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	// The Keys section: from its heading to the next one.
	_, keysSection, ok := strings.Cut(string(doc), "\n## Keys\n")
	if !ok {
		t.Fatal("docs/configuration.md has no Keys section")
	}
	if i := strings.Index(keysSection, "\n## "); i >= 0 {
		keysSection = keysSection[:i]
	}
	row := regexp.MustCompile("(?m)^\\| `([a-z0-9_.\\[\\]]+)` \\|")
	documented := map[string]bool{}
	for _, m := range row.FindAllStringSubmatch(keysSection, -1) {
		documented[m[1]] = true
	}
	keys := keyPaths(reflect.TypeFor[Config](), "")
	for _, k := range keys {
		if !documented[k] {
			t.Errorf("docs/configuration.md has no row for the key %s", k)
		}
	}
	for k := range documented {
		if !slices.Contains(keys, k) {
			t.Errorf("docs/configuration.md documents %s, which is no config key", k)
		}
	}
	if len(keys) < 40 {
		t.Errorf("found only %d keys: the walk over the config is broken", len(keys))
	}
}
