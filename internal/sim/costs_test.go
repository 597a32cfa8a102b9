package sim

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/workload"
)

// burst is a trace of requests that all arrive at t=0: first three long
// prompts (16,000 tokens, ids of 512 tokens each unshared), then sixty
// short ones (128 tokens), each with its own blocks.
func burst(t *testing.T) []workload.Request {
	t.Helper()
	var b strings.Builder
	id := 0
	line := func(tokens, out int) {
		ids := make([]string, (tokens+511)/512)
		for i := range ids {
			ids[i] = fmt.Sprint(id)
			id++
		}
		fmt.Fprintf(&b, `{"timestamp": 0, "input_length": %d, "output_length": %d, "hash_ids": [%s]}`+"\n", tokens, out, strings.Join(ids, ","))
	}
	for range 3 {
		line(16000, 64)
	}
	for range 60 {
		line(128, 200)
	}
	reqs, err := workload.ReadTrace(strings.NewReader(b.String()), "burst", workload.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return reqs
}

// TestColdBurstSpreads: a burst at t=0 onto four fresh engines that run
// at most 8 sequences each, a cap the router is not told. Priced by their
// prefill alone, the three long prompts make three engines look busy and
// all sixty short ones go to the fourth, where 52 wait for a slot. With
// the cold-start cap (fleet.Limits.PlausibleSeqs: before anything is
// observed, the smallest plausible cap, one) the burst spreads by count.
func TestColdBurstSpreads(t *testing.T) {
	p, err := engine.LookupPreset("a100-llama3-8b")
	if err != nil {
		t.Fatal(err)
	}
	p, _ = p.WithLimits(8, 2048)
	engines := []engine.Preset{p, p, p, p}
	s, err := newSim(burst(t), Config{Engines: engines, Policy: policy.Default, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	s.loop()
	most := 0
	for i := range s.nodes {
		most = max(most, s.nodes[i].routed)
	}
	// 63 requests on 4 engines: 16 a fair share.
	if most > 24 {
		t.Fatalf("one engine took %d of the 63 requests of the burst, want at most 24 (shares %v)", most, shares(s))
	}
}

func shares(s *sim) []int {
	out := make([]int, len(s.nodes))
	for i := range s.nodes {
		out[i] = s.nodes[i].routed
	}
	return out
}
