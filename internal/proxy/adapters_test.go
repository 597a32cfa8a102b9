package proxy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/config"
)

// An engine listing 2,000 LoRA adapters made 54 series of each of them
// per backend (108,336 lines), and adapter names with ESC, CR and NUL
// bytes went raw into label values. Adapters share their base model's
// series; label values are sanitised; the router still knows the
// adapters.
func TestAdapterSeriesBounded(t *testing.T) {
	const adapters = 2000
	data := []map[string]any{{"id": "base", "object": "model"}, {"id": "evil\x1b[2J\r\x00base", "object": "model"}}
	for i := range adapters {
		data = append(data, map[string]any{"id": fmt.Sprintf("lora-%04d", i), "object": "model", "parent": "base"})
	}
	data = append(data, map[string]any{"id": "lora-\x1b\r\x00", "object": "model", "parent": "base"})
	body, _ := json.Marshal(map[string]any{"object": "list", "data": data})
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/v1/models" {
			_, _ = w.Write(body)
			return
		}
		_, _ = w.Write([]byte(`{"choices":[{"text":"ok"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`))
	}))
	t.Cleanup(engine.Close)
	r := newRig(t, "round-robin", 0, func(c *config.Config) {
		c.Backends = []config.Backend{{URL: engine.URL, Name: "e0"}}
	})
	for _, model := range []string{"lora-0007", "lora-\x1b\r\x00", "base"} {
		b, _ := json.Marshal(map[string]any{"model": model, "prompt": "hi", "max_tokens": 1})
		if res := r.post("/v1/completions", string(b)); res.status != http.StatusOK {
			t.Fatalf("%q: %d %s", model, res.status, res.body)
		}
	}
	page := r.get("/metrics").body
	lines := 0
	for line := range strings.SplitSeq(string(page), "\n") {
		if strings.Contains(line, `backend="e0"`) {
			lines++
		}
	}
	// Two base models of 54 series each, and the backend's other series.
	if lines > 400 {
		t.Errorf("%d lines of backend e0 on /metrics with %d adapters listed", lines, adapters)
	}
	for _, c := range []string{"\x1b", "\r", "\x00"} {
		if strings.Contains(string(page), c) {
			t.Errorf("/metrics holds a raw %q", c)
		}
	}
	if !strings.Contains(string(page), `kvroute_requests_total{backend="e0",model="base",policy="round-robin",status="200"} 3`) {
		t.Error("the adapters' requests are not counted under their base model")
	}
	if got := r.srv.sched.Parent("lora-1999"); got != "base" {
		t.Errorf("the router takes lora-1999 for an adapter of %q, want base", got)
	}
}
