package sim

import (
	"math"
	"testing"

	"github.com/kvroute/kvroute/internal/costmodel"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/workload"
)

// TestLoadTimeLearned: the simulated router learns its engines' CPU tier
// load time per token from their offload counters, as the live one learns
// it from vLLM's, and so prices a load at the engine's figure rather than
// at the default its generic prior gives.
func TestLoadTimeLearned(t *testing.T) {
	p, err := engine.LookupPreset("h100-llama3-8b")
	if err != nil {
		t.Fatal(err)
	}
	if p, err = p.WithCPUTier(6000); err != nil {
		t.Fatal(err)
	}
	engines := []engine.Preset{p, p}
	reqs, _, err := LoadAt("chat-docs", workload.Options{Limit: 150, Seed: 1}, 0.5, Capacity(engines))
	if err != nil {
		t.Fatal(err)
	}
	s, err := newSim(reqs, Config{Engines: engines, KVBlocks: 1500, Policy: "kvroute", Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	s.loop()
	want := p.HostLoadPerToken.Seconds()
	learned := 0
	for i := range s.nodes {
		n := &s.nodes[i]
		if n.eng.Stats().ExternalHits < 256 {
			continue // too few loads to teach
		}
		learned++
		if got := n.b.Cost().LoadPerToken(costmodel.TierHost); math.Abs(got-want) > want/100 {
			t.Errorf("engine %d: load time %g s a token, want its preset's %g (default %g)", i, got, want, costmodel.DefaultHostLoad)
		}
	}
	if learned == 0 {
		t.Fatal("no engine loaded from its CPU tier: the workload does not test the lesson")
	}
}
