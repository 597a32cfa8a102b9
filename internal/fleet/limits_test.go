package fleet

import (
	"math"
	"testing"
	"time"
)

func TestLearnedCap(t *testing.T) {
	type reading struct {
		running, waiting, times int
		kv                      float64
	}
	tests := []struct {
		name     string
		readings []reading
		want     int
	}{
		{"nothing seen", nil, 0},
		{"a cap that binds", []reading{{3, 0, 1, 0}, {8, 2, CapConfirmations, 0}}, 8},
		{"one confirmation short", []reading{{8, 2, CapConfirmations - 1, 0}}, 0},
		{"running without a queue proves nothing", []reading{{8, 0, 100, 0}}, 0},
		{"a higher reading raises the bound and starts afresh",
			[]reading{{8, 2, CapConfirmations, 0}, {9, 0, 1, 0}, {9, 1, CapConfirmations - 1, 0}}, 0},
		{"a higher bound confirmed", []reading{{8, 2, CapConfirmations, 0}, {12, 1, CapConfirmations, 0}}, 12},
		{"queues below the bound do not count",
			// A long prefill that fills the step's budget queues requests
			// below the cap: the count varies and never settles on the max.
			[]reading{{10, 0, 1, 0}, {4, 3, 50, 0}, {7, 1, 50, 0}, {10, 1, CapConfirmations - 1, 0}}, 0},
		{"a lower reading does not lower a confirmed cap", []reading{{8, 2, CapConfirmations, 0}, {2, 5, 10, 0}}, 8},
		{"KV usage unreported counts", []reading{{8, 2, CapConfirmations, -1}}, 8},
		{"a queue for KV blocks is not a cap", []reading{{8, 2, CapConfirmations, 0.9}}, 0},
		{"up to CapKVUsage counts", []reading{{8, 2, CapConfirmations, CapKVUsage}}, 8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := New().Add("b", nil, nil)
			for _, r := range tt.readings {
				for range r.times {
					b.ObserveRunning(r.running, r.waiting, r.kv)
				}
			}
			if got := b.Limits().MaxNumSeqs; got != tt.want {
				t.Fatalf("learned cap %d, want %d", got, tt.want)
			}
		})
	}
}

func TestLimitsPrecedence(t *testing.T) {
	b := New().Add("b", nil, nil)
	for range CapConfirmations {
		b.ObserveRunning(6, 1, -1)
	}
	if got := b.Limits().MaxNumSeqs; got != 6 {
		t.Fatalf("learned: %d, want 6", got)
	}
	b.SetMaxNumSeqs(8)
	if got := b.Limits().MaxNumSeqs; got != 8 {
		t.Fatalf("configured over learned: %d, want 8", got)
	}
	b.SetEngineMaxNumSeqs(4)
	if got := b.Limits().MaxNumSeqs; got != 4 {
		t.Fatalf("reported over configured: %d, want 4", got)
	}
	b.SetEngineMaxNumSeqs(0)
	b.SetMaxBatchedTokens(512)
	b.SetContextLen(-3)
	if got, want := b.Limits(), (Limits{MaxNumSeqs: 8, MaxBatchedTokens: 512, PlausibleSeqs: 8}); got != want {
		t.Fatalf("Limits() = %+v, want %+v", got, want)
	}
}

// TestColdCap: before a learned cap is confirmed, the running count an
// engine held with requests waiting is its plausible cap; a higher count
// replaces it (and starts the confirmations afresh); nothing waiting, or
// a full KV cache, suggests none.
func TestColdCap(t *testing.T) {
	b := New().Add("b", nil, nil)
	b.ObserveRunning(5, 0, 0.1)
	if got := b.Limits(); got.PlausibleSeqs != 0 || got.MaxNumSeqs != 0 {
		t.Fatalf("nothing waiting: %+v, want no cap", got)
	}
	b.ObserveRunning(5, 3, 0.9)
	if got := b.Limits(); got.PlausibleSeqs != 0 {
		t.Fatalf("waiting with a full KV cache: %+v, want no cap", got)
	}
	b.ObserveRunning(5, 3, 0.1)
	if got := b.Limits(); got.PlausibleSeqs != 5 || got.MaxNumSeqs != 0 {
		t.Fatalf("5 running, 3 waiting once: %+v, want plausible 5, none confirmed", got)
	}
	b.ObserveRunning(7, 0, 0.1)
	if got := b.Limits(); got.PlausibleSeqs != 0 {
		t.Fatalf("7 running since: %+v, want no plausible cap until 7 is seen with a queue", got)
	}
	b.ObserveRunning(7, 1, 0.1)
	b.ObserveRunning(7, 1, 0.1)
	if got := b.Limits(); got.PlausibleSeqs != 7 || got.MaxNumSeqs != 7 {
		t.Fatalf("7 confirmed: %+v, want 7", got)
	}
}

func TestEngineDecodeTime(t *testing.T) {
	b := New().Add("b", nil, nil)
	if got := b.EngineDecodeTime(); got != 0 {
		t.Fatalf("before any report: %v, want 0", got)
	}
	b.ObserveEngineDecode(0, 1) // no token: no sample
	b.ObserveEngineDecode(200, 2)
	if got := b.EngineDecodeTime(); got != 0.01 {
		t.Fatalf("first sample: %v, want 0.01", got)
	}
	b.ObserveEngineDecode(100, 3) // 30 ms: the average moves a fifth of the way
	if got, want := b.EngineDecodeTime(), 0.01+RateAlpha*0.02; math.Abs(got-want) > 1e-12 {
		t.Fatalf("second sample: %v, want %v", got, want)
	}
	c := New().Add("c", nil, nil)
	c.ObserveEngineDecode(1, 1e6)
	if got := c.EngineDecodeTime(); got != MaxDecodeTime {
		t.Fatalf("stalled engine: %v, want the clamp %v", got, MaxDecodeTime)
	}
}

// TestIdleEngineDecaysToFleet: an engine no traffic refreshes returns to
// the fleet's coefficients (those its busy peers show), not to the
// generic prior: its peers run at 20,000 tokens a second, it was taught
// 1,000, and 30 s after its last sample it is costed within 10% of the
// peers' rate.
func TestIdleEngineDecaysToFleet(t *testing.T) {
	f := New()
	bs := []*Backend{f.Add("a", nil, nil), f.Add("b", nil, nil), f.Add("c", nil, nil)}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	teach := func(b *Backend, rate float64, at time.Time) {
		tk := b.Start(4000, 4000, 16, at)
		tk.FirstByte(at.Add(time.Duration(4000 / rate * float64(time.Second))))
		tk.Done(at)
	}
	now := t0
	for i := range 200 {
		teach(bs[0], 1000, now)
		teach(bs[1+i%2], 20000, now)
		now = now.Add(100 * time.Millisecond)
	}
	for range 300 { // 30 s more of traffic to the peers only
		teach(bs[1], 20000, now)
		teach(bs[2], 20000, now)
		now = now.Add(100 * time.Millisecond)
	}
	chunk := bs[0].Chunk()
	peer := bs[1].Cost().Coeffs(now).ChunkRate(chunk)
	idle := bs[0].Cost().Coeffs(now).ChunkRate(chunk)
	if idle < 0.9*peer || idle > 1.1*peer {
		t.Fatalf("idle engine costed at %.0f tokens/s, its peers at %.0f: want it back at theirs", idle, peer)
	}
}
