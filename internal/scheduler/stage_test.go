package scheduler

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/prefix"
	"github.com/kvroute/kvroute/internal/request"
)

// TestKVRouteCachedWithinPrompt: a completion prompt of token ids renders
// five characters a token (base 36 and a space), so its blocks of 64
// characters stand for more tokens than the prompt has. The scheduler's
// accounting always counted at most the prompt as cached; kvroute counted
// every matched block, and so saw a backend holding this 2,000-token
// prompt hold 2,496 of it: a lead over an idle backend of more than one
// engine step (2,048 tokens) that the prompt does not have, and it kept
// the prompt on the busy holder ("cache") to save less than a step.
func TestKVRouteCachedWithinPrompt(t *testing.T) {
	f := newFleet(t, 2)
	s := New(f, policy.NewKVRoute(policy.Options{}), Config{})
	var sb strings.Builder
	for i := range 2000 {
		sb.WriteString(strings.ToLower(string(rune('a' + i%26))))
		sb.WriteString("zzz ")
	}
	v := &request.View{Kind: request.Completion, Prompt: sb.String(), PromptTokens: 2000, PromptExact: true}
	hashes := s.Hashes(v)
	if got := len(hashes) * s.BlockChars() / request.BytesPerToken; got <= v.PromptTokens {
		t.Fatalf("fixture: %d blocks stand for %d tokens, want more than the prompt's %d", len(hashes), got, v.PromptTokens)
	}
	holder, idle := f.Snapshot().All[0], f.Snapshot().All[1]
	for _, b := range []*fleet.Backend{holder, idle} {
		b.SetMaxBatchedTokens(2048)
	}
	s.Index().Insert(holder.ID, hashes)
	// The holder is busy with 4,000 tokens of prefill: the idle backend's
	// 2,000 are the lower estimate, and the holder's within
	// CacheStickyRatio of it.
	holder.Start(4000, 4000, 100, t0)
	a, err := s.RouteHashed(v, hashes, nil, t0)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Done(t0)
	if a.Backend != idle {
		t.Errorf("routed to %s (%s), want the idle backend: the holder's lead is the 2,000-token prompt, less than a 2,048-token step", a.Backend.Name, a.Reason)
	}
	if a.MatchedTokens > v.PromptTokens {
		t.Errorf("MatchedTokens %d beyond the prompt's %d", a.MatchedTokens, v.PromptTokens)
	}
}

// tiers is a Filter by backend name: the tier of each named backend, 0
// for the rest.
type tiers map[string]int

func (f tiers) Tier(_ *request.View, b *fleet.Backend) int { return f[b.Name] }

// costs is a Scorer by backend name.
type costs map[string]float64

func (c costs) Cost(_ *request.View, b *fleet.Backend) float64 { return c[b.Name] }

// shown records the candidates and their Extra that the policy was shown,
// and picks the first.
type shown struct {
	names []string
	extra []float64
}

func (*shown) Name() string { return "test-shown" }

func (p *shown) Pick(in *policy.Input) policy.Decision {
	p.names = p.names[:0]
	for _, b := range in.Candidates {
		p.names = append(p.names, b.Name)
	}
	p.extra = slices.Clone(in.Extra)
	return policy.Decision{}
}

func TestFilters(t *testing.T) {
	tests := []struct {
		name    string
		filters []policy.Filter
		want    []string // nil: ErrNoBackend
	}{
		{"none: every candidate", nil, []string{"b0", "b1", "b2", "b3"}},
		{"the lowest tier present, in order", []policy.Filter{tiers{"b0": 2, "b1": 1, "b2": 2, "b3": 1}}, []string{"b1", "b3"}},
		{"a negative tier never", []policy.Filter{tiers{"b0": -1, "b1": 3, "b2": 3, "b3": -1}}, []string{"b1", "b2"}},
		{"filters in turn", []policy.Filter{tiers{"b0": 1}, tiers{"b1": 1, "b2": -1}}, []string{"b3"}},
		{"none allowed", []policy.Filter{tiers{"b0": -1, "b1": -1, "b2": -1, "b3": -1}}, nil},
	}
	for _, tc := range tests {
		p := &shown{}
		s := New(newFleet(t, 4), p, Config{Filters: tc.filters})
		a, err := s.Route(view("", text(1, 640)), nil, t0)
		if tc.want == nil {
			if !errors.Is(err, ErrNoBackend) {
				t.Errorf("%s: err %v, want ErrNoBackend", tc.name, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		a.Done(t0)
		if !slices.Equal(p.names, tc.want) {
			t.Errorf("%s: candidates %v, want %v", tc.name, p.names, tc.want)
		}
	}
}

func TestScorers(t *testing.T) {
	p := &shown{}
	s := New(newFleet(t, 3), p, Config{})
	a, _ := s.Route(view("", text(1, 640)), nil, t0)
	a.Done(t0)
	if p.extra != nil {
		t.Errorf("Extra %v without scorers, want nil", p.extra)
	}
	s = New(newFleet(t, 3), p, Config{Scorers: []policy.Scorer{costs{"b1": 0.5}, costs{"b1": 0.25, "b2": 1, "b0": -3}}})
	a, _ = s.Route(view("", text(1, 640)), nil, t0)
	a.Done(t0)
	if want := []float64{0, 0.75, 1}; !slices.Equal(p.extra, want) {
		t.Errorf("Extra %v, want %v (summed per candidate, a negative cost as 0)", p.extra, want)
	}
	// kvroute weighs them: on an idle fleet a prompt goes where no scorer
	// charges anything.
	for range 6 {
		s := New(newFleet(t, 3), policy.NewKVRoute(policy.Options{}), Config{Scorers: []policy.Scorer{costs{"b0": 0.1, "b2": 0.1}}})
		a, err := s.Route(view("", text(1, 640)), nil, t0)
		if err != nil {
			t.Fatal(err)
		}
		if a.Backend.Name != "b1" {
			t.Fatalf("kvroute routed to %s, want b1 (0.1 s extra on the others)", a.Backend.Name)
		}
		a.Done(t0)
	}
}

// TestInputTokens: the policy is shown each candidate's cached and
// uncached tokens, and the ticket is opened with the chosen one's.
func TestInputTokens(t *testing.T) {
	var in policy.Input
	p := policyFunc(func(x *policy.Input) policy.Decision {
		in = *x
		in.Cached, in.Uncached = slices.Clone(x.Cached), slices.Clone(x.Uncached)
		return policy.Decision{Index: 1}
	})
	f := newFleet(t, 3)
	s := New(f, p, Config{BlockChars: 64})
	doc := text(1, 64*10)
	s.Index().Insert(1, prefix.Hash(nil, doc[:64*4], 64))
	s.Index().Insert(2, prefix.Hash(nil, doc[:64*6], 64))
	v := view("", doc+text(2, 100))
	a, err := s.Route(v, nil, t0)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Done(t0)
	prompt := int64(v.PromptTokens)
	if want := []int64{0, 4 * 16, 6 * 16}; !slices.Equal(in.Cached, want) {
		t.Errorf("Cached %v, want %v", in.Cached, want)
	}
	if want := []int64{prompt, prompt - 4*16, prompt - 6*16}; !slices.Equal(in.Uncached, want) {
		t.Errorf("Uncached %v, want %v", in.Uncached, want)
	}
	if a.MatchedTokens != 4*16 || a.Backend.Load().PendingPrefill != prompt-4*16 {
		t.Errorf("assignment: %d matched, %d pending; want %d and %d", a.MatchedTokens, a.Backend.Load().PendingPrefill, 4*16, prompt-4*16)
	}
}

// policyFunc is a Policy from a function.
type policyFunc func(*policy.Input) policy.Decision

func (policyFunc) Name() string                            { return "test-func" }
func (f policyFunc) Pick(in *policy.Input) policy.Decision { return f(in) }
