package fleet

import (
	"math"
	"testing"
	"time"
)

// TestLearn checks each lesson of an engine reading on a fresh backend.
func TestLearn(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	// queue is a reading of 4 running with 2 waiting and the KV cache a
	// tenth full: a running-sequence cap of 4 that binds.
	queue := func(missing EngineFields, kv float64) Reading {
		return Reading{State: &EngineState{At: at, Running: 4, Waiting: 2, KVUsage: kv, Missing: missing}}
	}
	for _, tc := range []struct {
		name     string
		readings []Reading
		check    func(t *testing.T, b *Backend)
	}{
		{"the report is published", []Reading{queue(0, 0.1)}, func(t *testing.T, b *Backend) {
			if e := b.Engine(); e == nil || e.Running != 4 || e.Waiting != 2 || !e.At.Equal(at) {
				t.Errorf("engine state %+v", e)
			}
		}},
		{"running and waiting teach the cap", repeat(queue(0, 0.1), CapConfirmations), func(t *testing.T, b *Backend) {
			if c := b.Limits().MaxNumSeqs; c != 4 {
				t.Errorf("cap %d after %d readings of 4 running and 2 waiting, want 4", c, CapConfirmations)
			}
		}},
		{"an unreported queue teaches no cap", repeat(queue(EngineWaiting, 0.1), CapConfirmations), func(t *testing.T, b *Backend) {
			if c := b.Limits().MaxNumSeqs; c != 0 {
				t.Errorf("cap %d learned from readings without a waiting count", c)
			}
		}},
		{"an unreported KV usage is not read as full", repeat(queue(EngineKVUsage, 0.9), CapConfirmations), func(t *testing.T, b *Backend) {
			if c := b.Limits().MaxNumSeqs; c != 4 {
				t.Errorf("cap %d, want 4: a KV usage the engine does not report is unknown, not 0.9", c)
			}
		}},
		{"a full KV cache confirms no cap", repeat(queue(0, 0.9), CapConfirmations), func(t *testing.T, b *Backend) {
			if c := b.Limits().MaxNumSeqs; c != 0 {
				t.Errorf("cap %d learned from a queue the full cache explains", c)
			}
		}},
		{"a reported cap wins and stays", []Reading{
			{State: &EngineState{At: at}, MaxNumSeqs: 8},
			{State: &EngineState{At: at}},
		}, func(t *testing.T, b *Backend) {
			if c := b.Limits().MaxNumSeqs; c != 8 {
				t.Errorf("cap %d, want the reported 8", c)
			}
		}},
		{"the counters teach the rates", []Reading{
			{State: &EngineState{At: at}, PrefillTokens: 20000, PrefillSeconds: 2, DecodeTokens: 100, DecodeSeconds: 2},
		}, func(t *testing.T, b *Backend) {
			if r := b.EnginePrefillRate(); math.Abs(r-10000) > 1e-9 {
				t.Errorf("engine prefill rate %v, want 10000", r)
			}
			if d := b.EngineDecodeTime(); math.Abs(d-0.02) > 1e-12 {
				t.Errorf("engine decode time %v, want 0.02", d)
			}
		}},
		{"a reading without lessons teaches no rate", []Reading{{State: &EngineState{At: at}}}, func(t *testing.T, b *Backend) {
			if r, d := b.EnginePrefillRate(), b.EngineDecodeTime(); r != 0 || d != 0 {
				t.Errorf("prefill rate %v, decode time %v, want none", r, d)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := New().Add("b", nil, nil)
			for _, r := range tc.readings {
				b.Learn(r)
			}
			tc.check(t, b)
		})
	}
}

func repeat(r Reading, n int) []Reading {
	out := make([]Reading, n)
	for i := range out {
		out[i] = r
	}
	return out
}
