package emulator

import (
	"strings"
	"testing"

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
	m := string(scrape(t, hs.URL))
	if !strings.Contains(m, "vllm:external_prefix_cache_hits_total{") || !strings.Contains(m, "vllm:external_prefix_cache_queries_total{") {
		t.Errorf("metrics without the connector's counters:\n%s", m)
	}
}
