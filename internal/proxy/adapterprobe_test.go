package proxy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/config"
)

// rssMB is the process's resident set, in MB (Linux).
func rssMB() float64 {
	b, _ := os.ReadFile("/proc/self/status")
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			return float64(kb) / 1024
		}
	}
	return 0
}

// TestAdapterProbe measures /metrics with one engine listing
// KVROUTE_ADAPTER_PROBE adapters (docs/reliability.md): the page's lines
// and bytes, the slowest of three scrapes and the RSS. Skipped unless set.
func TestAdapterProbe(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("KVROUTE_ADAPTER_PROBE"))
	if n <= 0 {
		t.Skip("set KVROUTE_ADAPTER_PROBE to the number of adapters")
	}
	before := rssMB()
	data := []map[string]any{{"id": "base", "object": "model"}}
	for i := range n {
		data = append(data, map[string]any{"id": fmt.Sprintf("lora-%05d", i), "object": "model", "parent": "base"})
	}
	body, _ := json.Marshal(map[string]any{"object": "list", "data": data})
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
	var lines, size int
	var slowest time.Duration
	for range 3 {
		start := time.Now()
		page := r.get("/metrics").body
		slowest = max(slowest, time.Since(start))
		lines, size = strings.Count(string(page), "\n"), len(page)
	}
	t.Logf("adapters %d: /metrics %d lines, %.1f MB, slowest of 3 scrapes %v, RSS %.0f -> %.0f MB",
		n, lines, float64(size)/1e6, slowest.Round(time.Millisecond), before, rssMB())
}
