package scheduler

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/prefix"
	"github.com/kvroute/kvroute/internal/request"
)

var t0 = time.Unix(1000, 0)

// longestPrefix picks the candidate holding the longest prefix, first on
// ties: enough policy to observe the scheduler, nothing more.
type longestPrefix struct{}

func (longestPrefix) Name() string { return "test-longest" }

func (longestPrefix) Pick(in *policy.Input) policy.Decision {
	best := 0
	for i, m := range in.Matched {
		if m > in.Matched[best] {
			best = i
		}
	}
	return policy.Decision{Index: best}
}

// fixed picks candidate index i, says so, and records what it was shown.
type fixed struct {
	i      int
	est    float64
	note   string
	seen   []int // candidate IDs of the last pick
	routed atomic.Int64
}

func (f *fixed) Name() string { return "test-fixed" }

func (f *fixed) Pick(in *policy.Input) policy.Decision {
	f.seen = f.seen[:0]
	for _, b := range in.Candidates {
		f.seen = append(f.seen, b.ID)
	}
	return policy.Decision{Index: min(f.i, len(in.Candidates)-1), EstTTFT: f.est, Note: f.note}
}

func (f *fixed) Routed(in *policy.Input, d policy.Decision) { f.routed.Add(1) }

var _ policy.Observer = (*fixed)(nil)

func newFleet(t testing.TB, n int, models ...string) *fleet.Fleet {
	t.Helper()
	f := fleet.New()
	for i := range n {
		f.Add(fmt.Sprintf("b%d", i), nil, models)
	}
	return f
}

func view(model, prompt string) *request.View {
	return &request.View{Model: model, Prompt: prompt, PromptTokens: request.EstimateTokens(prompt)}
}

// text returns n characters that share nothing with other seeds' text.
func text(seed, n int) string {
	var sb strings.Builder
	for sb.Len() < n {
		fmt.Fprintf(&sb, "[%d:%d]", seed, sb.Len())
	}
	return sb.String()[:n]
}

func TestRouteErrors(t *testing.T) {
	tests := []struct {
		name    string
		models  []string
		eject   []int
		model   string
		exclude []int
		want    error
	}{
		{"unknown model", []string{"m"}, nil, "other", nil, ErrUnknownModel},
		{"all ejected", []string{"m"}, []int{0, 1, 2}, "m", nil, ErrNoBackend},
		{"all excluded", []string{"m"}, nil, "m", []int{0, 1, 2}, ErrNoBackend},
		{"ejected plus excluded", []string{"m"}, []int{0, 1}, "m", []int{2}, ErrNoBackend},
		{"ejected unknown model is still unknown", []string{"m"}, []int{0, 1, 2}, "x", nil, ErrUnknownModel},
		{"one left", []string{"m"}, []int{0}, "m", []int{2}, nil},
		{"any-model backends serve anything", nil, nil, "whatever", nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFleet(t, 3, tt.models...)
			for _, id := range tt.eject {
				f.SetHealthy(f.Snapshot().All[id], false)
			}
			s := New(f, longestPrefix{}, Config{})
			a, err := s.Route(view(tt.model, text(1, 300)), tt.exclude, t0)
			if !errors.Is(err, tt.want) {
				t.Fatalf("Route error %v, want %v", err, tt.want)
			}
			if err == nil {
				a.Done(t0)
			}
		})
	}
}

func TestRouteCandidates(t *testing.T) {
	f := newFleet(t, 5)
	f.Add("other-model", nil, []string{"y"})
	f.SetHealthy(f.Snapshot().All[1], false)
	p := &fixed{i: 1}
	s := New(f, p, Config{})
	a, err := s.Route(view("x", "hi"), []int{3}, t0)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Done(t0)
	if got := fmt.Sprint(p.seen); got != "[0 2 4]" {
		t.Errorf("candidates %s, want [0 2 4] (healthy, serving x, not excluded)", got)
	}
	if a.Backend.ID != 2 {
		t.Errorf("routed to %d, want candidate 1 = backend 2", a.Backend.ID)
	}
	if p.routed.Load() != 1 {
		t.Errorf("Observer.Routed called %d times, want 1", p.routed.Load())
	}
}

// TestRouteLearnsPrefix checks that a routed request's blocks are inserted
// for the chosen backend: a later request extending its prompt matches
// there, and only there.
func TestRouteLearnsPrefix(t *testing.T) {
	f := newFleet(t, 4)
	s := New(f, longestPrefix{}, Config{BlockChars: 64})
	first := text(1, 64*10+10)
	// Nothing matches yet, so the policy takes the first candidate: 2.
	a, err := s.Route(view("", first), []int{0, 1}, t0)
	if err != nil {
		t.Fatal(err)
	}
	a.Done(t0)
	if a.MatchedTokens != 0 {
		t.Errorf("first request matched %d tokens, want 0", a.MatchedTokens)
	}

	second := first + text(2, 64*5)
	b, err := s.Route(view("", second), nil, t0)
	if err != nil {
		t.Fatal(err)
	}
	b.Done(t0)
	if b.Backend.ID != 2 {
		t.Errorf("extension routed to %d, want 2 where the prefix is", b.Backend.ID)
	}
	if want := 10 * 64 / request.BytesPerToken; b.MatchedTokens != want {
		t.Errorf("MatchedTokens = %d, want %d", b.MatchedTokens, want)
	}
	if want := "policy=test-longest prefix=10/15"; b.Reason != want {
		t.Errorf("Reason = %q, want %q", b.Reason, want)
	}
	out := make([]int32, 4)
	s.Index().Match(prefix.Hash(nil, second, 64), out)
	if fmt.Sprint(out) != "[0 0 15 0]" {
		t.Errorf("index after two requests: %v, want [0 0 15 0]", out)
	}
}

func TestRouteAccounting(t *testing.T) {
	tests := []struct {
		name       string
		prompt     int // characters
		tokens     int // PromptTokens override (0: estimate)
		maxTokens  int
		warm       bool // route the same prompt first
		wantBudget int64
		wantMatch  int
	}{
		{"cold, default budget", 640, 0, 0, false, request.DefaultOutputBudget, 0},
		{"warm, client budget", 640, 0, 77, true, 77, 160},
		{"match clamped to prompt tokens", 640, 100, 5, true, 5, 100},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFleet(t, 1)
			s := New(f, longestPrefix{}, Config{})
			v := view("", text(3, tt.prompt))
			v.MaxTokens = tt.maxTokens
			if tt.tokens > 0 {
				v.PromptTokens = tt.tokens
			}
			if tt.warm {
				a, _ := s.Route(v, nil, t0)
				a.Done(t0)
			}
			a, err := s.Route(v, nil, t0)
			if err != nil {
				t.Fatal(err)
			}
			be := a.Backend
			if a.MatchedTokens != tt.wantMatch {
				t.Errorf("MatchedTokens = %d, want %d", a.MatchedTokens, tt.wantMatch)
			}
			want := fleet.Load{InFlight: 1, PendingPrefill: int64(v.PromptTokens - tt.wantMatch)}
			if got := be.Load(); got != want {
				t.Errorf("after Route: %+v, want %+v", got, want)
			}
			a.FirstByte(t0.Add(time.Second))
			want = fleet.Load{InFlight: 1, Decoding: 1, DecodeBudget: tt.wantBudget, DecodeTokens: int64(v.PromptTokens)}
			if got := be.Load(); got != want {
				t.Errorf("after FirstByte: %+v, want %+v", got, want)
			}
			a.Done(t0.Add(2 * time.Second))
			a.Done(t0.Add(3 * time.Second))
			if got := be.Load(); got != (fleet.Load{}) {
				t.Errorf("after Done: %+v, want zero", got)
			}
		})
	}
}

func TestReason(t *testing.T) {
	tests := []struct {
		est  float64
		note string
		want string
	}{
		{0, "", "policy=test-fixed prefix=0/2"},
		{0.2134, "", "policy=test-fixed prefix=0/2 est_ttft=0.213s"},
		{1.5, "sticky", "policy=test-fixed prefix=0/2 est_ttft=1.500s sticky"},
		{0, "least-loaded", "policy=test-fixed prefix=0/2 least-loaded"},
	}
	for _, tt := range tests {
		s := New(newFleet(t, 1), &fixed{est: tt.est, note: tt.note}, Config{})
		a, err := s.Route(view("", text(4, 130)), nil, t0)
		if err != nil {
			t.Fatal(err)
		}
		a.Done(t0)
		if a.Reason != tt.want {
			t.Errorf("Reason = %q, want %q", a.Reason, tt.want)
		}
	}
}

// TestRateLearning checks that streaming requests teach the chosen
// backend's prefill rate and non-streaming ones, whose first byte follows
// the whole generation, do not, unless that generation is one token (a
// split request's prefill leg, max_tokens 1): its answer follows the
// prefill.
func TestRateLearning(t *testing.T) {
	for _, tt := range []struct {
		stream    bool
		maxTokens int
		learns    bool
	}{
		{true, 0, true},
		{false, 0, false},
		{false, 64, false},
		{false, 1, true},
	} {
		f := newFleet(t, 1)
		s := New(f, longestPrefix{}, Config{})
		v := view("", text(5, 40000)) // 10,000 uncached tokens
		v.Stream, v.MaxTokens = tt.stream, tt.maxTokens
		a, err := s.Route(v, nil, t0)
		if err != nil {
			t.Fatal(err)
		}
		a.FirstByte(t0.Add(2 * time.Second))
		a.Done(t0.Add(3 * time.Second))
		// A first byte that follows the prefill (a stream's, or a
		// one-token answer's) teaches the cost model a slower prefill than
		// the prior's (10,000 tokens in 2 s); one that follows a whole
		// generation teaches nothing.
		got, n := a.Backend.PrefillRate(t0.Add(3*time.Second)), a.Backend.CostSamples()
		if tt.learns && (n != 1 || !(got < fleet.DefaultPrefillRate)) {
			t.Errorf("stream %v, max_tokens %d: PrefillRate = %v (%d samples), want below the prior's %v, from 1 sample", tt.stream, tt.maxTokens, got, n, fleet.DefaultPrefillRate)
		}
		if !tt.learns && (n != 0 || got != fleet.DefaultPrefillRate) {
			t.Errorf("stream %v, max_tokens %d: PrefillRate = %v (%d samples), want the prior's %v", tt.stream, tt.maxTokens, got, n, fleet.DefaultPrefillRate)
		}
	}
}

// TestConcurrentRoute routes from many goroutines with health flapping and
// every request ending some way, then checks the counters are all zero.
func TestConcurrentRoute(t *testing.T) {
	f := newFleet(t, 6)
	s := New(f, longestPrefix{}, Config{Capacity: 500})
	prompts := make([]string, 8)
	for i := range prompts {
		prompts[i] = text(i, 2000+i*300)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for range 300 {
				if rng.IntN(40) == 0 {
					all := f.Snapshot().All
					f.SetHealthy(all[rng.IntN(len(all))], rng.IntN(3) != 0)
				}
				a, err := s.Route(view("", prompts[rng.IntN(len(prompts))]), []int{rng.IntN(6)}, t0)
				if err != nil {
					if !errors.Is(err, ErrNoBackend) {
						t.Errorf("Route: %v", err)
					}
					continue
				}
				if rng.IntN(3) > 0 {
					a.FirstByte(t0.Add(time.Millisecond))
				}
				a.Done(t0.Add(time.Second))
			}
		})
	}
	wg.Wait()
	for _, b := range f.Snapshot().All {
		if l := b.Load(); l != (fleet.Load{}) {
			t.Errorf("backend %d: %+v after all requests ended", b.ID, l)
		}
	}
}

// TestRouteHashedMatchesRoute replays the same requests through Route on one
// scheduler and through RouteHashed (with the prompts hashed by the caller)
// on another: every decision and its reason must agree.
func TestRouteHashedMatchesRoute(t *testing.T) {
	a := New(newFleet(t, 4), policy.Policy(longestPrefix{}), Config{})
	b := New(newFleet(t, 4), policy.Policy(longestPrefix{}), Config{})
	r := rand.New(rand.NewPCG(3, 4))
	for i := range 200 {
		v := view("m", text(r.IntN(8), 64*(1+r.IntN(20))+r.IntN(64)))
		now := t0.Add(time.Duration(i) * time.Millisecond)
		got, err := b.RouteHashed(v, prefix.Hash(nil, v.Prompt, b.BlockChars()), nil, now)
		if err != nil {
			t.Fatal(err)
		}
		want, err := a.Route(v, nil, now)
		if err != nil {
			t.Fatal(err)
		}
		if got.Backend.ID != want.Backend.ID || got.Reason != want.Reason || got.MatchedTokens != want.MatchedTokens {
			t.Fatalf("request %d: RouteHashed picked %d (%q, %d tokens), Route %d (%q, %d tokens)",
				i, got.Backend.ID, got.Reason, got.MatchedTokens, want.Backend.ID, want.Reason, want.MatchedTokens)
		}
		got.Done(now)
		want.Done(now)
	}
}

// fewestInFlight is a test policy that takes the first candidate with the
// fewest requests in flight, and yields in the middle of its pick so that
// concurrent picks interleave.
type fewestInFlight struct{}

func (fewestInFlight) Name() string { return "test-fewest" }

func (fewestInFlight) Pick(in *policy.Input) policy.Decision {
	best := 0
	for i, b := range in.Candidates {
		if b.Load().InFlight < in.Candidates[best].Load().InFlight {
			best = i
		}
		runtime.Gosched()
	}
	return policy.Decision{Index: best}
}

// A burst of concurrent requests must not herd: each pick sees the loads
// the picks before it added, so a load-aware policy spreads a burst over
// idle backends evenly (before picks and counts were one step, 100
// concurrent picks could all read the same idle loads and land together).
func TestBurstDoesNotHerd(t *testing.T) {
	f := newFleet(t, 4)
	s := New(f, fewestInFlight{}, Config{})
	const goroutines, each = 50, 8
	var wg sync.WaitGroup
	var mu sync.Mutex
	var held []*Assignment
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				a, err := s.Route(view("", text(g*each+i, 200)), nil, t0)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				held = append(held, a)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	lo, hi := int64(1<<62), int64(0)
	for _, b := range f.Snapshot().All {
		n := b.Load().InFlight
		lo, hi = min(lo, n), max(hi, n)
	}
	if hi-lo > 1 {
		t.Errorf("in flight per backend ranges %d..%d after a burst of %d: picks did not see each other", lo, hi, goroutines*each)
	}
	for _, a := range held {
		a.Done(t0)
	}
}

// TestInFlightBlocksArePinned checks that a request's blocks stay in the
// prefix index while it is in flight, however much else is routed to its
// backend meanwhile, and become evictable (most recent first) at Done, as
// an engine cannot evict the blocks of a queued or running request.
func TestInFlightBlocksArePinned(t *testing.T) {
	f := newFleet(t, 1)
	s := New(f, longestPrefix{}, Config{BlockChars: 64})
	// 10 blocks of 64 characters: 160 tokens at 4 bytes per token.
	s.SetKVCapacity(0, 160)
	prompt := func(seed int) string { return text(seed, 8*64) }
	held := func(p string) int32 {
		out := make([]int32, 1)
		s.Index().Match(prefix.Hash(nil, p, 64), out)
		return out[0]
	}
	route := func(p string) *Assignment {
		a, err := s.Route(view("", p), nil, t0)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	long := route(prompt(1))
	for seed := 2; seed <= 3; seed++ {
		route(prompt(seed)).Done(t0)
	}
	if got := held(prompt(1)); got != 8 {
		t.Fatalf("in flight after 16 more blocks through a 10-block index: %d blocks held, want all 8", got)
	}
	if got := held(prompt(3)); got != 2 {
		t.Errorf("the finished request beside it: %d blocks held, want the 2 that fit", got)
	}
	long.Done(t0)
	long.Done(t0) // only the first Done counts
	if got := held(prompt(1)); got != 8 {
		t.Errorf("just finished: %d blocks held, want 8 (most recent)", got)
	}
	route(prompt(4)).Done(t0)
	if got := held(prompt(1)); got != 2 {
		t.Errorf("after 8 more blocks: %d blocks held, want the first 2 (deepest evicted first)", got)
	}
	if got := s.Index().Len(0); got != 10 {
		t.Errorf("index holds %d blocks, want its capacity 10", got)
	}
}

// TestUncached: the prompt less the longest match among the healthy
// backends serving the model, which the admission queue orders held
// requests by; an unhealthy holder or one of another model does not count,
// and it changes nothing in the index or the accounting.
func TestUncached(t *testing.T) {
	f := fleet.New()
	a := f.Add("a", nil, []string{"m"})
	b := f.Add("b", nil, []string{"m"})
	other := f.Add("other", nil, []string{"x"})
	s := New(f, longestPrefix{}, Config{BlockChars: 64})
	doc := text(1, 64*10)
	s.Index().Insert(a.ID, prefix.Hash(nil, doc[:64*4], 64))
	s.Index().Insert(b.ID, prefix.Hash(nil, doc[:64*6], 64))
	s.Index().Insert(other.ID, prefix.Hash(nil, doc, 64))
	v := view("m", doc+text(2, 100))
	blockTok := 64 / request.BytesPerToken
	if got, want := s.Uncached(v, s.Hashes(v)), v.PromptTokens-6*blockTok; got != want {
		t.Errorf("Uncached %d, want %d (b holds 6 blocks; other serves another model)", got, want)
	}
	f.SetHealthy(b, false)
	if got, want := s.Uncached(v, s.Hashes(v)), v.PromptTokens-4*blockTok; got != want {
		t.Errorf("with b unhealthy: Uncached %d, want %d", got, want)
	}
	if got := s.Uncached(view("m", text(3, 500)), s.Hashes(view("m", text(3, 500)))); got != request.EstimateTokens(text(3, 500)) {
		t.Errorf("a prompt nobody holds: Uncached %d, want all its tokens", got)
	}
	if l := a.Load(); l != (fleet.Load{}) {
		t.Errorf("Uncached changed the accounting: %+v", l)
	}
}
