package fleet

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/adapter"
)

// TestAdapterWaitsTeachNoCap: requests waiting for a LoRA adapter slot are
// no evidence of the running-sequence cap; requests waiting while their
// adapters run, or on an engine whose adapter slots are not full, still
// are.
func TestAdapterWaitsTeachNoCap(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	// Two requests running under two adapters, the KV cache a tenth full,
	// requests waiting under lora.
	reading := func(lora *adapter.LoRA) Reading {
		return Reading{State: &EngineState{At: at, Running: 2, Waiting: 3, KVUsage: 0.1, LoRA: lora}}
	}
	for _, tc := range []struct {
		name    string
		lora    *adapter.LoRA
		wantCap int
		wantSrc string
	}{
		{"a third adapter waits for a slot", adapter.NamedLoRA([]string{"a", "b"}, []string{"c"}, 2), 0, ""},
		{"waiting adapters, some blocked", adapter.NamedLoRA([]string{"a", "b"}, []string{"a", "c"}, 2), 0, ""},
		{"a free adapter slot: the wait is the engine's cap", adapter.NamedLoRA([]string{"a", "b"}, []string{"c"}, 4), 2, CapLearned},
		{"the waiting adapter runs already", adapter.NamedLoRA([]string{"a", "b"}, []string{"a"}, 2), 2, CapLearned},
		{"no adapters waiting", adapter.NamedLoRA([]string{"a", "b"}, nil, 2), 2, CapLearned},
		{"no LoRA report", nil, 2, CapLearned},
		{"unnamed adapters (SGLang's counts)", &adapter.LoRA{Max: 2, Used: 2}, 2, CapLearned},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := New().Add("x", nil, nil)
			for range CapConfirmations + 2 {
				b.Learn(reading(tc.lora))
			}
			if c := b.Limits().MaxNumSeqs; c != tc.wantCap {
				t.Errorf("cap %d, want %d", c, tc.wantCap)
			}
			if _, src := b.SeqCap(); src != tc.wantSrc {
				t.Errorf("cap source %q, want %q", src, tc.wantSrc)
			}
		})
	}
}

// TestSeqCapSource: the cap /admin/backends shows and where it came from.
func TestSeqCapSource(t *testing.T) {
	b := New().Add("x", nil, nil)
	if c, src := b.SeqCap(); c != 1 || src != CapPlausible {
		t.Errorf("fresh backend: %d %q, want the cold-start cap 1 (plausible)", c, src)
	}
	b.ObserveRunning(0, 0, -1)
	if c, src := b.SeqCap(); c != 0 || src != "" {
		t.Errorf("observed idle: %d %q, want none", c, src)
	}
	for range CapConfirmations {
		b.ObserveRunning(6, 1, 0.1)
	}
	if c, src := b.SeqCap(); c != 6 || src != CapLearned {
		t.Errorf("after confirmations: %d %q, want 6 learned", c, src)
	}
	b.SetMaxNumSeqs(16)
	if c, src := b.SeqCap(); c != 16 || src != CapFromConfig {
		t.Errorf("configured: %d %q, want 16 config", c, src)
	}
	b.SetEngineMaxNumSeqs(4)
	if c, src := b.SeqCap(); c != 4 || src != CapFromEngine {
		t.Errorf("reported: %d %q, want 4 engine", c, src)
	}
}
