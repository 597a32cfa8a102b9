package disagg

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/scheduler"
)

// testCosts are a 100 µs transfer latency and 3.3 µs a token, the
// h100-llama3-8b preset's order; p is 40 µs a prefill token.
var testCosts = Costs{TransferLatency: 100 * time.Microsecond, TransferPerToken: 3300 * time.Nanosecond}

const testP = 40e-6

func side(queued, uncached, decoding int64) Side {
	return Side{OK: true, Queued: queued, Uncached: uncached, Decoding: decoding}
}

func TestDecide(t *testing.T) {
	// With equal queues, a request is split when n u p > L + u t: for
	// n = 10 streams, u* = L / (n p - t) = 100e-6 / (400e-6 - 3.3e-6),
	// just over a quarter of a token: every uncached token is worth a
	// split. With one stream, u* = 100e-6 / 36.7e-6, about 2.7 tokens.
	tests := []struct {
		name  string
		e     Estimate
		split bool
		why   string
	}{
		{"long uncached prompt beside busy streams", Estimate{Whole: side(0, 4000, 10), Prefill: side(0, 4000, 0), Decode: side(0, 4000, 0)}, true, "split"},
		{"two tokens beside one stream: short", Estimate{Whole: side(0, 2, 1), Prefill: side(0, 2, 0), Decode: side(0, 2, 0)}, false, "short"},
		{"three tokens beside one stream: over the threshold", Estimate{Whole: side(0, 3, 1), Prefill: side(0, 3, 0), Decode: side(0, 3, 0)}, true, "split"},
		{"no stream to protect: whole is as fast without a transfer", Estimate{Whole: side(0, 4000, 0), Prefill: side(0, 4000, 0), Decode: side(0, 4000, 0)}, false, "short"},
		{"a full hit on the whole engine, none elsewhere", Estimate{Whole: side(0, 1, 30), Prefill: side(0, 4000, 0), Decode: side(0, 4000, 0)}, false, "short"},
		{"prefill pool backed up", Estimate{Whole: side(0, 2000, 4), Prefill: side(200000, 2000, 0), Decode: side(0, 2000, 0)}, false, "prefill-busy"},
		{"no prefill engine", Estimate{Whole: side(0, 4000, 10), Decode: side(0, 4000, 0)}, false, "no-prefill"},
		{"no whole engine", Estimate{Prefill: side(0, 4000, 0), Decode: side(0, 4000, 0)}, true, "no-whole"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.e.PrefillSeconds = testP
			ch := Decide(tt.e, testCosts)
			if ch.Split != tt.split || ch.Reason != tt.why {
				t.Errorf("Decide = split %v (%s), whole cost %.6fs, split cost %.6fs; want split %v (%s)",
					ch.Split, ch.Reason, ch.WholeCost, ch.SplitCost, tt.split, tt.why)
			}
		})
	}
}

// TestDecideThreshold checks the threshold moves with the engines' costs,
// not a constant: with equal queues a request is split from u* = (L +
// s_D) / (p - t) uncached tokens, so a slower transfer or a longer decode
// step raises it, a slower prefill lowers it, and a whole engine with no
// stream to stall never gives a request up.
func TestDecideThreshold(t *testing.T) {
	threshold := func(c Costs, p, step float64, streams int64) int64 {
		for u := int64(1); u < 1<<16; u++ {
			dec := side(0, u, 0)
			dec.Step = step
			e := Estimate{Whole: side(0, u, streams), Prefill: side(0, u, 0), Decode: dec, PrefillSeconds: p}
			if Decide(e, c).Split {
				return u
			}
		}
		return -1
	}
	base := threshold(testCosts, testP, 0, 1)
	slowLink := threshold(Costs{TransferLatency: 10 * testCosts.TransferLatency, TransferPerToken: testCosts.TransferPerToken}, testP, 0, 1)
	step := threshold(testCosts, testP, 0.015, 1)
	slowPrefill := threshold(testCosts, 4*testP, 0.015, 1)
	idle := threshold(testCosts, testP, 0, 0)
	// (100e-6 + 0.015) / (40e-6 - 3.3e-6) = 411.4: 412 tokens.
	if step != 412 || !(slowLink > base && step > slowPrefill && slowPrefill > base) || idle != -1 {
		t.Errorf("thresholds: %d tokens (base), %d (ten times the latency), %d (a 15 ms decode step), %d (and a prefill four times slower), %d (no stream); want 412 with the step, slow link > base, step > slow prefill > base, none without a stream",
			base, slowLink, step, slowPrefill, idle)
	}
}

// TestGather checks the estimate is read per role off the router's own
// accounting and prefix index: the least loaded engine of each kind, its
// own uncached tokens.
func TestGather(t *testing.T) {
	f := fleet.New()
	roles := map[string]string{"p0": config.RolePrefill, "p1": config.RolePrefill, "d0": config.RoleDecode, "b0": config.RoleBoth}
	byID := map[int]string{}
	for _, n := range []string{"p0", "p1", "d0", "b0"} {
		b := f.Add(n, nil, nil)
		byID[b.ID] = n
	}
	r := Roles{Of: func(b *fleet.Backend) string { return roles[byID[b.ID]] }}
	s := scheduler.New(f, policy.NewKVRoute(policy.Options{}), scheduler.Config{Filters: []policy.Filter{r}})
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	prompt := strings.Repeat("0123456789abcdef", 400) // 1,600 tokens
	v, perr := request.Parse(request.Completion, []byte(`{"model":"m","prompt":"`+prompt+`","max_tokens":8}`), request.Options{})
	if perr != nil {
		t.Fatal(perr.Message)
	}
	hashes := s.Hashes(v)
	// One prefill engine gets the prompt and holds it, with its prefill
	// queued: as much work as the other's, which holds nothing.
	pre := *v
	pre.Role = RolePrefill
	a, err := s.RouteHashed(&pre, hashes, nil, now)
	if err != nil || byID[a.Backend.ID] != "p0" && byID[a.Backend.ID] != "p1" {
		t.Fatalf("prefill leg on %v (%v)", a, err)
	}
	held := byID[a.Backend.ID]
	e := Gather(s, r, v, hashes, now)
	if !e.Prefill.OK || !e.Decode.OK || !e.Whole.OK {
		t.Fatalf("estimate %+v: want every kind", e)
	}
	if e.Prefill.Queued+e.Prefill.Uncached != int64(v.PromptTokens) {
		t.Errorf("prefill side %+v: want the prompt's work, queued on %s or uncached on the other", e.Prefill, held)
	}
	if e.Whole.Uncached != int64(v.PromptTokens) || e.Decode.Uncached != int64(v.PromptTokens) {
		t.Errorf("whole %+v, decode %+v: want the whole prompt uncached", e.Whole, e.Decode)
	}
	if d := e.PrefillSeconds*float64(fleet.DefaultPrefillRate) - 1; d > 1e-9 || d < -1e-9 {
		t.Errorf("PrefillSeconds %g: want the default rate's", e.PrefillSeconds)
	}
	// Once p1 is loaded more, p0 (holding the prompt) is the pick.
	other := strings.Repeat("zyxw", 8000)
	ov, _ := request.Parse(request.Completion, []byte(`{"model":"m","prompt":"`+other+`"}`), request.Options{})
	ov.Role = RolePrefill
	if _, err := s.Route(ov, []int{a.Backend.ID}, now); err != nil {
		t.Fatal(err)
	}
	e = Gather(s, r, v, hashes, now)
	if e.Prefill.Queued == 0 || e.Prefill.Uncached >= int64(v.PromptTokens) {
		t.Errorf("prefill side %+v: want %s, which holds the prompt", e.Prefill, held)
	}
	if e.Held != int64(v.PromptTokens) {
		t.Errorf("Held %d: want the whole prompt (no decode engine holds it)", e.Held)
	}
	// Once the decode leg went to d0, d0 holds the prompt.
	dec := *v
	dec.Role = RoleDecode
	if _, err := s.RouteHashed(&dec, hashes, nil, now); err != nil {
		t.Fatal(err)
	}
	if e = Gather(s, r, v, hashes, now); e.Held != 0 {
		t.Errorf("Held %d after the decode leg: want 0", e.Held)
	}
}

// TestGatherPricesByTheCostModel: the split decision prices prefill at
// the rate the pick prices the same engines by, their cost models'
// (fleet.Backend.PrefillRate), not a second belief: engines whose
// readings taught their models a prefill four times slower than the
// prior are priced at exactly the models' rate (before, the split read
// the engine-reported rate, else a moving average of TTFTs, beside the
// model the pick read: here 2,500 tokens/s against the model's 2,489).
func TestGatherPricesByTheCostModel(t *testing.T) {
	f := fleet.New()
	roles := map[string]string{"p0": config.RolePrefill, "d0": config.RoleDecode}
	byID := map[int]string{}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, n := range []string{"p0", "d0"} {
		b := f.Add(n, nil, nil)
		byID[b.ID] = n
		for i := range 200 {
			at := now.Add(time.Duration(i-200) * 50 * time.Millisecond)
			// The engine's own prefill counters: 2,500 tokens a second.
			b.Learn(fleet.Reading{State: &fleet.EngineState{At: at}, PrefillTokens: 5000, PrefillSeconds: 2, ComputedTokens: -1})
		}
	}
	r := Roles{Of: func(b *fleet.Backend) string { return roles[byID[b.ID]] }}
	s := scheduler.New(f, policy.NewKVRoute(policy.Options{}), scheduler.Config{Filters: []policy.Filter{r}})
	prompt := strings.Repeat("0123456789abcdef", 400)
	v, perr := request.Parse(request.Completion, []byte(`{"model":"m","prompt":"`+prompt+`","max_tokens":8}`), request.Options{})
	if perr != nil {
		t.Fatal(perr.Message)
	}
	e := Gather(s, r, v, s.Hashes(v), now)
	var logRate float64
	for _, b := range f.Snapshot().All {
		logRate += math.Log(b.PrefillRate(now))
	}
	want := 1 / math.Exp(logRate/2)
	if math.Abs(e.PrefillSeconds/want-1) > 1e-9 {
		t.Errorf("PrefillSeconds %g, want %g (the cost models' rates)", e.PrefillSeconds, want)
	}
	if e.PrefillSeconds < 2/float64(fleet.DefaultPrefillRate) {
		t.Errorf("PrefillSeconds %g: the engines' slow prefill not priced (the prior's is %g)", e.PrefillSeconds, 1/float64(fleet.DefaultPrefillRate))
	}
}
