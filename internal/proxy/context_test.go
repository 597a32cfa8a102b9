package proxy

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/request"
)

// TestContextCheckLowerBound: the router refuses a prompt over the
// context only when even a lower bound of its tokens is over it; anything
// else reaches the engine, whose tokenizer decides. The old check (4 bytes
// a token) refused prompts of 762 and 991 real tokens against a 1,024-token
// engine, which served them directly ("about 1250 / 1625 input tokens").
func TestContextCheckLowerBound(t *testing.T) {
	r := newRig(t, "round-robin", 1, func(c *config.Config) { c.Backends[0].MaxModelLen = 1024 })
	// 6,500 bytes: 1,625 tokens at 4 bytes a token, 991 for a tokenizer
	// at 6.5 bytes a token. The backend (a 1,024-token engine) serves it.
	longTokens := words("tokenization", 6500)
	tokenIDs := func(n int) string {
		return `{"model":"shared","prompt":[` + strings.TrimSuffix(strings.Repeat("7,", n), ",") + `],"max_tokens":1}`
	}
	tests := []struct {
		name   string
		path   string
		body   string
		status int
		hit    bool // reached the backend
	}{
		{"over the 4-byte estimate", "/v1/chat/completions", chat("shared", false, longTokens), 200, true},
		{"over the estimate, completion", "/v1/completions", `{"model":"shared","prompt":"` + longTokens + `"}`, 200, true},
		{"over even the lower bound", "/v1/chat/completions", chat("shared", false, words("x", 1025*request.MaxBytesPerToken)), 400, false},
		// Token ids are counted exactly: 1,024 fit, 1,025 do not.
		{"token ids at the context", "/v1/completions", tokenIDs(1023), 200, true},
		{"token ids over the context", "/v1/completions", tokenIDs(1025), 400, false},
		// max_tokens counts, as in vLLM, and near 2^63 it cannot wrap.
		{"max_tokens over the context", "/v1/chat/completions", `{"model":"shared","messages":[{"role":"user","content":"hi"}],"max_tokens":2000}`, 400, false},
		{"max_tokens 2^63-1", "/v1/chat/completions", `{"model":"shared","messages":[{"role":"user","content":"hi"}],"max_tokens":9223372036854775807}`, 400, false},
		{"max_tokens within", "/v1/chat/completions", `{"model":"shared","messages":[{"role":"user","content":"hi"}],"max_tokens":1000}`, 200, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := r.backends[0].hits.Load()
			res := r.post(tt.path, tt.body)
			if res.status != tt.status {
				t.Fatalf("status %d, want %d: %.300s", res.status, tt.status, res.body)
			}
			if hit := r.backends[0].hits.Load() != before; hit != tt.hit {
				t.Errorf("reached the backend: %v, want %v", hit, tt.hit)
			}
			if tt.status == 400 && !strings.Contains(string(res.body), "maximum context length is 1024 tokens") {
				t.Errorf("context error %s lacks vLLM's wording", res.body)
			}
		})
	}
}

// TestContextCheckEngineDecides: text of fewer bytes a token than the
// router's estimate (CJK, 3 bytes a character) against an emulated engine
// with a 1,024-token context. Whatever the router's bound does not rule
// out is the engine's to answer: a prompt within the context is served,
// one over it gets the engine's own 400, passed through, and the backend
// is not counted as failing.
func TestContextCheckEngineDecides(t *testing.T) {
	p, err := engine.LookupPreset("a100-llama3-8b")
	if err != nil {
		t.Fatal(err)
	}
	em, err := emulator.New(emulator.Config{Preset: p, KVBlocks: 1024 / engine.BlockSize, TimeScale: 50, Model: "shared"})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(em.Handler())
	t.Cleanup(func() { srv.Close(); _ = em.Close() })
	r := newRig(t, "round-robin", 0, func(c *config.Config) {
		c.Backends = []config.Backend{{URL: srv.URL, Name: "e0"}}
	})
	cjk := func(chars int) string { return strings.Repeat("漢字仮名交じり文", chars/8) }
	for i := 0; i < 5; i++ { // more than health.eject_after
		res := r.post("/v1/chat/completions", chat("shared", false, cjk(1600))) // 4,800 bytes: 1,200 emulated tokens
		if res.status != http.StatusBadRequest || !strings.Contains(string(res.body), "maximum context length is 1024 tokens") ||
			res.header.Get(headerBackend) != "e0" {
			t.Fatalf("over the engine's context: status %d backend %q %s, want the engine's 400", res.status, res.header.Get(headerBackend), res.body)
		}
	}
	if res := r.post("/v1/chat/completions", chat("shared", false, cjk(800))); res.status != http.StatusOK {
		t.Errorf("within the engine's context: status %d %s", res.status, res.body)
	}
	if b := r.srv.set.All()[0].Breaker(); b.Fails != 0 || b.Open {
		t.Errorf("the engine's 400s counted against it: %+v", b)
	}
}
