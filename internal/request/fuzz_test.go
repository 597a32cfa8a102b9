package request

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzParse checks that no body makes Parse panic, and that every rejection
// is a client error (4xx) with a type and a message. Seeds are the bodies
// in testdata/seeds, for both endpoints.
func FuzzParse(f *testing.F) {
	seeds, err := filepath.Glob("testdata/seeds/*.json")
	if err != nil || len(seeds) == 0 {
		f.Fatalf("no seeds in testdata/seeds: %v", err)
	}
	for _, p := range seeds {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, false, "user")
		f.Add(b, true, "")
	}
	f.Fuzz(func(t *testing.T, body []byte, completion bool, field string) {
		k := Chat
		if completion {
			k = Completion
		}
		v, e := Parse(k, body, Options{SessionField: field})
		if e != nil {
			if v != nil {
				t.Fatal("both a view and an error")
			}
			if e.Status < 400 || e.Status > 499 || e.Type == "" || e.Message == "" {
				t.Fatalf("error %+v is not a well-formed client error", e)
			}
			return
		}
		if v == nil {
			t.Fatal("neither a view nor an error")
		}
		if v.PromptTokens < 0 || v.MaxTokens < 0 || v.MinTokens < 0 {
			t.Fatalf("negative counts in %+v", v)
		}
	})
}
