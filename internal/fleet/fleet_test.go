package fleet

import (
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

var t0 = time.Unix(1000, 0)

func newBackend(t testing.TB) (*Fleet, *Backend) {
	t.Helper()
	f := New()
	return f, f.Add("b0", nil, nil)
}

func assertZero(t testing.TB, b *Backend) {
	t.Helper()
	if l := b.Load(); l != (Load{}) {
		t.Errorf("backend %d load after all requests ended: %+v, want all zero", b.ID, l)
	}
}

func TestTicketAccounting(t *testing.T) {
	type step struct {
		op   string // "first" or "done"
		want Load
	}
	started := Load{InFlight: 1, PendingPrefill: 30}
	decoding := Load{InFlight: 1, Decoding: 1, DecodeBudget: 50, DecodeTokens: 100}
	tests := []struct {
		name  string
		steps []step
	}{
		{"done before first byte", []step{{"done", Load{}}}},
		{"first byte then done", []step{{"first", decoding}, {"done", Load{}}}},
		{"double first byte", []step{{"first", decoding}, {"first", decoding}, {"done", Load{}}}},
		{"double done", []step{{"first", decoding}, {"done", Load{}}, {"done", Load{}}}},
		{"first byte after done", []step{{"done", Load{}}, {"first", Load{}}, {"done", Load{}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, b := newBackend(t)
			tk := b.Start(100, 30, 50, t0)
			if got := b.Load(); got != started {
				t.Fatalf("after Start: %+v, want %+v", got, started)
			}
			for i, s := range tt.steps {
				if s.op == "first" {
					tk.FirstByte(t0.Add(time.Second))
				} else {
					tk.Done(t0.Add(2 * time.Second))
				}
				if got := b.Load(); got != s.want {
					t.Fatalf("after step %d (%s): %+v, want %+v", i, s.op, got, s.want)
				}
			}
		})
	}
}

// rounds runs round n times, 100 ms apart from t0 (the cost model's
// evidence then outweighs its prior), and returns the instant after the
// last.
func rounds(n int, round func(at time.Time)) time.Time {
	at := t0
	for range n {
		round(at)
		at = at.Add(100 * time.Millisecond)
	}
	return at
}

// near reports whether got is within 5% of want.
func near(got, want float64) bool { return math.Abs(got-want) <= 0.05*want }

// TestPrefillRate: a backend's prefill rate is its cost model's (the one
// estimate of its prefill speed): the prior's until a TTFT teaches it,
// then what the TTFTs show; a tiny prefill or a zero TTFT teaches nothing.
func TestPrefillRate(t *testing.T) {
	type req struct {
		uncached int64
		ttft     time.Duration
	}
	tests := []struct {
		name    string
		reqs    []req
		want    float64
		samples bool
	}{
		{"prior until observed", nil, DefaultPrefillRate, false},
		{"an engine at 4,000 tokens/s", []req{{4000, time.Second}, {2000, 500 * time.Millisecond}}, 4000, true},
		{"an engine at 40,000 tokens/s", []req{{4000, 100 * time.Millisecond}, {8000, 200 * time.Millisecond}}, 40000, true},
		{"tiny work teaches nothing", []req{{MinRateWork - 1, time.Second}}, DefaultPrefillRate, false},
		{"zero ttft teaches nothing", []req{{4000, 0}}, DefaultPrefillRate, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, b := newBackend(t)
			end := rounds(100, func(at time.Time) {
				for _, r := range tt.reqs {
					tk := b.Start(r.uncached, r.uncached, 1, at)
					tk.FirstByte(at.Add(r.ttft))
					tk.Done(at.Add(r.ttft))
				}
			})
			if got := b.PrefillRate(end); !near(got, tt.want) {
				t.Errorf("PrefillRate = %v, want %v", got, tt.want)
			}
			if got := b.CostSamples() > 0; got != tt.samples {
				t.Errorf("CostSamples = %d, want samples: %v", b.CostSamples(), tt.samples)
			}
		})
	}
}

// TestPrefillRateCountsQueuedWork checks that a request's sample includes
// the prefill queued ahead of it: a backend that serves 2000 queued tokens
// plus 2000 of ours in one second prefills 4000 tokens/s, not 2000.
func TestPrefillRateCountsQueuedWork(t *testing.T) {
	_, b := newBackend(t)
	end := rounds(100, func(at time.Time) {
		ahead := b.Start(2000, 2000, 1, at)
		tk := b.Start(2000, 2000, 1, at)
		// ahead is prefilled first (2000 tokens in 0.5 s), then tk: 4000
		// tokens finished in the second tk waited.
		ahead.FirstByte(at.Add(500 * time.Millisecond))
		tk.FirstByte(at.Add(time.Second))
		ahead.Done(at)
		tk.Done(at)
	})
	if got := b.PrefillRate(end); !near(got, 4000) {
		t.Errorf("PrefillRate = %v, want 4000", got)
	}
	assertZero(t, b)
}

// A request the engine serves before one routed ahead of it is credited
// only with what was finished while it waited, not with the queue it
// overtook.
func TestPrefillRateOutOfOrder(t *testing.T) {
	_, b := newBackend(t)
	end := rounds(100, func(at time.Time) {
		ahead := b.Start(8000, 8000, 1, at)
		tk := b.Start(2000, 2000, 1, at)
		tk.FirstByte(at.Add(time.Second))        // overtook ahead: 2000 tokens in 1 s
		ahead.FirstByte(at.Add(5 * time.Second)) // 10000 tokens finished in 5 s
		ahead.Done(at)
		tk.Done(at)
	})
	if got := b.PrefillRate(end); !near(got, 2000) {
		t.Errorf("PrefillRate = %v, want 2000 (crediting the queue would say 10000)", got)
	}
	assertZero(t, b)
}

func TestNoRateSample(t *testing.T) {
	_, b := newBackend(t)
	tk := b.Start(4000, 4000, 1, t0)
	tk.NoRateSample()
	tk.FirstByte(t0.Add(10 * time.Second))
	if got := b.PrefillRate(t0.Add(10 * time.Second)); got != DefaultPrefillRate || b.CostSamples() != 0 {
		t.Errorf("PrefillRate = %v (%d samples) after an excluded sample, want the prior %v", got, b.CostSamples(), DefaultPrefillRate)
	}
	if l := b.Load(); l.Decoding != 1 || l.PendingPrefill != 0 {
		t.Errorf("excluded sample changed the accounting: %+v", l)
	}
	tk.Done(t0)
	assertZero(t, b)
}

func TestServes(t *testing.T) {
	f := New()
	anyModel := f.Add("any", nil, nil)
	some := f.Add("some", nil, []string{"a", "b"})
	tests := []struct {
		b     *Backend
		model string
		want  bool
	}{
		{anyModel, "x", true}, {anyModel, "", true}, {some, "a", true}, {some, "b", true}, {some, "c", false}, {some, "", true},
	}
	for _, tt := range tests {
		if got := tt.b.Serves(tt.model); got != tt.want {
			t.Errorf("%s.Serves(%q) = %v, want %v", tt.b.Name, tt.model, got, tt.want)
		}
	}
}

func TestSnapshots(t *testing.T) {
	f := New()
	if s := f.Snapshot(); len(s.All) != 0 || len(s.Healthy) != 0 {
		t.Fatalf("empty fleet snapshot %+v", s)
	}
	var bs []*Backend
	for i := range 4 {
		b := f.Add("b", nil, nil)
		if b.ID != i {
			t.Fatalf("ID %d, want %d", b.ID, i)
		}
		bs = append(bs, b)
	}
	before := f.Snapshot()
	f.SetHealthy(bs[1], false)
	f.SetHealthy(bs[3], false)
	s := f.Snapshot()
	if len(s.All) != 4 || len(s.Healthy) != 2 || s.Healthy[0] != bs[0] || s.Healthy[1] != bs[2] {
		t.Errorf("after ejecting 1 and 3: %d all, healthy %v", len(s.All), ids(s.Healthy))
	}
	if len(before.Healthy) != 4 {
		t.Errorf("an earlier snapshot changed: healthy %v", ids(before.Healthy))
	}
	f.SetHealthy(bs[1], false)
	if f.Snapshot() != s {
		t.Errorf("a no-op health change published a new snapshot")
	}
	f.SetHealthy(bs[1], true)
	if got := ids(f.Snapshot().Healthy); len(got) != 3 || got[1] != 1 {
		t.Errorf("after recovering 1: healthy %v, want [0 1 2]", got)
	}
}

func ids(bs []*Backend) []int {
	var out []int
	for _, b := range bs {
		out = append(out, b.ID)
	}
	return out
}

// TestStorm runs many goroutines starting tickets on random backends and
// ending them every way a request can end, racing FirstByte and Done, and
// then checks that every counter of every backend is back to exactly zero.
func TestStorm(t *testing.T) {
	f := New()
	for range 4 {
		f.Add("b", nil, nil)
	}
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 42))
			for range 500 {
				s := f.Snapshot()
				if rng.IntN(50) == 0 {
					f.SetHealthy(s.All[rng.IntN(len(s.All))], rng.IntN(2) == 0)
				}
				b := s.All[rng.IntN(len(s.All))]
				prompt := int64(rng.IntN(5000))
				tk := b.Start(prompt, prompt-int64(rng.IntN(int(prompt)+1)), int64(rng.IntN(1000)), t0)
				now := t0.Add(time.Duration(rng.IntN(1e9)))
				switch rng.IntN(6) {
				case 0: // failed before the first byte
					tk.Done(now)
				case 1: // normal
					tk.FirstByte(now)
					tk.Done(now)
				case 2: // double Done
					tk.FirstByte(now)
					tk.Done(now)
					tk.Done(now)
				case 3: // FirstByte after Done
					tk.Done(now)
					tk.FirstByte(now)
				case 4: // FirstByte and Done race
					var w sync.WaitGroup
					w.Go(func() { tk.FirstByte(now) })
					w.Go(func() { tk.Done(now) })
					w.Go(func() { tk.Done(now) })
					w.Wait()
				case 5: // still in flight while others route, ended later
					_ = b.Load()
					defer tk.Done(now)
				}
			}
		})
	}
	wg.Wait()
	for _, b := range f.Snapshot().All {
		assertZero(t, b)
		if r := b.PrefillRate(t0); !(r > 0) || math.IsInf(r, 0) {
			t.Errorf("backend %d learned rate %v", b.ID, r)
		}
	}
}

func BenchmarkTicket(b *testing.B) {
	_, be := newBackend(b)
	b.ReportAllocs()
	for b.Loop() {
		tk := be.Start(1000, 500, 100, t0)
		tk.FirstByte(t0.Add(time.Millisecond))
		tk.Done(t0.Add(time.Second))
	}
}

func TestRouted(t *testing.T) {
	_, b := newBackend(t)
	if p, c := b.Routed(); p != 0 || c != 0 {
		t.Fatalf("new backend Routed() = %d, %d; want 0, 0", p, c)
	}
	b.Start(100, 30, 50, t0).Done(t0)
	tk := b.Start(40, 40, 10, t0)
	p, c := b.Routed()
	if p != 140 || c != 70 {
		t.Errorf("Routed() = %d, %d; want 140, 70", p, c)
	}
	tk.Done(t0)
	if p2, c2 := b.Routed(); p2 != p || c2 != c {
		t.Errorf("Done changed Routed() to %d, %d; it counts routing, not load", p2, c2)
	}
}

func TestFreeKVTokens(t *testing.T) {
	tests := []struct {
		name string
		e    *EngineState
		want float64
		ok   bool
	}{
		{"no report", nil, 0, false},
		{"half used", &EngineState{KVUsage: 0.5, KVBlocks: 100, BlockSize: 16}, 800, true},
		{"no capacity", &EngineState{KVUsage: 0.5}, 0, false},
		// llama.cpp: no usage reported; 0 would read as an empty cache.
		{"usage not reported", &EngineState{KVBlocks: 100, BlockSize: 16, Missing: EngineKVUsage}, 0, false},
	}
	for _, tt := range tests {
		if got, ok := tt.e.FreeKVTokens(); got != tt.want || ok != tt.ok {
			t.Errorf("%s: FreeKVTokens = %v, %v; want %v, %v", tt.name, got, ok, tt.want, tt.ok)
		}
	}
}
