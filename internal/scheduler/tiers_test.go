package scheduler

import (
	"math"
	"testing"

	"github.com/kvroute/kvroute/internal/costmodel"
	"github.com/kvroute/kvroute/internal/policy"
)

// seeing records the tiers and loads the policy was shown, and picks the
// first candidate.
type seeing struct {
	matched []int32
	tiers   []policy.TierTokens
	load    []float64
}

func (*seeing) Name() string { return "test-seeing" }

func (p *seeing) Pick(in *policy.Input) policy.Decision {
	p.matched = append(p.matched[:0], in.Matched...)
	p.tiers = append(p.tiers[:0], in.Tiers...)
	p.load = append(p.load[:0], in.Load...)
	return policy.Decision{}
}

// With a CPU tier, the blocks the approximate index evicts for a backend's
// GPU stay matched there, counted as cached and priced at the backend's
// load time per token; without one they are gone, and the policy is shown
// no tiers.
func TestCacheTiersPriced(t *testing.T) {
	for _, cpu := range []bool{false, true} {
		f := newFleet(t, 1)
		p := &seeing{}
		s := New(f, p, Config{BlockChars: 64})
		s.SetKVCapacity(0, 4*16) // 4 blocks of 64 characters
		if cpu {
			s.SetCPUCapacity(0, 16*16)
		}
		prompt := text(1, 64*10+10)
		for range 2 {
			a, err := s.Route(view("", prompt), nil, t0)
			if err != nil {
				t.Fatal(err)
			}
			a.Done(t0)
		}
		if !cpu {
			if p.matched[0] != 4 || p.tiers != nil || p.load != nil {
				t.Errorf("no CPU tier: matched %d, tiers %v, load %v; want 4 GPU blocks, no tiers", p.matched[0], p.tiers, p.load)
			}
			continue
		}
		// 4 blocks on the GPU (64 tokens), the 6 it evicted on the CPU.
		want := policy.TierTokens{64, 96, 0}
		if p.matched[0] != 10 || len(p.tiers) != 1 || p.tiers[0] != want {
			t.Fatalf("CPU tier: matched %d, tiers %v; want 10 blocks as %v", p.matched[0], p.tiers, want)
		}
		if got, w := p.load[0], 96*f.Snapshot().All[0].Cost().LoadPerToken(costmodel.TierHost); math.Abs(got-w) > 1e-12 || w <= 0 {
			t.Errorf("load %g s, want %g (96 tokens at the backend's host load time)", got, w)
		}
	}
}
