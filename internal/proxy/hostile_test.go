package proxy

import (
	"net/http"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/openai"
)

// TestMissingModel: a body with no model, or a null one, matched every
// backend whatever pool it serves; it is a 400 now, before any backend.
func TestMissingModel(t *testing.T) {
	r := newRig(t, "round-robin", 2, func(c *config.Config) {
		c.Backends[0].Models = []string{"a"}
		c.Backends[1].Models = []string{"b"}
	})
	tests := []struct{ name, path, body string }{
		{"chat without model", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`},
		{"chat with null model", "/v1/chat/completions", `{"model":null,"messages":[{"role":"user","content":"hi"}]}`},
		{"chat with empty model", "/v1/chat/completions", `{"model":"","messages":[{"role":"user","content":"hi"}]}`},
		{"completion without model", "/v1/completions", `{"prompt":"hi"}`},
		{"completion with null model", "/v1/completions", `{"model":null,"prompt":"hi"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := r.post(tt.path, tt.body)
			checkErrorShape(t, res, http.StatusBadRequest, openai.TypeInvalidRequest)
			if !strings.Contains(string(res.body), "missing_model") {
				t.Errorf("body %s lacks missing_model", res.body)
			}
		})
	}
	if h := r.backends[0].hits.Load() + r.backends[1].hits.Load(); h != 0 {
		t.Errorf("%d requests without a model reached a backend", h)
	}
	if res := r.post("/v1/chat/completions", chat("b", false, "hi")); res.status != 200 || res.header.Get(headerBackend) != "b1" {
		t.Errorf("model b: status %d backend %q", res.status, res.header.Get(headerBackend))
	}
}
