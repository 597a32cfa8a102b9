package config

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

// topLevelKeys are the keys the file format accepts at the top level,
// read from Config's yaml tags.
func topLevelKeys() map[string]bool { return yamlKeys(reflect.TypeFor[Config]()) }

// yamlKeys are the keys of the struct type t in the file format.
func yamlKeys(t reflect.Type) map[string]bool {
	keys := map[string]bool{}
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		keys[name] = true
	}
	return keys
}

var plainKey = regexp.MustCompile(`^[a-z][a-z0-9_]{0,30}$`)

// FuzzParse checks that no file makes Parse or Validate panic, and that a
// key the format does not know is always an error that names it, wherever
// the rest of the file stands. Seeds are the files in testdata/seeds.
func FuzzParse(f *testing.F) {
	seeds, err := filepath.Glob("testdata/seeds/*.yaml")
	if err != nil || len(seeds) == 0 {
		f.Fatalf("no seeds in testdata/seeds: %v", err)
	}
	for _, p := range seeds {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, "listne")
	}
	known := topLevelKeys()
	healthKeys := yamlKeys(reflect.TypeFor[Health]())
	f.Fuzz(func(t *testing.T, data []byte, key string) {
		if c, err := Parse(data); err == nil {
			_ = c.Validate()
		}
		if !plainKey.MatchString(key) || known[key] {
			return
		}
		// A valid file plus one unknown top-level key must be refused.
		doc := "backends:\n  - url: http://127.0.0.1:8000\n" + key + ": 1\n"
		_, err := Parse([]byte(doc))
		if err == nil || !strings.Contains(err.Error(), key) {
			t.Fatalf("unknown key %q: error %v does not name it", key, err)
		}
		if healthKeys[key] {
			return
		}
		// And so must one in a section.
		doc = "backends:\n  - url: http://127.0.0.1:8000\nhealth:\n  interval: 1s\n  " + key + ": 1\n"
		if _, err := Parse([]byte(doc)); err == nil || !strings.Contains(err.Error(), key) {
			t.Fatalf("unknown key health.%q: error %v does not name it", key, err)
		}
	})
}
