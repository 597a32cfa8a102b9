package sim

import (
	"testing"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/workload"
)

// The simulator serves adapters as the engine model does and the router
// sees their state: kvroute, which routes by adapter, loads adapters less
// often than the adapter-blind kvroute on the same requests, and both
// serve every request.
func TestSimLoRA(t *testing.T) {
	p, err := engine.LookupPreset("h100-llama3-8b")
	if err != nil {
		t.Fatal(err)
	}
	if p, err = p.WithLoRA(2, 0); err != nil {
		t.Fatal(err)
	}
	reqs, _, err := LoadAt("chat", workload.Options{Seed: 1, Limit: 800, Adapters: 16}, 0.5, 4*p.PrefillTokensPerSec())
	if err != nil {
		t.Fatal(err)
	}
	loads := map[string]float64{}
	for _, pol := range []string{"kvroute", "kvroute-lora-blind"} {
		run, err := Run(reqs, Config{Engines: []engine.Preset{p, p, p, p}, Policy: pol, Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		if run.Errors != 0 || run.Completed != len(reqs) {
			t.Fatalf("%s: %d done, %d errors of %d", pol, run.Completed, run.Errors, len(reqs))
		}
		if run.AdapterLoads <= 0 {
			t.Fatalf("%s: no adapter loads reported", pol)
		}
		loads[pol] = run.AdapterLoads
	}
	if loads["kvroute"] >= loads["kvroute-lora-blind"] {
		t.Errorf("adapter loads per 1k: kvroute %.1f, adapter-blind %.1f", loads["kvroute"], loads["kvroute-lora-blind"])
	}
	// Without --max-loras the engines refuse adapters, and say so.
	plain, _ := engine.LookupPreset("h100-llama3-8b")
	run, err := Run(reqs[:10], Config{Engines: []engine.Preset{plain}, Policy: "kvroute"})
	if err != nil || run.Errors != 10 {
		t.Errorf("adapters on engines without LoRA: %d errors of 10 (%v)", run.Errors, err)
	}
}
