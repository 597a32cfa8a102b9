package policy

import (
	"strings"
	"testing"
)

func TestDynamoCost(t *testing.T) {
	prompt := strings.Repeat("x", 6400) // 1,600 tokens, 100 blocks of 64 chars
	type load struct {
		pending  int64 // uncached tokens of one request awaiting its first token
		decoding int64 // prompt tokens of one decoding request
	}
	tests := []struct {
		name    string
		loads   []load
		matched []int32
		costs   []float64
		want    int
	}{
		{
			// b0: (320 + 1600-800)/16 + ((640+320)/16 + 100) = 70 + 160 = 230.
			// b1: 1600/16 + 100 = 200.
			name:    "an idle server beats a loaded holder of half the prompt",
			loads:   []load{{320, 640}, {0, 0}},
			matched: []int32{50, 0},
			costs:   []float64{230, 200},
			want:    1,
		},
		{
			// b0 holds 90 blocks = 1,440 tokens:
			// (0 + 160)/16 + (640/16 + 100) = 10 + 140 = 150.
			// b1: 100 + 100 = 200.
			name:    "a holder with only decode load wins",
			loads:   []load{{0, 640}, {0, 0}},
			matched: []int32{90, 0},
			costs:   []float64{150, 200},
			want:    0,
		},
		{
			// Prefill blocks and decode blocks weigh the same at weight 1:
			// b0 queued prefill 1600 tokens: (1600+1600)/16 + (1600/16+100) = 400;
			// b1 decoding 3200 tokens: 1600/16 + (3200/16+100) = 400; b2 idle 200.
			name:    "queued prefill counts twice, decode once",
			loads:   []load{{1600, 0}, {0, 3200}, {0, 0}},
			matched: []int32{0, 0, 0},
			costs:   []float64{400, 400, 200},
			want:    2,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bs := peerFleet(t, len(tc.loads))
			for i, l := range tc.loads {
				if l.pending > 0 {
					peerLoad(t, bs[i], 1, l.pending, 10, false)
				}
				if l.decoding > 0 {
					peerLoad(t, bs[i], 1, l.decoding, 10, true)
				}
			}
			in := peerInput(t, prompt, bs, tc.matched)
			for i, want := range tc.costs {
				if got := dynamoCost(in, i); got != want {
					t.Errorf("cost[%d] = %v, want %v", i, got, want)
				}
			}
			if d := NewDynamo(Options{}).Pick(in); d.Index != tc.want {
				t.Errorf("pick = %d, want %d", d.Index, tc.want)
			}
		})
	}
}

func TestDynamoTiesAreRandom(t *testing.T) {
	bs := peerFleet(t, 3)
	in := peerInput(t, strings.Repeat("y", 640), bs, nil)
	p := NewDynamo(Options{Seed: 3})
	seen := map[int]bool{}
	for range 100 {
		seen[p.Pick(in).Index] = true
	}
	if len(seen) != 3 {
		t.Fatalf("ties reached %d of 3 workers", len(seen))
	}
}

func BenchmarkDynamoPick(b *testing.B) {
	p := NewDynamo(Options{Seed: 1})
	in := peerBenchInput(b, p)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		p.Pick(in)
	}
}
