package policy

import (
	"strings"
	"testing"
)

// The peers' tier weights: a CPU hit weighs 0.75 of a GPU hit for Dynamo
// and 0.8 for llm-d, so that a holder of more of the prompt on the CPU
// loses to a holder of less on the GPU where the weights say so, and wins
// without them (the tier-blind peers).
func TestPeerTierWeights(t *testing.T) {
	prompt := strings.Repeat("x", 6400) // 1,600 tokens, 100 blocks of 64 chars
	tests := []struct {
		name    string
		matched []int32
		tiers   []TierTokens
		policy  string
		want    int
	}{
		// Dynamo: b0 (1600 - 0.75 x 800)/16 = 62.5 prefill blocks,
		// b1 (1600 - 640)/16 = 60: b1. Tier-blind: b0's 50 against 60.
		{"dynamo, weighted", []int32{50, 40}, []TierTokens{{0, 800, 0}, {640, 0, 0}}, "dynamo-kv-tiers", 1},
		{"dynamo, tier-blind", []int32{50, 40}, nil, "dynamo-kv", 0},
		{"dynamo, no tiers reported", []int32{50, 40}, nil, "dynamo-kv-tiers", 0},
		// llm-d: b0 3 x 0.8 x 800/1600 = 1.2, b1 3 x 704/1600 = 1.32: b1;
		// with every hit weighed 1, b0's 1.5 wins.
		{"llm-d, weighted", []int32{50, 44}, []TierTokens{{0, 800, 0}, {704, 0, 0}}, "llmd-tiers", 1},
		{"llm-d, disk weighs 1 (not configured)", []int32{50, 44}, []TierTokens{{0, 0, 800}, {704, 0, 0}}, "llmd-tiers", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bs := peerFleet(t, 2)
			in := peerInput(t, prompt, bs, tc.matched)
			in.Tiers = tc.tiers
			p, err := New(tc.policy, Options{Seed: 1})
			if err != nil {
				t.Fatal(err)
			}
			if d := p.Pick(in); d.Index != tc.want {
				t.Errorf("%s picked %d, want %d", tc.policy, d.Index, tc.want)
			}
		})
	}
}
