package policy

import (
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/costmodel"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/request"
)

// fxT0 is the fixtures' clock.
var fxT0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// fxRateSamples is how many samples teach a fixture's rate.
const fxRateSamples = 16.0

// fxPrior is the generic prior scaled to prefill rate tokens a second in
// full chunks.
func fxPrior(rate float64) costmodel.Prior {
	p := costmodel.Generic()
	p.Coeffs = p.Coeffs.Scale(p.Coeffs.ChunkRate(p.Chunk) / rate)
	return p
}

// fxLoad describes one hand-built backend.
type fxLoad struct {
	pending  []int64 // uncached tokens of each request awaiting its first byte
	decoding int     // decoding streams
	ctx      int64   // prompt tokens of each decoding stream
	rate     float64 // learned prefill rate as kvroute weighs it; 0 leaves the prior
	matched  int32   // prefix blocks of the request held
	// kvTokens > 0 gives the backend an engine report: a KV cache of that
	// many tokens, kvUsage of it in use, at kvAt (fxT0 when zero), with
	// the queue the router knows of.
	kvTokens int64
	kvUsage  float64
	kvAt     time.Time
}

// fxBackends builds a fleet whose backends carry the given loads, through
// fleet's own accounting (tickets left open on purpose).
func fxBackends(t testing.TB, loads ...fxLoad) []*fleet.Backend {
	t.Helper()
	f := fleet.New()
	out := make([]*fleet.Backend, len(loads))
	for i, l := range loads {
		b := f.Add(fmt.Sprintf("b%d", i), nil, nil)
		// An engine seen before (a reading of nothing running): the
		// cold-start cap (fleet.Limits.PlausibleSeqs) is not the subject.
		b.ObserveRunning(0, 0, -1)
		if l.rate > 0 {
			// fxRateSamples observed TTFTs on an idle backend at l.rate
			// (for the policies that read the learned rate), and a cost
			// model that prefills l.rate tokens a second in full chunks.
			const work = 100000
			for range int(fxRateSamples) {
				tk := b.Start(work, work, 0, fxT0)
				tk.FirstByte(fxT0.Add(time.Duration(float64(work) / l.rate * float64(time.Second))))
				tk.Done(fxT0)
			}
			b.SetCostModel(costmodel.Frozen(fxPrior(l.rate)))
		}
		// Decoding streams first, with no queued work, so that their instant
		// first byte teaches no rate.
		for range l.decoding {
			b.Start(l.ctx, 0, 100, fxT0).FirstByte(fxT0)
		}
		for _, p := range l.pending {
			b.Start(p, p, 100, fxT0)
		}
		if l.kvTokens > 0 {
			at := l.kvAt
			if at.IsZero() {
				at = fxT0
			}
			b.SetEngine(&fleet.EngineState{At: at, Running: l.decoding, Waiting: len(l.pending),
				KVUsage: l.kvUsage, KVBlocks: int(l.kvTokens / 16), BlockSize: 16})
		}
		out[i] = b
	}
	return out
}

// fxInput is an Input over cands for a prompt of promptTokens tokens.
func fxInput(cands []*fleet.Backend, loads []fxLoad, promptTokens int, session string) *Input {
	m := make([]int32, len(cands))
	for i := range loads {
		m[i] = loads[i].matched
	}
	return fxTokens(&Input{
		View:        &request.View{PromptTokens: promptTokens, SessionKey: session},
		BlockChars:  64,
		Candidates:  cands,
		Matched:     m,
		Now:         fxT0,
		SessionHash: HashSession(session),
	})
}

// fxTokens sets in.Cached and in.Uncached from in.Matched as the scheduler
// does (blocks of in.BlockChars characters, request.BytesPerToken a token,
// at most the prompt); call it again after changing Matched.
func fxTokens(in *Input) *Input {
	prompt := int64(0)
	if in.View != nil {
		prompt = int64(in.View.PromptTokens)
	}
	in.Cached, in.Uncached = make([]int64, len(in.Matched)), make([]int64, len(in.Matched))
	for i, m := range in.Matched {
		in.Cached[i] = min(prompt, int64(m)*int64(in.BlockChars)/request.BytesPerToken)
		in.Uncached[i] = prompt - in.Cached[i]
	}
	return in
}

// fxNew returns a fresh instance of a registered policy.
func fxNew(t testing.TB, name string, o Options) Policy {
	t.Helper()
	p, err := New(name, o)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestKVRoutePick(t *testing.T) {
	const prompt = 8000 // tokens; 500 blocks of 16 tokens
	tests := []struct {
		name  string
		loads []fxLoad
		want  int
		note  string
	}{
		{"prefers the cached backend when loads are equal",
			[]fxLoad{{}, {matched: 400}, {matched: 100}}, 1, "cache"},
		{"avoids a prefix holder whose queue outweighs the saved prefill",
			[]fxLoad{{matched: 500, pending: []int64{30000, 30000}}, {}}, 1, "load"},
		{"keeps the prefix holder when its queue costs less than the prefill saved",
			[]fxLoad{{matched: 500, pending: []int64{3000}}, {}}, 0, "cache"},
		{"prefers a rate far above the fleet's",
			// Fleet (geometric mean) 10.6k: 40k is 3.8x above, beyond RateTrust.
			[]fxLoad{{rate: 3000}, {rate: 40000}, {rate: 10000}}, 1, "load"},
		{"ignores learned rates within RateTrust of the fleet's",
			// Noise between identical engines: the fast-looking one holds
			// more work and loses.
			[]fxLoad{{rate: 35000, pending: []int64{3000}}, {rate: 16000}, {rate: 23000, pending: []int64{1000}}}, 1, "load"},
		{"a backlogged fleet keeps a request with the holder of its prefix",
			// 12 requests wait on backend 0 (mean 6 per backend): the 12,000
			// queued tokens there beat recomputing 8,000 on the idle one.
			[]fxLoad{{matched: 500, pending: []int64{1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000}}, {}}, 0, "cache"},
		{"a modest backlog keeps a prefix holder queued three prompts deep",
			// 3 requests of 8,000 tokens wait on backend 0 (mean 1.5 per
			// backend, 0.5 beyond FreeWaiters): 24,001 tokens there against
			// 8,000 recomputed at a charge of 6 x 0.5 = 3 more times each.
			[]fxLoad{{matched: 500, pending: []int64{8000, 8000, 8000}}, {}}, 0, "cache"},
		{"a fleet that is not backlogged sends it to the idle backend",
			// The same queued tokens in one request: no backlog, pure TTFT.
			[]fxLoad{{matched: 500, pending: []int64{12000}}, {}}, 1, "load"},
		{"a slow backend's cache still wins when it saves enough",
			[]fxLoad{{rate: 5000, matched: 500}, {rate: 20000}}, 0, "cache"},
		{"penalises a big decoding batch",
			[]fxLoad{{decoding: 200, ctx: 4000}, {decoding: 10, ctx: 4000}, {decoding: 100, ctx: 4000}}, 1, "load"},
		{"counts queued prefill across backends",
			[]fxLoad{{pending: []int64{9000}}, {pending: []int64{2000, 2000}}, {pending: []int64{6000}}}, 1, "load"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { checkKVRoutePicks(t, tc.loads, prompt, tc.want, tc.note) })
	}
}

// checkKVRoutePicks checks that kvroute picks want with note for a prompt
// without a session key over the given loads, from every rotation of the
// tie-break start, with a positive estimate.
func checkKVRoutePicks(t *testing.T, loads []fxLoad, prompt, want int, note string) {
	t.Helper()
	cands := fxBackends(t, loads...)
	p := fxNew(t, "kvroute", Options{})
	for range len(cands) {
		d := p.Pick(fxInput(cands, loads, prompt, ""))
		if d.Index != want || d.Note != note {
			t.Fatalf("picked %d (%q, est %.4fs), want %d (%q)", d.Index, d.Note, d.EstTTFT, want, note)
		}
		if d.EstTTFT <= 0 {
			t.Fatalf("EstTTFT = %v, want > 0", d.EstTTFT)
		}
	}
}

func TestKVRouteCacheSticky(t *testing.T) {
	// A 20,000-token prompt without a session key; one request waits on the
	// holder, so the fleet is not backlogged and the score is the estimate.
	const prompt = 20000
	tests := []struct {
		name  string
		loads []fxLoad
		want  int
		note  string
	}{
		{"stays with a holder a chunk ahead within the ratio",
			// 16,000 cached tokens; est 34,000 against the idle one's 20,000 (1.7x).
			[]fxLoad{{matched: 1000, pending: []int64{30000}}, {}}, 0, "cache"},
		{"leaves a holder beyond the ratio",
			// 74,000 against 20,000: 3.7x.
			[]fxLoad{{matched: 1000, pending: []int64{70000}}, {}}, 1, "load"},
		{"leaves a holder less than a chunk ahead",
			// 8,000 cached tokens: the estimate decides (27,000 against 20,000).
			[]fxLoad{{matched: 500, pending: []int64{15000}}, {}}, 1, "load"},
		{"measures the lead against the best candidate's own match",
			// 16,000 against 9,600 cached: 6,400 tokens ahead, under a chunk.
			[]fxLoad{{matched: 1000, pending: []int64{30000}}, {matched: 600}}, 1, "load"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { checkKVRoutePicks(t, tc.loads, prompt, tc.want, tc.note) })
	}
}

func TestKVRouteFit(t *testing.T) {
	// A cold 20,000-token prompt; engines of 100,000 KV tokens.
	const prompt, kv = 20000, 100000
	full := fxLoad{kvTokens: kv, kvUsage: 0.99}
	tests := []struct {
		name  string
		loads []fxLoad
		want  int
	}{
		{"leaves a full engine for one with room within the ratio",
			// est 23,000 against 20,000 (1.15x); 1,000 tokens free on the idle one.
			[]fxLoad{full, {pending: []int64{3000}, kvTokens: kv, kvUsage: 0.5}}, 1},
		{"stays when room costs beyond the ratio",
			// 25,000 against 20,000 (1.25x).
			[]fxLoad{full, {pending: []int64{5000}, kvTokens: kv, kvUsage: 0.5}}, 0},
		{"counts the prompts routed and not started against the free space",
			// b0: 25,000 free less 10,000 queued; b1 est 34,000 against 30,000 (1.13x).
			[]fxLoad{{pending: []int64{10000}, kvTokens: kv, kvUsage: 0.75},
				{pending: []int64{14000}, kvTokens: kv}}, 1},
		{"takes the best-scored of the candidates with room",
			// b1 1.15x, b2 1.1x with 30,000 free.
			[]fxLoad{full, {pending: []int64{3000}, kvTokens: kv, kvUsage: 0.5},
				{pending: []int64{2000}, kvTokens: kv, kvUsage: 0.7}}, 2},
		{"trusts an engine without a report",
			[]fxLoad{{}, {pending: []int64{5000}, kvTokens: kv}}, 0},
		{"ignores a stale report",
			[]fxLoad{{kvTokens: kv, kvUsage: 0.99, kvAt: fxT0.Add(-EngineStateMaxAge - time.Second)},
				{pending: []int64{5000}, kvTokens: kv}}, 0},
		{"stays when no candidate has room",
			[]fxLoad{full, {pending: []int64{5000}, kvTokens: kv, kvUsage: 0.9}}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { checkKVRoutePicks(t, tc.loads, prompt, tc.want, "load") })
	}
}

func TestKVRouteEstimateByHand(t *testing.T) {
	loads := []fxLoad{{pending: []int64{2000}, decoding: 2, ctx: 1000, matched: 100, rate: 20000}}
	cands := fxBackends(t, loads...)
	// The rate is taught through nanosecond TTFTs: equal to 1e-9.
	d := fxNew(t, "kvroute", Options{}).Pick(fxInput(cands, loads, 4000, ""))
	// uncached = 4000 - 100 blocks * 64 chars / 4 = 2400 after 1,600
	// cached; work = 2000 + 2400; one step, which runs 2 decoding streams
	// over 2,000 tokens of context.
	co := fxPrior(20000).Coeffs // one backend: the fleet's coefficients are its own
	want := co.Step + 2*co.Seq + 2000*co.Ctx + 4400*co.Token + co.Attn*costmodel.AttnPairs(2400, 1600)
	if math.Abs(d.EstTTFT-want) > want*1e-9 {
		t.Fatalf("EstTTFT = %v, want %v", d.EstTTFT, want)
	}
	// A prompt shorter than its match clamps uncached at the one token the
	// engine always recomputes rather than crediting negative work.
	d = fxNew(t, "kvroute", Options{}).Pick(fxInput(cands, loads, 1000, ""))
	want = co.Step + 2*co.Seq + 2000*co.Ctx + 2001*co.Token + co.Attn*costmodel.AttnPairs(1, 1000)
	if math.Abs(d.EstTTFT-want) > want*1e-9 {
		t.Fatalf("short prompt: EstTTFT = %v, want %v", d.EstTTFT, want)
	}
}

func TestKVRouteChunkedSteps(t *testing.T) {
	// With decoders present, a prefill spanning more chunks pays the batch's
	// step cost more often.
	loads := []fxLoad{{decoding: 50, ctx: 8000}}
	cands := fxBackends(t, loads...)
	p := fxNew(t, "kvroute", Options{})
	co, chunk := costmodel.Generic().Coeffs, costmodel.GenericChunk
	for _, prompt := range []int{100, chunk, chunk + 1, 5 * chunk} {
		steps := max((prompt+chunk-1)/chunk, 1)
		want := float64(steps)*(co.Step+50*co.Seq+50*8000*co.Ctx) + float64(prompt)*co.Token + co.Attn*costmodel.AttnPairs(int64(prompt), 0)
		if d := p.Pick(fxInput(cands, loads, prompt, "")); math.Abs(d.EstTTFT-want) > 1e-9 {
			t.Errorf("prompt %d: EstTTFT = %v, want %v", prompt, d.EstTTFT, want)
		}
	}
}

func TestKVRouteEngineState(t *testing.T) {
	// Backend 1 carries a little of the router's own work, so backend 0
	// wins unless its engine reports work the router did not route.
	loads := []fxLoad{{}, {pending: []int64{300}}}
	tests := []struct {
		name  string
		state *fleet.EngineState
		want  int
	}{
		{"fresh report of foreign queued work steers away", &fleet.EngineState{At: fxT0, Waiting: 20}, 1},
		{"fresh report of foreign running streams steers away", &fleet.EngineState{At: fxT0, Running: 300}, 1},
		{"stale report is ignored", &fleet.EngineState{At: fxT0.Add(-time.Minute), Waiting: 20, Running: 300}, 0},
		{"report of only our own work changes nothing", &fleet.EngineState{At: fxT0}, 0},
		// A field the engine does not report is unknown, not a value.
		{"unreported queue is not read", &fleet.EngineState{At: fxT0, Waiting: 20, Running: 300,
			Missing: fleet.EngineWaiting | fleet.EngineRunning}, 0},
		// Sums over the engine's numbers saturate: a queue of 1e17 times
		// the mean prompt wrapped negative and drew every request.
		{"a queue past int64 sums steers away", &fleet.EngineState{At: fxT0, Waiting: 1e17}, 1},
		{"running past int64 sums steers away", &fleet.EngineState{At: fxT0, Running: 1e17}, 1},
		{"the largest ints steer away", &fleet.EngineState{At: fxT0, Waiting: math.MaxInt, Running: math.MaxInt}, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cands := fxBackends(t, loads...)
			cands[0].SetEngine(tc.state)
			p := fxNew(t, "kvroute", Options{})
			in := fxInput(cands, loads, 2000, "")
			for range 4 {
				if d := p.Pick(in); d.Index != tc.want {
					t.Fatalf("picked %d, want %d", d.Index, tc.want)
				}
			}
		})
	}
	// Requests the router routed itself and that wait in the engine's queue
	// are not counted twice.
	own := []fxLoad{{pending: []int64{500, 500, 500}}, {pending: []int64{500, 500, 500}}}
	cands := fxBackends(t, own...)
	cands[0].SetEngine(&fleet.EngineState{At: fxT0, Waiting: 3})
	p := fxNew(t, "kvroute", Options{})
	a, b := p.Pick(fxInput(cands[:1], own[:1], 2000, "")), p.Pick(fxInput(cands[1:], own[1:], 2000, ""))
	if a.EstTTFT != b.EstTTFT {
		t.Fatalf("own waiting requests counted twice: est %v with report, %v without", a.EstTTFT, b.EstTTFT)
	}
}

func TestKVRouteSession(t *testing.T) {
	const prompt = 8000
	t.Run("remembers where the conversation went", func(t *testing.T) {
		loads := []fxLoad{{}, {}, {}, {}}
		cands := fxBackends(t, loads...)
		p := fxNew(t, "kvroute", Options{}).(*KVRoute)
		in := fxInput(cands, loads, prompt, "conv-1")
		first := p.Pick(in)
		p.Routed(in, first)
		for range 8 {
			if d := p.Pick(in); d.Index != first.Index || d.Note != "sticky" {
				t.Fatalf("picked %d (%q), want sticky %d", d.Index, d.Note, first.Index)
			}
		}
		// Another conversation is not pulled along by the rotation.
		other := fxInput(cands, loads, prompt, "conv-2")
		seen := map[int]bool{}
		for range 4 {
			seen[p.Pick(other).Index] = true
		}
		if len(seen) < 2 {
			t.Fatalf("unrouted conversation always went to %v: tie-break does not rotate", seen)
		}
	})
	t.Run("stays with a modestly busier holder", func(t *testing.T) {
		// The holder's estimate is worse than the idle backend's but within
		// the affinity bound.
		loads := []fxLoad{{}, {pending: []int64{500}}}
		cands := fxBackends(t, loads...)
		p := fxNew(t, "kvroute", Options{}).(*KVRoute)
		in := fxInput(cands, loads, prompt, "conv-1")
		p.Routed(in, Decision{Index: 1})
		if d := p.Pick(in); d.Index != 1 || d.Note != "sticky" {
			t.Fatalf("picked %d (%q), want sticky 1", d.Index, d.Note)
		}
		// Without the session key the same request goes to the idle one.
		if d := p.Pick(fxInput(cands, loads, prompt, "")); d.Index != 0 {
			t.Fatalf("unkeyed request picked %d, want 0", d.Index)
		}
	})
	t.Run("short requests pay at most the ratio to stay home", func(t *testing.T) {
		// 200-token turns at the generic prior (a 15 ms step, about 0.1 ms
		// a token): every estimate is tens of milliseconds, where a fixed
		// slack of the same size would keep a conversation home at any
		// ratio. 1.2x of the idle backend's 35 ms, plus the 2 ms slack, is
		// about 90 queued tokens.
		for _, tc := range []struct {
			queued int64
			want   string
		}{{30, "sticky"}, {150, "spill"}, {400, "spill"}} {
			loads := []fxLoad{{}, {pending: []int64{tc.queued}}}
			cands := fxBackends(t, loads...)
			p := fxNew(t, "kvroute", Options{}).(*KVRoute)
			in := fxInput(cands, loads, 200, "conv-1")
			p.Routed(in, Decision{Index: 1})
			d := p.Pick(in)
			if d.Note != tc.want || (d.Index == 1) != (tc.want == "sticky") {
				t.Errorf("holder with %d queued tokens: picked %d (%q), want %q", tc.queued, d.Index, d.Note, tc.want)
			}
		}
	})
	t.Run("the longest match is the holder", func(t *testing.T) {
		loads := []fxLoad{{matched: 10, pending: []int64{6000}}, {matched: 300, pending: []int64{6000}}, {}}
		cands := fxBackends(t, loads...)
		p := fxNew(t, "kvroute", Options{})
		// est: holder 1 (6000+3200)/R, idle 2 8000/R: within the ratio.
		if d := p.Pick(fxInput(cands, loads, prompt, "conv-1")); d.Index != 1 || d.Note != "sticky" {
			t.Fatalf("picked %d (%q), want sticky 1", d.Index, d.Note)
		}
		if d := p.Pick(fxInput(cands, loads, prompt, "")); d.Index != 2 {
			t.Fatalf("unkeyed request picked %d, want the idle 2", d.Index)
		}
	})
	t.Run("spills when the holder's queue is too long", func(t *testing.T) {
		loads := []fxLoad{{matched: 500, pending: []int64{40000}}, {}}
		cands := fxBackends(t, loads...)
		p := fxNew(t, "kvroute", Options{})
		if d := p.Pick(fxInput(cands, loads, prompt, "conv-1")); d.Index != 1 || d.Note != "spill" {
			t.Fatalf("picked %d (%q), want spill to 1", d.Index, d.Note)
		}
	})
	t.Run("a hot key spills past the in-flight bound", func(t *testing.T) {
		// One key on many cheap, unrelated requests (a client that sends
		// the same session header for everything): the time bound alone
		// would keep them all on the last backend, the CHWBL bound on
		// in-flight requests does not.
		for _, tc := range []struct {
			inflight int
			want     string
		}{{0, "sticky"}, {1, "sticky"}, {2, "spill"}, {6, "spill"}} {
			loads := []fxLoad{{pending: make([]int64, tc.inflight)}, {}, {}, {}}
			for i := range loads[0].pending {
				loads[0].pending[i] = 1
			}
			cands := fxBackends(t, loads...)
			p := fxNew(t, "kvroute", Options{}).(*KVRoute)
			in := fxInput(cands, loads, 200, "hot")
			p.Routed(in, Decision{Index: 0})
			d := p.Pick(in)
			if d.Note != tc.want || (d.Index == 0) != (tc.want == "sticky") {
				t.Errorf("%d in flight: picked %d (%q), want %q", tc.inflight, d.Index, d.Note, tc.want)
			}
		}
	})
}

func TestKVRouteSessionTable(t *testing.T) {
	var tab Sessions
	for _, id := range []int{0, 1, 7, 1 << 24} {
		h := uint64(0xdeadbeefcafe1234) + uint64(id)
		tab.Routed(h, id, 1, 0)
		if got, c := tab.Lookup(h); got != id || c != (Claim{Session: h, At: 1}) {
			t.Errorf("id %d: lookup = %d, %+v", id, got, c)
		}
		// Same slot, different key: a collision, not a hit.
		if got, _ := tab.Lookup(h ^ 1<<40); got != -1 {
			t.Errorf("id %d: colliding key found %d", id, got)
		}
	}
	if got, _ := tab.Lookup(42); got != -1 {
		t.Errorf("empty slot: lookup = %d", got)
	}
	if got, _ := tab.Lookup(0); got != -1 {
		t.Errorf("no key: lookup = %d", got)
	}
}

// TestSessionClaims: a routing that follows a conversation's home makes
// no claim, one that takes it elsewhere makes a move (one epoch more); a
// peer's claim replaces the table's only if it wins.
func TestSessionClaims(t *testing.T) {
	const h = 0xabcdef
	var tab Sessions
	tab.Routed(h, 3, 100, 7)
	tab.Routed(h, 3, 200, 8) // follows: nothing changes
	if id, c := tab.Lookup(h); id != 3 || c != (Claim{Session: h, Epoch: 0, At: 100, By: 7}) {
		t.Fatalf("after following: %d %+v", id, c)
	}
	tab.Routed(h, 5, 300, 7)
	if id, c := tab.Lookup(h); id != 5 || c != (Claim{Session: h, Epoch: 1, At: 300, By: 7}) {
		t.Fatalf("after a move: %d %+v", id, c)
	}
	for _, tc := range []struct {
		name string
		c    Claim
		id   int
		want int
	}{
		{"an older epoch loses", Claim{Session: h, Epoch: 0, At: 1, By: 1}, 9, 5},
		{"the same epoch, later, loses", Claim{Session: h, Epoch: 1, At: 301, By: 1}, 9, 5},
		{"the same epoch, same time, higher replica, loses", Claim{Session: h, Epoch: 1, At: 300, By: 8}, 9, 5},
		{"the same epoch, earlier, wins", Claim{Session: h, Epoch: 1, At: 299, By: 9}, 2, 2},
		{"a later move wins", Claim{Session: h, Epoch: 2, At: 1000, By: 1}, 4, 4},
		{"no session: ignored", Claim{Epoch: 9}, 6, 4},
	} {
		tab.Learn(tc.c, tc.id)
		if id, _ := tab.Lookup(h); id != tc.want {
			t.Errorf("%s: home %d, want %d", tc.name, id, tc.want)
		}
	}
}

// TestSessionClaimsMergeInAnyOrder: replicas that hear the same claims in
// different orders hold the same home for the conversation.
func TestSessionClaimsMergeInAnyOrder(t *testing.T) {
	const h = 0x5e55
	claims := []struct {
		c  Claim
		id int
	}{
		{Claim{Session: h, Epoch: 0, At: 10, By: 2}, 0},
		{Claim{Session: h, Epoch: 0, At: 10, By: 1}, 1},
		{Claim{Session: h, Epoch: 1, At: 50, By: 3}, 2},
		{Claim{Session: h, Epoch: 1, At: 40, By: 2}, 3},
		{Claim{Session: h, Epoch: 0, At: 5, By: 3}, 4},
	}
	want := -1
	for perm := range 120 { // every order of the five
		order := []int{0, 1, 2, 3, 4}
		for k, p := 0, perm; k < len(order); k++ {
			j := k + p%(len(order)-k)
			p /= len(order) - k
			order[k], order[j] = order[j], order[k]
		}
		var tab Sessions
		for _, k := range order {
			tab.Learn(claims[k].c, claims[k].id)
		}
		got, _ := tab.Lookup(h)
		if want < 0 {
			want = got
		}
		if got != want || got != 3 {
			t.Fatalf("order %v: home %d, want 3 (epoch 1, the earlier claim) in every order", order, got)
		}
	}
}

// ownPolicies are the policies of this file set; BenchmarkPick covers each.
var ownPolicies = []string{"round-robin", "random", "least-request", "power-of-two", "session-hash", "prefix", "kvroute"}

// BenchmarkPick is one pick over 64 loaded backends for a 32,000-character
// prompt (500 blocks of 64), matched to various depths.
func BenchmarkPick(b *testing.B) {
	const n = 64
	loads := make([]fxLoad, n)
	for i := range loads {
		loads[i] = fxLoad{
			matched:  int32(i*37) % 501,
			decoding: i % 7,
			ctx:      3000,
			pending:  make([]int64, i%3),
			rate:     float64(8000 + 500*(i%5)),
		}
		for j := range loads[i].pending {
			loads[i].pending[j] = int64(1000 * (j + 1))
		}
	}
	cands := fxBackends(b, loads...)
	cands[5].SetEngine(&fleet.EngineState{At: fxT0, Waiting: 4, Running: 9})
	for _, name := range ownPolicies {
		b.Run(name, func(b *testing.B) {
			p := fxNew(b, name, Options{Seed: 1})
			in := fxInput(cands, loads, 32000/request.BytesPerToken, "conversation-42")
			in.Hashes = make([]uint64, 500)
			p.Pick(in) // builds session-hash's ring
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				p.Pick(in)
			}
		})
	}
}

// TestPickConcurrent runs every policy here from several goroutines at once
// (with -race, this checks that the shared counters, the session ring and
// kvroute's session table are safe for concurrent use).
func TestPickConcurrent(t *testing.T) {
	loads := fxInFlight(0, 1, 2, 3, 4)
	cands := fxBackends(t, loads...)
	for _, name := range ownPolicies {
		p := fxNew(t, name, Options{Seed: 2})
		obs, _ := p.(Observer)
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Go(func() {
				for k := range 300 {
					in := fxInput(cands, loads, 500, fmt.Sprint("s", (g*7+k)%11))
					if k%2 == 0 {
						in = fxInput(cands[k%3:], loads[k%3:], 500, in.View.SessionKey)
					}
					d := p.Pick(in)
					if d.Index < 0 || d.Index >= len(in.Candidates) {
						t.Errorf("%s: index %d of %d", name, d.Index, len(in.Candidates))
						return
					}
					if obs != nil {
						obs.Routed(in, d)
					}
				}
			})
		}
		wg.Wait()
	}
}

func TestKVRouteTrustedRate(t *testing.T) {
	tests := []struct{ own, want float64 }{
		{10000, 10000},
		{29000, 10000},
		{3500, 10000},
		{30000, 10000},
		{60000, 20000},
		{2000, 6000},
		// RateCap: at most 3x the fleet's either way.
		{90000, 30000},
		{2e6, 30000},
		{1000, 10000.0 / 3},
		{100, 10000.0 / 3},
	}
	for _, tc := range tests {
		if got := trustedRate(tc.own, 10000); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("trustedRate(%v, 10000) = %v, want %v", tc.own, got, tc.want)
		}
	}
}

func TestKVRouteMissCost(t *testing.T) {
	// EstTTFT stays this request's TTFT estimate; the fleet's share of the
	// recomputation only ranks.
	loads := []fxLoad{{matched: 500, pending: []int64{1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000}}, {}}
	cands := fxBackends(t, loads...)
	d := fxNew(t, "kvroute", Options{}).Pick(fxInput(cands, loads, 8000, ""))
	// 12,000 queued tokens plus the one recomputed after 8,000 cached, in
	// two steps, no decoding batch.
	want := costmodel.Generic().Prefill(12001, 1, 8000, costmodel.GenericChunk, 0, 0)
	if d.Index != 0 || math.Abs(d.EstTTFT-want) > 1e-12 {
		t.Fatalf("picked %d est %v, want 0 est %v", d.Index, d.EstTTFT, want)
	}
}

func TestKVRouteLearnedRateWeighsEvidence(t *testing.T) {
	// One backend, taught samples of 2,000 tokens in 1 ms: a server whose
	// TTFT does not grow with the prompt. One sample leaves it within
	// RateTrust of the prior (so idle backends still tie and prompts
	// spread); a dozen move it beyond.
	rate := func(samples int) float64 {
		b := fleet.New().Add("b", nil, nil)
		for range samples {
			tk := b.Start(2000, 2000, 1, fxT0)
			tk.FirstByte(fxT0.Add(time.Millisecond))
			tk.Done(fxT0)
		}
		return b.Cost().Coeffs(fxT0.Add(time.Millisecond)).ChunkRate(b.Chunk())
	}
	prior := costmodel.Generic().ChunkRate(costmodel.GenericChunk)
	if r := rate(0); r != prior {
		t.Errorf("no sample: %v tokens/s, want the prior's %v", r, prior)
	}
	if r := rate(1); r <= prior || r >= RateTrust*prior {
		t.Errorf("one sample: %v tokens/s, want above the prior's %v and within RateTrust", r, prior)
	}
	if r := rate(12); r <= RateTrust*prior {
		t.Errorf("12 samples: %v tokens/s, want beyond RateTrust of the prior's %v", r, prior)
	}
}

// TestKVRouteSpreadThenStick replays, on a hand-built fleet of three idle
// backends, four unrelated prompts of 2,000 tokens sent one after another,
// each followed by five questions on it (no session key): backend 0 answers
// every first byte in 1 ms whatever the prompt, the others prefill at
// 100k tokens/s. The prompts must use all three backends, and the questions
// stay with their prompt.
func TestKVRouteSpreadThenStick(t *testing.T) {
	const prompt, question, blockChars = 2000, 20, 64
	blocks := int32(prompt * request.BytesPerToken / blockChars)
	cands := fxBackends(t, fxLoad{}, fxLoad{}, fxLoad{})
	p := fxNew(t, "kvroute", Options{})
	now := fxT0
	// holds[i] lists the prompts backend i holds.
	holds := make([]map[int]bool, len(cands))
	for i := range holds {
		holds[i] = map[int]bool{}
	}
	route := func(doc, tokens int) int {
		in := fxInput(cands, make([]fxLoad, len(cands)), tokens, "")
		in.Now = now
		for i := range cands {
			if holds[i][doc] {
				in.Matched[i] = blocks
				fxTokens(in)
			}
		}
		d := p.Pick(in)
		i := d.Index
		uncached := int64(tokens)
		if holds[i][doc] {
			uncached = question
		}
		ttft := time.Millisecond
		if i > 0 {
			ttft = time.Duration(float64(uncached) / 100000 * float64(time.Second))
		}
		tk := cands[i].Start(int64(tokens), uncached, 16, now)
		now = now.Add(ttft)
		tk.FirstByte(now)
		now = now.Add(10 * time.Millisecond)
		tk.Done(now)
		holds[i][doc] = true
		return i
	}
	used := map[int]bool{}
	for doc := range 4 {
		home := route(doc, prompt)
		used[home] = true
		for q := range 5 {
			if got := route(doc, prompt+question); got != home {
				t.Errorf("prompt %d question %d went to %d, the prompt to %d", doc, q, got, home)
			}
		}
	}
	if len(used) != 3 {
		t.Errorf("four unrelated prompts used backends %v, want all three", used)
	}
}

func TestKVRouteTieGoesToEmptierCache(t *testing.T) {
	// Idle and equal but for what each has written into its cache.
	cands := fxBackends(t, fxLoad{}, fxLoad{}, fxLoad{})
	for i, tokens := range []int64{5000, 100, 3000} {
		cands[i].Start(tokens, tokens, 0, fxT0).Done(fxT0)
	}
	p := fxNew(t, "kvroute", Options{})
	for range len(cands) {
		if d := p.Pick(fxInput(cands, make([]fxLoad, 3), 2000, "")); d.Index != 1 {
			t.Fatalf("picked %d (%q), want 1, the emptiest cache", d.Index, d.Note)
		}
	}
}

// The engine's own prefill throughput, when it reports one, teaches its
// cost model: a backend whose engine says it prefills 500 tokens/s
// (twenty times slower than the prior, beyond the trust band) loses a
// cold prompt to an idle peer at the prior.
func TestKVRouteEngineReportedRate(t *testing.T) {
	cands := fxBackends(t, fxLoad{}, fxLoad{})
	for i := range 20 {
		cands[0].Learn(fleet.Reading{State: &fleet.EngineState{At: fxT0.Add(time.Duration(i) * time.Millisecond)},
			PrefillTokens: 8000, PrefillSeconds: 16})
	}
	in := fxInput(cands, make([]fxLoad, 2), 2000, "")
	in.Now = fxT0.Add(20 * time.Millisecond)
	if d := fxNew(t, "kvroute", Options{}).Pick(in); d.Index != 1 {
		t.Fatalf("picked %d (%q), want 1, the engine at the prior", d.Index, d.Note)
	}
}

func TestKVRouteReplicaSkew(t *testing.T) {
	const n = 8
	loads := make([]fxLoad, n)
	// Nearly equal queues (within ReplicaSkew of each other): one router
	// picks the shortest, backend 3.
	for i := range loads {
		loads[i].pending = []int64{20000 + int64(i*37%n)*200}
	}
	loads[3].pending = []int64{19000}
	cands := fxBackends(t, loads...)
	cachedLoads := append([]fxLoad(nil), loads...)
	cachedLoads[5].pending = []int64{loads[5].pending[0] + 2*costmodel.GenericChunk}
	cachedCands := fxBackends(t, cachedLoads...)

	pick := func(replicas, rank int, burst bool, matched int32) int {
		in := fxInput(cands, loads, 2000, "")
		if matched > 0 {
			// The prompt holds the cached prefix and 2000 tokens more;
			// backend 5's queue is as much longer as the others' prefill
			// of that prefix, so that the skew alone would send it
			// elsewhere from some replicas.
			in = fxInput(cachedCands, cachedLoads, int(matched)*16+2000, "")
			in.Matched[5] = matched
			fxTokens(in)
		}
		in.Replicas, in.Burst = replicas, burst
		if replicas > 1 {
			in.ReplicaArc = float64(rank) / float64(replicas)
		}
		return fxNew(t, "kvroute", Options{}).Pick(in).Index
	}
	if got := pick(1, 0, false, 0); got != 3 {
		t.Fatalf("one router picked %d, want 3 (the shortest queue)", got)
	}
	// Outside a burst, every replica picks as one router does.
	for rank := range 4 {
		if got := pick(4, rank, false, 0); got != 3 {
			t.Errorf("replica %d of 4 outside a burst picked %d, want 3", rank, got)
		}
	}
	for _, replicas := range []int{2, 4} {
		seen := map[int]bool{}
		for rank := range replicas {
			seen[pick(replicas, rank, true, 0)] = true
		}
		if len(seen) < replicas {
			t.Errorf("%d replicas picked %d distinct backends (%v), want %d", replicas, len(seen), seen, replicas)
		}
	}
	// A cached prefix of two prefill chunks on backend 5 keeps the prompt
	// there from every replica (the rule weighs unskewed scores).
	for rank := range 4 {
		if got := pick(4, rank, true, int32(2*costmodel.GenericChunk/16)); got != 5 {
			t.Errorf("replica %d of 4 picked %d for a prompt cached on 5, want 5", rank, got)
		}
	}
}

// TestKVRouteReplicasAgreeOnHolder: three replicas over the same fleet
// account the same requests (each its own, the others' as peer load) but
// differ in what each learns alone: the load it presumes of its peers
// after a routing of its own, the prefill rates it learned, the engine
// report it scraped last. A conversation's next turn, whichever replica
// takes it, stays on its holder or leaves it for the same backend.
func TestKVRouteReplicasAgreeOnHolder(t *testing.T) {
	const turn = 200 // tokens: a chat turn, estimates of tens of milliseconds
	for _, tc := range []struct {
		name    string
		pending [2]int64 // tokens queued on the holder (backend 0) and on backend 1
	}{
		{"holder modestly busier", [2]int64{30, 0}},
		{"holder near the bound", [2]int64{60, 0}},
		{"holder just beyond the bound", [2]int64{100, 0}},
		{"holder well beyond the bound", [2]int64{400, 0}},
		{"the other backend busier", [2]int64{40, 300}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			picks := map[int]int{}
			for r := range 3 {
				cands := replicaView(r, tc.pending[:], turn)
				p := fxNew(t, "kvroute", Options{}).(*KVRoute)
				in := fxInput(cands, make([]fxLoad, 3), turn, "conv")
				p.LearnSession(Claim{Session: in.SessionHash}, cands[0].ID)
				in.Replicas, in.ReplicaArc = 3, float64(r)/3
				d := p.Pick(in)
				t.Logf("replica %d: %s (%s, est %.4f s)", r, cands[d.Index].Name, d.Note, d.EstTTFT)
				picks[d.Index]++
			}
			if len(picks) != 1 {
				t.Errorf("the three replicas sent the turn to %d different backends: %v", len(picks), picks)
			}
		})
	}
}

// replicaView is replica r's view of three backends b0-b2 with pending
// prefill tokens queued on each (0: none), as the replica-agreement tests
// give it: replica 0 routed the queued requests, the others hear of them
// as its peers; replica 1 has just routed a turn-sized request of its own
// to b1 and presumes its two peers did alike; replica 2 learned that b0 is
// fast (its own streams there) and scraped a queue on b2.
func replicaView(r int, pending []int64, turn int64) []*fleet.Backend {
	f := fleet.New()
	cands := []*fleet.Backend{f.Add("b0", nil, nil), f.Add("b1", nil, nil), f.Add("b2", nil, nil)}
	for _, b := range cands {
		b.ObserveRunning(0, 0, -1) // seen before: no cold-start cap
	}
	for i, p := range pending {
		if p == 0 {
			continue
		}
		if r == 0 {
			cands[i].Start(p, p, 100, fxT0)
		} else {
			cands[i].AddPeerLoad(fleet.Load{InFlight: 1, PendingPrefill: p})
		}
	}
	switch r {
	case 1:
		cands[1].AddPresumedLoad(fleet.Load{InFlight: 2, PendingPrefill: 2 * turn})
	case 2:
		for range int(fxRateSamples) {
			tk := cands[0].Start(100000, 100000, 0, fxT0)
			tk.FirstByte(fxT0.Add(time.Second))
			tk.Done(fxT0)
		}
		cands[2].SetEngine(&fleet.EngineState{At: fxT0, Waiting: 3, Missing: fleet.EngineRunning})
	}
	return cands
}

// TestKVRouteReplicasAgreeOnFirstTurn: a new conversation's first turn is
// placed on what every replica sees alike too, so that the replica taking
// the second turn does not find a holder to leave at once: three replicas
// with the views of TestKVRouteReplicasAgreeOnHolder but no holder place
// it on one backend.
func TestKVRouteReplicasAgreeOnFirstTurn(t *testing.T) {
	const turn = 200
	for _, pending := range [][3]int64{{30, 0, 0}, {400, 0, 0}, {40, 300, 0}, {0, 0, 0}} {
		picks := map[int]int{}
		for r := range 3 {
			cands := replicaView(r, pending[:], turn)
			p := fxNew(t, "kvroute", Options{}).(*KVRoute)
			in := fxInput(cands, make([]fxLoad, 3), turn, "new-conv")
			in.Replicas, in.ReplicaArc = 3, float64(r)/3
			d := p.Pick(in)
			t.Logf("pending %v, replica %d: %s (%s)", pending, r, cands[d.Index].Name, d.Note)
			picks[d.Index]++
		}
		if len(picks) != 1 {
			t.Errorf("pending %v: the three replicas placed a new conversation on %d different backends: %v", pending, len(picks), picks)
		}
	}
}

// TestKVRouteReplicasKeepBestHolder: with several replicas, as on one
// router, a holder that is the best keeps the turn whatever its requests
// in flight (the in-flight bound limits the premium of staying, and there
// is none), and one that is not leaves past the bound.
func TestKVRouteReplicasKeepBestHolder(t *testing.T) {
	const prompt = 2000
	for _, tc := range []struct {
		name    string
		matched int32 // blocks of the prompt the holder has cached
		want    string
	}{
		{"the holder has the prompt cached", 100, "sticky"},
		{"the holder has nothing cached", 0, "spill"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			loads := []fxLoad{{matched: tc.matched, pending: []int64{1, 1, 1, 1}}, {}, {}, {}}
			cands := fxBackends(t, loads...)
			p := fxNew(t, "kvroute", Options{}).(*KVRoute)
			in := fxInput(cands, loads, prompt, "conv")
			p.LearnSession(Claim{Session: in.SessionHash}, cands[0].ID)
			in.Replicas = 3
			if d := p.Pick(in); d.Note != tc.want || (d.Index == 0) != (tc.want == "sticky") {
				t.Errorf("picked %d (%q), want %q", d.Index, d.Note, tc.want)
			}
		})
	}
}
