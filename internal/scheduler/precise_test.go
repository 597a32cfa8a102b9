package scheduler

import (
	"slices"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/prefix"
)

// showMatched picks the longest match, first on ties, and records what it
// was shown.
type showMatched struct{ seen []int32 }

func (*showMatched) Name() string { return "test-show" }

func (p *showMatched) Pick(in *policy.Input) policy.Decision {
	p.seen = slices.Clone(in.Matched)
	return longestPrefix{}.Pick(in)
}

// ptokens returns the token ids of a prompt of n blocks of 16 tokens, the
// ids from base: four characters a token, as the engine model counts.
func ptokens(base uint32, blocks int) []uint32 {
	out := make([]uint32, 16*blocks)
	for i := range out {
		out[i] = base + uint32(i)
	}
	return out
}

// storedBlocks reports that backend holds the first n blocks of tokens.
func storedBlocks(t *testing.T, s *Scheduler, backend int, tokens []uint32, n int) {
	t.Helper()
	hashes := make([]uint64, n)
	for i := range hashes {
		hashes[i] = uint64(backend)<<32 | uint64(i+1)
	}
	s.Precise().Apply(backend, []kvevents.Event{{Kind: kvevents.BlockStored, BlockHashes: hashes, TokenIDs: tokens[:16*n], BlockSize: 16}}, t0)
}

func TestRoutePrecise(t *testing.T) {
	prompt := text(3, 10*64) // 10 approximate blocks
	tokens := ptokens(0, 10) // and 10 token blocks
	type setup struct {
		approx  []int // blocks of prompt the approximate index holds, per backend
		trusted []bool
		exact   []int // blocks the engines reported, per trusted backend
	}
	tests := []struct {
		name      string
		setup     setup
		noTokens  bool
		wantSeen  []int32
		wantPick  int
		wantMatch string
	}{
		{
			name:      "precise replaces the guess, per backend",
			setup:     setup{approx: []int{5, 8, 0}, trusted: []bool{false, true, true}, exact: []int{0, 3, 0}},
			wantSeen:  []int32{5, 3, 0},
			wantPick:  0,
			wantMatch: "approximate",
		},
		{
			name:      "every backend precise",
			setup:     setup{approx: []int{9, 8, 0}, trusted: []bool{true, true, true}, exact: []int{0, 3, 7}},
			wantSeen:  []int32{0, 3, 7},
			wantPick:  2,
			wantMatch: "precise",
		},
		{
			name:      "no tokens: approximate everywhere",
			setup:     setup{approx: []int{1, 2, 0}, trusted: []bool{true, true, true}, exact: []int{0, 3, 7}},
			noTokens:  true,
			wantSeen:  []int32{1, 2, 0},
			wantPick:  1,
			wantMatch: "approximate",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pol := &showMatched{}
			s := New(newFleet(t, 3), pol, Config{Precise: &prefix.PreciseConfig{}})
			hashes := s.Hashes(view("", prompt))
			for b, n := range tt.setup.approx {
				s.Index().Insert(b, hashes[:n])
				if tt.setup.trusted[b] {
					s.Precise().Reset(b, true, t0)
					storedBlocks(t, s, b, tokens, tt.setup.exact[b])
				}
			}
			keys := s.TokenKeys(tokens, "")
			if tt.noTokens {
				keys = nil
			}
			a, err := s.RoutePrecise(view("", prompt), hashes, keys, nil, t0)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Done(t0)
			if !slices.Equal(pol.seen, tt.wantSeen) {
				t.Errorf("policy saw %v, want %v", pol.seen, tt.wantSeen)
			}
			if a.Backend.ID != tt.wantPick {
				t.Errorf("picked %d, want %d", a.Backend.ID, tt.wantPick)
			}
			if !strings.Contains(a.Reason, " match="+tt.wantMatch) {
				t.Errorf("Reason %q, want match=%s", a.Reason, tt.wantMatch)
			}
		})
	}
}

// TestRoutePreciseBurst checks that a burst of one prompt lands together on
// precise backends before any event reports it: the speculative entry.
func TestRoutePreciseBurst(t *testing.T) {
	s := New(newFleet(t, 4), longestPrefix{}, Config{Precise: &prefix.PreciseConfig{}})
	for b := range 4 {
		s.Precise().Reset(b, true, t0)
		s.Precise().Apply(b, nil, t0)
	}
	prompt := text(5, 20*64)
	keys := s.TokenKeys(ptokens(0, 20), "")
	v := view("", prompt)
	// The first goes to backend 2 (the others excluded), where nothing
	// is cached yet.
	first, err := s.RoutePrecise(v, s.Hashes(v), keys, []int{0, 1}, t0)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Done(t0)
	if first.MatchedTokens != 0 {
		t.Errorf("first request matched %d tokens, want 0", first.MatchedTokens)
	}
	a, err := s.RoutePrecise(v, s.Hashes(v), keys, nil, t0.Add(prefix.DefaultSpeculativeTTL/2))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Done(t0)
	if a.Backend.ID != 2 || !strings.Contains(a.Reason, "prefix=20/20 match=precise") {
		t.Errorf("second request: backend %d %q, want backend 2 with the whole prompt matched precisely", a.Backend.ID, a.Reason)
	}
}

func TestReasonWithoutPreciseIndex(t *testing.T) {
	s := New(newFleet(t, 1), &fixed{}, Config{})
	v := view("", text(4, 130))
	a, err := s.RoutePrecise(v, s.Hashes(v), s.TokenKeys(ptokens(0, 2), ""), nil, t0)
	if err != nil {
		t.Fatal(err)
	}
	a.Done(t0)
	if a.Reason != "policy=test-fixed prefix=0/2" {
		t.Errorf("Reason %q: no match= without a precise index", a.Reason)
	}
}
