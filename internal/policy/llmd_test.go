package policy

import (
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/fleet"
)

func TestLLMDScores(t *testing.T) {
	prompt := strings.Repeat("0123456789abcdef", 4*20) // 20 blocks of 64
	long := strings.Repeat("0123456789abcdef", 4*300)  // 300 blocks
	tests := []struct {
		name     string
		prompt   string
		seed     map[int]string // backend -> prompt routed there before
		inflight []int
		waiting  []int     // engine waiting queues; nil: no engine state
		usage    []float64 // engine KV usage
		want     int
	}{
		{
			// b0: 3*1 + 2*0 + 2 = 5; b1: 0 + 2*1 + 2 = 4; b2: 0 + 2*0.5 + 2 = 3.
			name: "router in-flight as queue, no KV state", prompt: prompt,
			seed: map[int]string{0: prompt}, inflight: []int{4, 0, 2}, want: 0,
		},
		{
			// b0: 3 + 0 + 2*0.6 = 4.2 beats b1: 0 + 2 + 2 = 4.
			name: "cache beats an idle server at 40% usage", prompt: prompt,
			seed: map[int]string{0: prompt}, inflight: []int{9, 9},
			waiting: []int{5, 0}, usage: []float64{0.4, 0}, want: 0,
		},
		{
			// b0: 3 + 0 + 2*0.4 = 3.8 loses to b1: 4.
			name: "not at 60% usage", prompt: prompt,
			seed: map[int]string{0: prompt}, inflight: []int{0, 9},
			waiting: []int{5, 0}, usage: []float64{0.6, 0}, want: 1,
		},
		{
			// b2 holds 10 of 20 blocks: 1.5 + 0 + 2 = 3.5 beats b0, which has
			// the shortest queue (0 + 2 + 2*0.2 = 2.4), and b1 (0 + 0 + 2).
			name: "partial prefix scores its fraction", prompt: prompt,
			seed: map[int]string{2: prompt[:640]}, inflight: []int{0, 0, 0},
			waiting: []int{0, 3, 3}, usage: []float64{0.8, 0, 0}, want: 2,
		},
		{
			// Only the first 256 of 300 blocks count: b0 = 3*256/256 + 0 + 2*0.7
			// = 4.4 beats b1 = 4; with all 300 blocks it would score 3.96.
			name: "prompts are cut at 256 blocks", prompt: long,
			seed: map[int]string{0: long[:256*64]}, inflight: []int{0, 0},
			waiting: []int{1, 0}, usage: []float64{0.3, 0}, want: 0,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bs := peerFleet(t, len(tc.inflight))
			p := NewLLMD(Options{Seed: 1})
			for id, text := range tc.seed {
				peerRoute(p, peerInput(t, text, bs[id:id+1], nil))
			}
			for i, n := range tc.inflight {
				peerLoad(t, bs[i], n, 10, 10, false)
				if tc.waiting != nil {
					bs[i].SetEngine(&fleet.EngineState{At: peerT0, Waiting: tc.waiting[i], KVUsage: tc.usage[i]})
				}
			}
			if d := p.Pick(peerInput(t, tc.prompt, bs, nil)); d.Index != tc.want {
				t.Fatalf("pick = %d, want %d", d.Index, tc.want)
			}
		})
	}
}

func TestLLMDTiesAreRandomAndSeeded(t *testing.T) {
	bs := peerFleet(t, 4)
	in := peerInput(t, "short prompt", bs, nil)
	picks := func(seed int64) []int {
		p := NewLLMD(Options{Seed: seed})
		var out []int
		for range 200 {
			out = append(out, p.Pick(in).Index)
		}
		return out
	}
	a, b := picks(7), picks(7)
	seen := map[int]int{}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("same seed gave different picks at %d", i)
		}
		seen[a[i]]++
	}
	if len(seen) != 4 {
		t.Fatalf("ties reached %d of 4 servers: %v", len(seen), seen)
	}
	for id, n := range seen {
		if n < 20 {
			t.Errorf("server %d won %d of 200 ties, want about 50", id, n)
		}
	}
}

func BenchmarkLLMDPick(b *testing.B) {
	p := NewLLMD(Options{Seed: 1})
	in := peerBenchInput(b, p)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		p.Pick(in)
	}
}

func BenchmarkLLMDRouted(b *testing.B) {
	p := NewLLMD(Options{Seed: 1})
	in := peerBenchInput(b, p)
	d := Decision{Index: 7}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		p.Routed(in, d)
	}
}
