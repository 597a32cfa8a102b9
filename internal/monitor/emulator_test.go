package monitor

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/engine"
)

// TestEmulatorPrefillRate: scraping an emulated engine that served
// requests teaches its backend the engine-reported prefill rate (vLLM's
// request_prefill_time_seconds against request_prefill_kv_computed_tokens),
// the figure kvroute falls back on when its own TTFT samples went bad.
func TestEmulatorPrefillRate(t *testing.T) {
	p, err := engine.LookupPreset("h100-llama3-8b")
	if err != nil {
		t.Fatal(err)
	}
	const scale = 50
	em, err := emulator.New(emulator.Config{Preset: p, TimeScale: scale})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(em.Handler())
	t.Cleanup(func() {
		hs.CloseClientConnections()
		em.Close()
		hs.Close()
	})
	f, _, _ := start(t, fastConfig(), hs.URL)
	b := f.Snapshot().All[0]
	waitFor(t, "engine state", func() bool { return b.Engine() != nil })
	if r := b.EnginePrefillRate(); r != 0 {
		t.Fatalf("engine prefill rate %v before any request", r)
	}
	for i := range 3 {
		body, _ := json.Marshal(map[string]any{"model": em.Model(), "prompt": strings.Repeat("monitor round trip ", 150+40*i),
			"max_tokens": 2, "ignore_eos": true})
		resp, err := http.Post(hs.URL+"/v1/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	waitFor(t, "an engine-reported prefill rate", func() bool { return b.EnginePrefillRate() > 0 })
	if r, most := b.EnginePrefillRate(), p.PrefillTokensPerSec()*scale; r > most {
		t.Errorf("engine-reported rate %.0f tokens/s, faster than the preset at this time scale (%.0f)", r, most)
	}
}
