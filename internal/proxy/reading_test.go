package proxy

import (
	"testing"

	"github.com/kvroute/kvroute/internal/config"
)

// TestRoutedAsTheEngineReads: a body whose keys differ from a field's name
// only by case or Unicode folding goes to the pool of the model the engine
// will serve (it reads "MODEL" as an unknown field), on the completion
// endpoints and on a passthrough endpoint alike (docs/reliability.md, "One
// reading of every body").
func TestRoutedAsTheEngineReads(t *testing.T) {
	r := newRig(t, "round-robin", 2, func(c *config.Config) {
		c.Backends[0].Models = []string{"a"}
		c.Backends[1].Models = []string{"b"}
	})
	for _, tt := range []struct{ name, path, body string }{
		{"chat", "/v1/chat/completions", `{"model":"a","MODEL":"b","messages":[{"role":"user","content":"hi"}]}`},
		{"completion", "/v1/completions", `{"model":"a","Model":"b","prompt":"hi"}`},
		{"embeddings", "/v1/embeddings", `{"model":"a","MODEL":"b","input":"x"}`},
		{"last of a repeated key", "/v1/completions", `{"model":"b","model":"a","prompt":"hi"}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for range 2 {
				if res := r.post(tt.path, tt.body); res.status != 200 || res.header.Get(headerBackend) != "b0" {
					t.Fatalf("status %d backend %q, want b0, which serves model a", res.status, res.header.Get(headerBackend))
				}
			}
		})
	}
}
