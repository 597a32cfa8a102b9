package policy

import (
	"cmp"
	"math"
	"slices"
	"testing"

	"github.com/kvroute/kvroute/internal/fleet"
)

// The rules of KVRoute.Pick, each alone (kvroute_pick.go). A candidate is
// written as cand(key or score, in flight, cached tokens) with the other
// fields set where a case needs them.

func cand(score float64, inFlight, cached int64) candidate {
	return candidate{score: score, key: score, load: fleet.Load{InFlight: inFlight}, cached: cached}
}

func TestLowest(t *testing.T) {
	fits := func(c candidate) candidate { c.fits = true; return c }
	written := func(c candidate, w int64) candidate { c.written = w; return c }
	tests := []struct {
		name string
		c    []candidate
		fits bool
		want int
	}{
		{"the lowest key", []candidate{cand(3, 0, 0), cand(1, 5, 0), cand(2, 0, 0)}, false, 1},
		{"a tie goes to fewer in flight", []candidate{cand(1, 2, 0), cand(1, 1, 0), cand(1, 3, 0)}, false, 1},
		{"then to fewer tokens written", []candidate{written(cand(1, 1, 0), 900), written(cand(1, 1, 0), 100), written(cand(1, 1, 0), 500)}, false, 1},
		{"then to the first scanned", []candidate{cand(1, 1, 0), cand(1, 1, 0)}, false, 0},
		{"ranks by key, not score", []candidate{{score: 1, key: 3}, {score: 2, key: 2}}, false, 1},
		{"only those that fit", []candidate{cand(1, 0, 0), fits(cand(3, 0, 0)), fits(cand(2, 0, 0))}, true, 2},
		{"none fits", []candidate{cand(1, 0, 0), cand(2, 0, 0)}, true, -1},
	}
	for _, tc := range tests {
		if got := lowest(tc.c, tc.fits); got != tc.want {
			t.Errorf("%s: lowest = %d, want %d", tc.name, got, tc.want)
		}
	}
}

// choiceCase is one case of a rule that chooses a candidate of c given
// one more argument.
type choiceCase struct {
	name string
	c    []candidate
	arg  int
	want int
}

func TestHolderOf(t *testing.T) {
	id := func(c candidate, id int) candidate { c.id = id; return c }
	tests := []choiceCase{ // arg: the session's last backend ID
		{"the longest cached prefix", []candidate{id(cand(1, 0, 100), 0), id(cand(9, 0, 300), 1), id(cand(1, 0, 200), 2)}, -1, 1},
		{"on a tie the session's backend", []candidate{id(cand(1, 0, 300), 0), id(cand(9, 0, 300), 7), id(cand(2, 0, 300), 2)}, 7, 1},
		{"the session's backend only on a tie", []candidate{id(cand(1, 0, 400), 0), id(cand(1, 0, 300), 7)}, 7, 0},
		{"then the lower score", []candidate{id(cand(3, 0, 0), 0), id(cand(1, 0, 0), 1), id(cand(2, 0, 0), 2)}, -1, 1},
		{"then the first scanned", []candidate{id(cand(1, 0, 0), 4), id(cand(1, 0, 0), 5)}, -1, 0},
		{"a fresh conversation: the lower score", []candidate{id(cand(2, 0, 0), 0), id(cand(1, 0, 0), 1)}, 9, 1},
	}
	for _, tc := range tests {
		if got := holderOf(tc.c, tc.arg); got != tc.want {
			t.Errorf("%s: holderOf = %d, want %d", tc.name, got, tc.want)
		}
	}
}

// ruleCase is one case of a rule that weighs a holder (or fit) against a
// reference candidate.
type ruleCase struct {
	name   string
	holder candidate
	want   bool
}

// checkRule runs rule(holder, ref) over cases.
func checkRule(t *testing.T, name string, rule func(h, ref *candidate) bool, ref candidate, cases []ruleCase) {
	t.Helper()
	for _, tc := range cases {
		if got := rule(&tc.holder, &ref); got != tc.want {
			t.Errorf("%s, %s: %v, want %v", name, tc.name, got, tc.want)
		}
	}
}

func TestRoom(t *testing.T) {
	best := cand(1.0, 0, 0)
	checkRule(t, "room", room, best, []ruleCase{
		{"within FitRatio", cand(FitRatio, 0, 0), true},
		{"cheaper", cand(0.5, 0, 0), true},
		{"beyond FitRatio", cand(FitRatio*1.01, 0, 0), false},
	})
	if room(&best, &best) {
		t.Error("room for the best itself")
	}
}

func TestSticks(t *testing.T) {
	const bound = 3
	rule := func(h, b *candidate) bool { return sticks(h, b, bound) }
	checkRule(t, "sticks", rule, cand(1.0, 0, 0), []ruleCase{
		{"cheaper", cand(0.5, 0, 0), true},
		{"at AffinityRatio plus the slack", cand(AffinityRatio+AffinitySlack, 0, 0), true},
		{"beyond it", cand(AffinityRatio+2*AffinitySlack, 0, 0), false},
		{"below the in-flight bound", cand(1.0, bound-1, 0), true},
		{"at the in-flight bound", cand(1.0, bound, 0), false},
		{"cheaper but at the bound", cand(0.5, bound, 0), false},
	})
}

func TestStaysShared(t *testing.T) {
	const bound = 3
	rule := func(h, to *candidate) bool { return staysShared(h, to, bound) }
	checkRule(t, "staysShared", rule, cand(1.0, 0, 0), []ruleCase{
		{"no premium: whatever the bound", cand(1.0, 10, 0), true},
		{"a premium within the ratio and the bound", cand(1.1, 0, 0), true},
		{"a premium at the bound", cand(1.1, bound, 0), false},
		{"a premium beyond the ratio", cand(2, 0, 0), false},
	})
}

func TestKeepsCache(t *testing.T) {
	const lead, bound = 8192, 3
	best := cand(1.0, 0, 1000)
	rule := func(h, b *candidate) bool { return keepsCache(h, b, lead, bound) }
	checkRule(t, "keepsCache", rule, best, []ruleCase{
		{"a lead of one chunk", cand(2, 0, 1000+lead), true},
		{"a lead short of it", cand(2, 0, 1000+lead-1), false},
		{"at CacheStickyRatio", cand(CacheStickyRatio, 0, 1000+lead), true},
		{"beyond CacheStickyRatio", cand(CacheStickyRatio*1.01, 0, 1000+lead), false},
		{"at the in-flight bound", cand(2, bound, 1000+lead), false},
	})
	if keepsCache(&best, &best, 0, bound) {
		t.Error("keepsCache of the best itself")
	}
}

func TestNote(t *testing.T) {
	tests := []struct {
		best, holder int64 // cached tokens
		want         string
	}{
		{0, 0, "load"},
		{500, 500, "cache"},
		{500, 900, "load"},
	}
	for _, tc := range tests {
		b, h := cand(1, 0, tc.best), cand(1, 0, tc.holder)
		if got := note(&b, &h); got != tc.want {
			t.Errorf("best %d cached, holder %d: note %q, want %q", tc.best, tc.holder, got, tc.want)
		}
	}
}

func TestPlaceShared(t *testing.T) {
	cands := fxBackends(t, make([]fxLoad, 3)...)
	const session = 42
	at := func(c candidate, i int) candidate { c.i = i; return c }
	// r[0], r[1], r[2]: the candidates in the session's rendezvous order.
	r := []int{0, 1, 2}
	slices.SortFunc(r, func(a, b int) int { return cmp.Compare(sessionRank(session, cands[a]), sessionRank(session, cands[b])) })
	// scores gives candidate r[k] score s[k] and inFlight f[k].
	scores := func(s [3]float64, f [3]int64) []candidate {
		c := make([]candidate, 3)
		for k := range 3 {
			c[r[k]] = at(cand(s[k], f[k], 0), r[k])
		}
		return c
	}
	tests := []struct {
		name  string
		c     []candidate
		skip  int
		bound int64
		want  int
	}{
		{"idle: the first of the rendezvous order", scores([3]float64{1, 1, 1}, [3]int64{}), -1, 10, r[0]},
		{"never the holder", scores([3]float64{1, 1, 1}, [3]int64{}), r[0], 10, r[1]},
		{"within the bound: the first all the same", scores([3]float64{1.1, 1, 1}, [3]int64{}), -1, 10, r[0]},
		{"past the ratio: the next", scores([3]float64{3, 1, 1}, [3]int64{}), -1, 10, r[1]},
		{"past the ratio, the next too: the lowest score", scores([3]float64{3, 3, 1}, [3]int64{}), -1, 10, r[2]},
		{"past the in-flight bound: the next", scores([3]float64{1.1, 1, 1}, [3]int64{5, 0, 0}), -1, 3, r[1]},
		{"the lowest score stays whatever its in flight", scores([3]float64{3, 1, 3}, [3]int64{0, 9, 0}), -1, 3, r[1]},
		{"the holder alone", []candidate{at(cand(1, 0, 0), 0)}, 0, 10, 0},
	}
	for _, tc := range tests {
		c := tc.c
		first, second := lowestTwo(c)
		if got := placeShared(c, tc.skip, first, second, session, cands, tc.bound); got != tc.want {
			t.Errorf("%s: placeShared = %d, want %d (rendezvous order %v)", tc.name, got, tc.want, r)
		}
	}
}

func TestComputedAndScored(t *testing.T) {
	for _, tc := range []struct{ uncached, want int64 }{{0, 1}, {1, 1}, {500, 500}} {
		if got := computed(tc.uncached); got != tc.want {
			t.Errorf("computed(%d) = %d, want %d", tc.uncached, got, tc.want)
		}
	}
	// Not backlogged: the score is the estimate. Backlogged: the work is
	// charged missCost times again at the fleet's rate.
	if got := scored(0.5, 0, 1000, 10000); got != 0.5 {
		t.Errorf("scored with no backlog = %v, want 0.5", got)
	}
	if got := scored(0.5, 2, 1000, 10000); math.Abs(got-0.7) > 1e-12 {
		t.Errorf("scored with missCost 2 = %v, want 0.5 + 2 x 1000/10000 = 0.7", got)
	}
	if got := missCharge(4*3, 4); got != MissCostPerWaiter*(3-FreeWaiters) {
		t.Errorf("missCharge(12 waiting over 4) = %v, want %v", got, MissCostPerWaiter*(3-FreeWaiters))
	}
	if got := missCharge(2, 4); got != 0 {
		t.Errorf("missCharge below FreeWaiters = %v, want 0", got)
	}
}

// TestEstimateAll checks the estimate stage: candidate i lands at
// (i - start) mod n with its own cached tokens, the fleet's sums, the
// scorers' extra seconds added to the estimate, and the shared view
// costing every backend at the default rate without engine reports.
func TestEstimateAll(t *testing.T) {
	loads := []fxLoad{
		{pending: []int64{4000}, rate: 30000},
		{decoding: 2, ctx: 1000},
		{pending: []int64{1000, 2000}, kvTokens: 100000, kvUsage: 0.99},
	}
	cands := fxBackends(t, loads...)
	in := fxInput(cands, loads, 3000, "")
	in.Matched[1] = 100
	fxTokens(in)
	p := NewKVRoute(Options{})
	r := p.request(in)
	c := make([]candidate, 3)
	f := p.estimateAll(in, &r, false, 1, c)
	for k, want := range []int{1, 2, 0} {
		if c[k].i != want || c[k].id != cands[want].ID || c[k].cached != in.Cached[want] {
			t.Errorf("slot %d holds candidate %d (id %d, %d cached), want %d", k, c[k].i, c[k].id, c[k].cached, want)
		}
	}
	if f.total != 5 || f.waiting != 3 {
		t.Errorf("fleet: %d in flight, %d waiting; want 5 and 3", f.total, f.waiting)
	}
	if c[1].fits || !c[0].fits {
		t.Errorf("fits: %v %v, want the 99%%-full engine without room and the others with", c[1].fits, c[0].fits)
	}
	in.Extra = []float64{0, 0.25, 0}
	e := make([]candidate, 3)
	p.estimateAll(in, &r, false, 1, e)
	if d := e[0].est - c[0].est; math.Abs(d-0.25) > 1e-12 || e[1].est != c[1].est {
		t.Errorf("extra 0.25 s on candidate 1 moved its estimate by %v, candidate 2's by %v", d, e[1].est-c[1].est)
	}
	in.Extra = nil
	s := make([]candidate, 3)
	fs := p.estimateAll(in, &r, true, 0, s)
	// The fleet's rate on the shared view: the geometric mean of the
	// priors' (candidate 0's fixture prior is 30,000 tokens/s, the
	// others' the generic 10,000).
	if want := math.Cbrt(30000 * 10000 * 10000); math.Abs(fs.rate-want) > 1e-6 || s[0].fits || s[0].written != 0 {
		t.Errorf("shared view: rate %v, fits %v, written %d; want the priors' rate %v and no own-view fields", fs.rate, s[0].fits, s[0].written, want)
	}
	// Candidate 0's own model is frozen at 30,000 tokens/s; the shared view
	// costs it at its prior (the fixture's frozen one) without engine.
	// Within the trust band: the fleet's coefficients.
	want := p.estimate(cands[0], nil, &s[0].load, 3000, 3000, 0, 0, fs.co, cands[0].Chunk())
	if s[0].est != want {
		t.Errorf("shared estimate of candidate 0 = %v, want %v (the prior, no engine)", s[0].est, want)
	}
}
