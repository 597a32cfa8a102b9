package compare

import (
	"testing"

	"github.com/kvroute/kvroute/internal/engine"
)

// TestBackendCPUTier: an engine started with a CPU tier is configured with
// it (backends[].cpu_kv_blocks), so that the router's approximate index
// models its offload as the simulator's does; one without has none.
func TestBackendCPUTier(t *testing.T) {
	p, err := engine.LookupPreset("h100-llama3-8b")
	if err != nil {
		t.Fatal(err)
	}
	tiered, err := p.WithCPUTier(24680)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		preset engine.Preset
		limits bool
		want   int
	}{
		{"no tier", p, false, 0},
		{"tier", tiered, false, 24680},
		{"tier and limits", tiered, true, 24680},
	} {
		t.Run(c.name, func(t *testing.T) {
			be := backendOf(Config{ConfigureLimits: c.limits}, c.preset, "http://127.0.0.1:1", "engine-0", "")
			if be.CPUKVBlocks != c.want {
				t.Errorf("cpu_kv_blocks %d, want %d", be.CPUKVBlocks, c.want)
			}
			if c.limits && (be.MaxNumSeqs != c.preset.MaxNumSeqs || be.MaxNumBatchedTokens != c.preset.MaxBatchedTokens) {
				t.Errorf("limits %d, %d; want the preset's %d, %d", be.MaxNumSeqs, be.MaxNumBatchedTokens, c.preset.MaxNumSeqs, c.preset.MaxBatchedTokens)
			}
			if be.URL != "http://127.0.0.1:1" || be.Name != "engine-0" {
				t.Errorf("entry %+v", be)
			}
		})
	}
}
