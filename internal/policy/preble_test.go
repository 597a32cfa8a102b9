package policy

import (
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
)

func TestPrebleExploitOrExplore(t *testing.T) {
	prompt := strings.Repeat("p", 6400) // 1,600 tokens, 100 blocks
	tests := []struct {
		name     string
		matched  []int32
		inflight []int // requests awaiting their first token
		decoding []int64
		want     int
		note     string
	}{
		{
			// 60 blocks = 960 cached > 640 uncached: exploit among the two
			// holders; the idle non-holder b2 is not considered.
			name: "exploit: least loaded holder", matched: []int32{60, 60, 0},
			inflight: []int{3, 1, 0}, decoding: []int64{0, 0, 0}, want: 1, note: "exploit",
		},
		{
			// 40 blocks = 640 cached < 960 uncached: explore; with equal loads
			// the prefill cost P favours the partial holder.
			name: "explore: prefill cost favours a partial hit", matched: []int32{40, 0},
			inflight: []int{0, 0}, decoding: []int64{0, 0}, want: 0, note: "explore",
		},
		{
			// Same, but b0 is decoding 1,000 tokens of budget: L = 20 s there.
			name: "explore: load cost outweighs a partial hit", matched: []int32{40, 0},
			inflight: []int{0, 0}, decoding: []int64{1000, 0}, want: 1, note: "explore",
		},
		{
			// Exactly half cached is not longer than the rest: explore, where
			// the idle server with nothing cached wins over a loaded holder.
			name: "half is not more than half", matched: []int32{50, 0},
			inflight: []int{20, 0}, decoding: []int64{0, 0}, want: 1, note: "explore",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bs := peerFleet(t, len(tc.matched))
			for i := range bs {
				peerLoad(t, bs[i], tc.inflight[i], 10, 0, false)
				if tc.decoding[i] > 0 {
					peerLoad(t, bs[i], 1, 10, tc.decoding[i], true)
				}
			}
			d := NewPreble().Pick(peerInput(t, prompt, bs, tc.matched))
			if d.Index != tc.want || d.Note != tc.note {
				t.Fatalf("pick %d (%s), want %d (%s)", d.Index, d.Note, tc.want, tc.note)
			}
		})
	}
}

func TestPrebleWindowLoad(t *testing.T) {
	bs := peerFleet(t, 2)
	p := NewPreble()
	prompt := strings.Repeat("w", 40000) // 10,000 tokens: 1 s at the 10k/s prior
	in := peerInput(t, prompt, bs[:1], nil)
	peerRoute(p, in)
	if got := p.WindowPrefill(bs[0], peerT0.Add(time.Minute)); got != float64(10000)/fleet.DefaultPrefillRate {
		t.Fatalf("window prefill = %v s, want 1 s", got)
	}
	// While the window holds it, a fresh request explores away from b0.
	fresh := peerInput(t, strings.Repeat("f", 400), bs, nil)
	fresh.Now = peerT0.Add(2 * time.Minute)
	if d := p.Pick(fresh); d.Index != 1 {
		t.Fatalf("pick inside the window = %d, want 1", d.Index)
	}
	// After 3 minutes it has left the window: the load is gone, a tie
	// goes to the first candidate.
	fresh.Now = peerT0.Add(3*time.Minute + time.Second)
	if got := p.WindowPrefill(bs[0], fresh.Now); got != 0 {
		t.Fatalf("window prefill after 3 min = %v, want 0", got)
	}
	if d := p.Pick(fresh); d.Index != 0 {
		t.Fatalf("pick after the window = %d, want 0", d.Index)
	}
}

func TestPrebleEvictionCost(t *testing.T) {
	// Both servers have routed a fully reused prompt (hit ratio 1 on b0,
	// 0 on b1) with the same windowed prefill; b0's cache is full, so the
	// new request's tokens would evict reused ones there.
	bs := peerFleet(t, 2)
	p := NewPreble()
	shared := strings.Repeat("s", 4000)
	seed := peerInput(t, shared, bs[:1], []int32{int32(len(shared) / 64)})
	peerRoute(p, seed) // b0: hit 1,000 of 1,000, prefill 0 s
	seed1 := peerInput(t, strings.Repeat("t", 4000), bs[1:], nil)
	p.Routed(seed1, Decision{Index: 0}) // b1: hit 0 of 1,000, prefill 0.1 s
	in := peerInput(t, strings.Repeat("n", 8000), bs, nil)
	in.Now = peerT0.Add(time.Second)
	// Without engine state both are assumed full: b0 costs M = 2,000/10k x 1
	// = 0.2 s + P 0.2 s; b1 costs 0.1 s load + 0.2 s P.
	if d := p.Pick(in); d.Index != 1 {
		t.Fatalf("pick = %d, want 1 (eviction of reused tokens on b0)", d.Index)
	}
	// With room for the request on b0, nothing is evicted: b0 costs 0.2 s.
	bs[0].SetEngine(&fleet.EngineState{At: peerT0, KVUsage: 0.5, KVBlocks: 1000, BlockSize: 16})
	if d := p.Pick(in); d.Index != 0 {
		t.Fatalf("pick with free KV on b0 = %d, want 0", d.Index)
	}
}

func BenchmarkPreblePick(b *testing.B) {
	p := NewPreble()
	in := peerBenchInput(b, p)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		p.Pick(in)
	}
}

func BenchmarkPreblePickExplore(b *testing.B) {
	p := NewPreble()
	in := peerBenchInput(b, p)
	clear(in.Matched) // nothing cached: every candidate is costed
	fxTokens(in)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		p.Pick(in)
	}
}
