package emulator

import (
	"bytes"
	"math"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/adapter"
	"github.com/kvroute/kvroute/internal/engine"
)

// An emulated engine with a CPU tier (--cpu-kv-blocks) reports a prompt
// its GPU evicted and its CPU tier kept as cached, as vLLM reports an
// offloading connector's hits, and exports the connector's counters.
func TestCPUTierCachedTokens(t *testing.T) {
	p, err := engine.LookupPreset(testPreset)
	if err != nil {
		t.Fatal(err)
	}
	if p, err = p.WithCPUTier(4096); err != nil {
		t.Fatal(err)
	}
	s, hs := serve(t, Config{Preset: p, KVBlocks: 80, TimeScale: 50})
	doc := func(word string) string { return strings.Repeat(word+" shared document. ", 120) } // 600 tokens
	b := func(prompt string) map[string]any {
		return map[string]any{"model": s.Model(), "prompt": prompt, "max_tokens": 2, "ignore_eos": true}
	}
	completeOnce(t, hs.URL+"/v1/completions", b(doc("first")))
	completeOnce(t, hs.URL+"/v1/completions", b(doc("other"))) // 80 blocks: evicts the first
	again := completeOnce(t, hs.URL+"/v1/completions", b(doc("first")))
	u := again.Usage
	if c := u.PromptTokensDetails.CachedTokens; c < u.PromptTokens-2*engine.BlockSize || c >= u.PromptTokens {
		t.Errorf("prompt back from the CPU tier: %d cached of %d", c, u.PromptTokens)
	}
	if st := s.Stats(); st.ExternalHits == 0 || st.ExternalHits != int64(u.PromptTokensDetails.CachedTokens)-st.PrefixHits {
		t.Errorf("engine stats: external hits %d, prefix hits %d", st.ExternalHits, st.PrefixHits)
	}
	body := scrape(t, hs.URL)
	if m := string(body); !strings.Contains(m, "vllm:external_prefix_cache_hits_total{") || !strings.Contains(m, "vllm:external_prefix_cache_queries_total{") {
		t.Errorf("metrics without the connector's counters:\n%s", m)
	}
	// The router reads the loads' time per token from them: the preset's
	// 2.56 µs in emulated time (the engine's own accounting, not the wall
	// clock's).
	st, err := adapter.ParseMetrics(bytes.NewReader(body), adapter.Unknown)
	if err != nil {
		t.Fatal(err)
	}
	if st.HostLoadTokens != float64(s.Stats().ExternalHits) || st.HostLoadSeconds <= 0 {
		t.Fatalf("adapter read %g tokens loaded in %gs, engine %d", st.HostLoadTokens, st.HostLoadSeconds, s.Stats().ExternalHits)
	}
	if per, want := st.HostLoadSeconds/st.HostLoadTokens, p.HostLoadPerToken.Seconds(); math.Abs(per-want) > want*1e-6 {
		t.Errorf("load time per token %g s, want the preset's %g", per, want)
	}
}
