package policy

import (
	"math"
	"sync"
	"time"

	"github.com/kvroute/kvroute/internal/costmodel"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/slo"
)

func init() { register("kvroute", func(o Options) Policy { return NewKVRoute(o) }) }

// The constants of the kvroute estimate. docs/routing.md derives each one;
// they are the knobs to tune against the peers in the simulator. What an
// engine costs (its step, prefill and decode times, its prefill chunk) is
// not among them: each backend's cost model learns it (fleet.Backend.Cost,
// package costmodel), from a preset's figures or a generic prior.
const (
	// AffinityRatio and AffinitySlack bound session stickiness in time: a
	// request stays on its conversation's backend while that backend's
	// estimate is at most AffinityRatio times the best estimate plus
	// AffinitySlack seconds. The slack only absorbs rounding between
	// estimates of a few milliseconds: on the chat workload the tail of TTFT
	// is made of requests that paid the stickiness premium, so it is kept
	// small (1.5 and 20 ms cost chat 8% of p99; docs/routing.md).
	AffinityRatio = 1.2
	AffinitySlack = 0.002

	// AffinitySlots is added to CHWBL's in-flight bound (see boundedLoadCap)
	// for a sticky backend. With a handful of requests in flight the bound's
	// rounding admits a single request per backend, which would move a
	// conversation off its cache on request count alone; one slot of slack
	// fixes that while a hot key still spills as load grows.
	AffinitySlots = 1

	// RateTrust is how far a backend's prefill rate (its cost model's
	// throughput in full chunks, costmodel.Coeffs.ChunkRate) must stray
	// from the fleet's (the geometric mean over the candidates) before it
	// counts.
	// Within a factor RateTrust of the fleet's, every backend is costed at
	// the fleet's rate (its own coefficients scaled to it); beyond it, at
	// its own rate shrunk by that factor. A
	// rate is learned from the TTFTs of the requests the router sent there,
	// so noise feeds back: identical engines learn rates up to 2.2x apart
	// (16k to 35k tokens/s on h100-llama3-8b under the mixed workload), the
	// "fast" one draws the traffic and the "slow" one, starved, never
	// corrects its rate. A different GPU class (an A100 is 3.2x slower than
	// an H100 on Llama-3-8B) or a throttled server still shows.
	RateTrust = 3.0

	// RateCap bounds the rate kvroute costs a backend at to within a factor
	// RateCap of the fleet's, whatever it learned (so a backend reaches the
	// cap at 9x the fleet's learned rate). A server whose TTFT does not grow
	// with the prompt (a fast server, a small model, a cached response)
	// learns a rate as high as its samples are long: 2,000 tokens answered
	// in 1 ms teach 2M tokens/s, 200x the prior, and without a bound that
	// backend would look so fast that every new prompt went there. At 3x,
	// it draws new work until its queue is about three times the others'.
	RateCap = 3.0

	// MissCostPerWaiter and FreeWaiters price the fleet-wide cost of
	// recomputing a prompt. When the fleet is backlogged, every token one
	// backend computes that another had cached delays the requests queued
	// behind it, and through load balancing, everybody's. So a candidate's
	// uncached tokens are charged (MissCostPerWaiter * excess) times again,
	// excess being the mean number of requests per candidate waiting for
	// their first token beyond FreeWaiters. Below that the fleet is not
	// backlogged and the charge is 0: pure TTFT. 6 rather than 3: on the
	// whole Mooncake trace at load 0.7 the fleet is memory-bound and every
	// recomputed prompt also evicts cache, p99 17.1 s -> 14.8 s; the
	// workloads that rarely queue do not change (docs/routing.md).
	MissCostPerWaiter = 6.0
	FreeWaiters       = 1.0

	// CacheStickyRatio keeps a request without a
	// session key on the holder of its longest cached prefix when that
	// holder has at least one full prefill chunk more of it cached than
	// the best-scored candidate (see stickyTokens), and costs at most CacheStickyRatio times the best score. Sending such
	// a prompt elsewhere recomputes at least one full engine step of
	// prefill and duplicates that much KV on the other engine, evicting as
	// much of other conversations' caches; shorter shared prefixes (system
	// prompts, documents of a few thousand tokens, which every engine soon
	// holds) are left to the estimate. On the Mooncake trace this keeps
	// conversations together: hit rate +0.3 to +1.7 points in every
	// 10-minute window at load 0.7 with a p99 as low or lower, +3 points on
	// 32 engines; the built-in workloads do not change (docs/routing.md).
	// Ratios of 1.5 and 2 kept fewer hits.
	// The lead is scaled to the engines (see stickyTokens): one prefill
	// chunk of theirs, and at most a quarter of their context, so that the
	// rule can fire on engines whose whole context is smaller than a chunk.
	CacheStickyRatio = 3.0
	// StickyContextShare is the share of an engine's context length that
	// the stickiness lead may not exceed (see stickyTokens).
	StickyContextShare = 0.25

	// FitRatio makes room in the KV cache part of the estimate: among the
	// candidates whose score is at most FitRatio times the best, a request
	// goes to the best-scored one whose free KV cache (as the engine last
	// reported it, less the prompts routed there and not yet started) holds
	// its uncached tokens, when the best does not. A prompt that does not
	// fit waits for blocks, and once running, every step that needs a block
	// it cannot get preempts the newest running request, which is often the
	// long prompt itself: on the Mooncake trace the slowest 1% were cold
	// 80-120k-token prompts sent, by a margin of a few hundred milliseconds
	// in the estimate, to an engine 93-99% full when another was half
	// empty. 1.2: p99 lower in each of the trace's 10-minute windows at
	// load 0.7 and 8% lower on its first 2,000 requests over ten arrival
	// jitters, hit rate unchanged. 1.3 gave as much p99 but a third of a
	// point less hit rate (the free space includes cached blocks no request
	// holds, which the prompt then evicts) and 6% more on mixed at 0.7; the
	// other built-in workloads rarely fill the cache and do not change
	// (docs/routing.md).
	FitRatio = 1.2

	// ReplicaSkew keeps router replicas from herding. Each replica sees
	// its peers' decisions only after the sync delay (batching and the
	// NATS hop), and requests come in bursts (the Mooncake trace releases
	// about nine at the same millisecond): replicas that read the same
	// fleet rank the backends alike, so within a burst each sends its
	// first request to the same best backend. With Input.Replicas > 1,
	// each replica ranks candidates by score * (1 + ReplicaSkew * d), d
	// the candidate's clockwise distance in [0, 1) from the replica's
	// place on the circle of backends (fleet.Backend.Arc,
	// Input.ReplicaArc): among backends within a factor 1+ReplicaSkew of
	// each other, replicas start from different ones. Stickiness, the
	// cache rule and room in the KV cache still compare unskewed scores.
	// On one router it does nothing. docs/routing.md ("With several
	// replicas") gives the figures behind the value.
	ReplicaSkew = 0.25

	// EngineStateMaxAge is how old an engine report may be and still count.
	// Metric scrapes arrive every 250 ms by default (engines.interval); an
	// older report describes a queue that has long since moved.
	EngineStateMaxAge = 3 * time.Second

	// sessionSlotsLog2 sizes the table of the backend each session last
	// went to: 2^16 slots of 8 bytes (512 KiB). It is direct-mapped and
	// lossy: a collision evicts the older conversation, which then falls
	// back to its prefix match, so memory stays bounded whatever the
	// number of sessions.
	sessionSlotsLog2 = 16
)

// KVRoute sends each request to the backend with the lowest estimated time
// to first token: the prefill work queued there plus this request's
// uncached tokens, plus what the decoding batch steals from every prefill
// step, over the backend's learned prefill rate; a session key keeps a
// conversation on the backend that holds it while that costs at most a
// bounded factor over the best.
//
// For candidate i, with all token counts estimated by the router and c_i
// its cost model's coefficients (fleet.Backend.Cost, scaled by the trust
// band: see RateTrust):
//
//	work_i  = PendingPrefill_i + external waiting_i + computed(Uncached_i)
//	steps_i = max(1, ceil(work_i / chunk_i))
//	step_i  = c.Step + c.Seq*Decoding_i + c.Ctx*DecodeTokens_i
//	est_i   = steps_i*step_i + c.Token*work_i + c.Attn*pairs(Uncached_i, Cached_i)
//
// Uncached_i, Cached_i and Extra_i are the scheduler's (Input.Uncached,
// Input.Cached, Input.Extra); chunk_i is the engine's token budget per
// step (fleet.Backend.Chunk); pairs is costmodel.AttnPairs. When the
// engine's running-sequence cap is known (or plausible: see
// fleet.Limits.PlausibleSeqs) and the requests there fill it,
// the request first waits for a slot (see slotWait), and est_i is at least
// that wait plus its own prefill; Extra_i and Load_i (the load of its
// cache hits on lower tiers, Input.Load; Cached_i counts them) are added
// last. Pick estimates
// every candidate once, then chooses by small rules (kvroute_pick.go).
//
// See docs/routing.md for the reasoning behind each term.
type KVRoute struct {
	loadFactor float64
	rot        tieRotor
	// sessions is the backend each conversation lives on (sessions.go).
	sessions Sessions
	// pool holds the candidates' estimates of a pick (*[]candidate).
	pool sync.Pool
	// transfer is Options.TransferPerToken (pd_kvroute.go).
	transfer time.Duration
	// reserve holds sheddable requests to the objectives of the others
	// (slo.go).
	reserve slo.Reserve
	// predictAll predicts every request's ITL, objectives or not: for the
	// llm-d predicted-latency peer, which estimates through a KVRoute
	// (llmd_slo.go).
	predictAll bool
}

// NewKVRoute returns a kvroute policy. Options.LoadFactor bounds the
// in-flight requests of a sticky backend as CHWBL does (default
// DefaultLoadFactor).
func NewKVRoute(o Options) *KVRoute {
	return &KVRoute{loadFactor: sessionLoadFactor(o), transfer: max(o.TransferPerToken, 0)}
}

// Name implements Policy.
func (*KVRoute) Name() string { return "kvroute" }

// sessionRank is backend b's rank for the session with key hash h: a
// mix of the two that every replica computes alike (splitmix64's
// finalizer over the session hash and the bits of b's Arc, itself a hash
// of b's name).
func sessionRank(h uint64, b *fleet.Backend) uint64 {
	x := h ^ math.Float64bits(b.Arc)
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// arcDistance is how far clockwise backend arc b lies from replica arc r on
// the unit circle, in [0, 1).
func arcDistance(r, b float64) float64 {
	d := b - r
	if d < 0 {
		d++
	}
	return d
}

// evenArc is b's place among cands in the order of their Arc, spaced
// evenly on the circle: hashes cluster, places do not.
func evenArc(cands []*fleet.Backend, b *fleet.Backend) float64 {
	k := 0
	for _, c := range cands {
		if c.Arc < b.Arc {
			k++
		}
	}
	return float64(k) / float64(len(cands))
}

// costedAt is the coefficients kvroute costs a backend at, given its own
// (co, whose prefill rate in full chunks is rate) and the fleet's (fleetCo,
// fleetRate): the fleet's within RateTrust's band, beyond it its own
// scaled to its trusted rate. The pick and the decode leg's pick both
// cost through it.
func costedAt(co costmodel.Coeffs, rate float64, fleetCo costmodel.Coeffs, fleetRate float64) costmodel.Coeffs {
	if r := trustedRate(rate, fleetRate); r != fleetRate {
		return co.Scale(rate / r)
	}
	return fleetCo
}

// trustedRate is the rate kvroute costs a backend at: the fleet's rate
// unless the backend's own strays beyond a factor RateTrust, and then its
// own shrunk by that factor (continuous at the band's edges), within a
// factor RateCap of the fleet's.
func trustedRate(own, fleetRate float64) float64 {
	switch r := own / fleetRate; {
	case r > RateTrust:
		return fleetRate * min(r/RateTrust, RateCap)
	case r < 1/RateTrust:
		return fleetRate * max(r*RateTrust, 1/RateCap)
	}
	return fleetRate
}

// written is the prompt tokens b has computed for the requests routed to
// it since it joined, by the router's estimate: what it has written into
// its KV cache.
func written(b *fleet.Backend) int64 {
	prompt, cached := b.Routed()
	return prompt - cached
}

// emptier reports whether a candidate with inFlight requests that has
// written w tokens into its cache beats one with (bestLoad, bestWritten)
// on an exact tie of scores: fewer in flight first, then fewer written.
// On an idle fleet, a prompt no backend holds then goes where the router
// has written the least: with the cache evicting its least recently used
// blocks, a prefix lives there until a cache's worth is written after it,
// so that is where it survives longest, and unrelated prompts spread over
// the backends instead of piling onto whichever the scan reached first.
func emptier(inFlight, w, bestLoad, bestWritten int64) bool {
	return inFlight < bestLoad || (inFlight == bestLoad && w < bestWritten)
}

// estimate is a candidate's estimated TTFT in seconds for a request of
// prompt tokens of which it computes uncached (at least one, see
// computed) after cached ones, and of an output budget of budget tokens
// (0 unknown), given the router's load l on backend b, the engine's
// fresh report e (nil if none; see freshEngine), b's coefficients co and
// its token budget per step chunk. The engine's running-sequence cap is
// its plausible one (fleet.Limits.PlausibleSeqs).
func (p *KVRoute) estimate(b *fleet.Backend, e *fleet.EngineState, l *fleet.Load, prompt, uncached, cached, budget int64, co costmodel.Coeffs, chunk int64) float64 {
	return p.estimateSeqs(b, e, l, prompt, uncached, cached, budget, co, chunk, b.Limits().PlausibleSeqs)
}

// estimateSeqs is estimate with the engine's running-sequence cap given
// (seqs, 0 for none): the view every replica shares knows only the cap an
// engine reports or is configured with, not the one each replica learns
// from its own readings and first bytes (see pickShared).
func (p *KVRoute) estimateSeqs(b *fleet.Backend, e *fleet.EngineState, l *fleet.Load, prompt, uncached, cached, budget int64, co costmodel.Coeffs, chunk int64, seqs int) float64 {
	work := l.PendingPrefill + uncached
	decoding, context := l.Decoding, l.DecodeTokens
	// queued is every request at the engine, running or waiting: the
	// router's own, or the engine's count when that is larger.
	queued := l.InFlight

	// Work the engine holds that the router did not route itself (another
	// router, a direct client, requests it is still finishing after a
	// router restart): requests waiting beyond our own not-yet-started ones
	// count as pending prefill, running ones beyond all of ours as decoding
	// streams, each at the mean prompt size of our decoding streams.
	if e != nil {
		mean := prompt
		if decoding > 0 {
			mean = context / decoding
		}
		// The engine's numbers are sanitised where they are read
		// (package adapter); the sums saturate all the same, so that no
		// reading can wrap a busy backend's cost negative.
		if extra := int64(e.Waiting) - (l.InFlight - l.Decoding); extra > 0 && e.Has(fleet.EngineWaiting) {
			work = fleet.SatAdd(work, fleet.SatMul(extra, mean))
		}
		if extra := int64(e.Running) - l.InFlight; extra > 0 && e.Has(fleet.EngineRunning) {
			decoding = fleet.SatAdd(decoding, extra)
			context = fleet.SatAdd(context, fleet.SatMul(extra, mean))
		}
		if e.Has(fleet.EngineRunning | fleet.EngineWaiting) {
			queued = max(queued, fleet.SatAdd(int64(e.Running), int64(e.Waiting)))
		}
	}

	// One step's time besides its prefill: the fixed cost and the
	// decoding batch, which every step of a chunked prefill runs too.
	step := co.DecodeStep(float64(decoding), float64(context))
	own := co.Token*float64(uncached) + co.Attn*costmodel.AttnPairs(uncached, cached)
	est := float64(costmodel.Steps(work, chunk))*step + co.Token*float64(work-uncached) + own
	if seqs <= 0 {
		return est
	}
	// Waiting for a slot: the request starts its prefill once enough
	// running sequences have finished, and then computes its own prompt
	// alone (those queued ahead of it have started theirs by then).
	mean := budget
	if l.Decoding > 0 {
		mean = l.DecodeBudget / l.Decoding
	}
	if mean <= 0 {
		// None of the sequences holding the slots is a stream of the
		// router's (whose output budgets it knows) and the request has
		// no max_tokens: the one default the scheduler accounts too.
		mean = request.DefaultOutputBudget
	}
	wait := slotWait(queued, int64(seqs), decoding, mean, decodeTime(b, step))
	if wait <= 0 {
		return est
	}
	return max(est, wait+float64(costmodel.Steps(uncached, chunk))*step+own)
}

// slotWait is how long, in seconds, a request arriving at an engine that
// holds queued requests (running and waiting) waits for a sequence slot
// when the engine runs at most limit sequences at once: 0 while a slot is
// free, else the time for queued - limit + 1 sequences to finish. They
// finish as the decoding streams end. Each of the decoding streams has an
// output of mean tokens and is, seen at a random moment, uniformly far
// through it, so the k-th of them to finish has k*mean/(decoding+1) tokens
// left on average; at one token per step of tokenTime seconds:
//
//	wait = (queued - limit + 1) * mean / (decoding + 1) * tokenTime
//
// Past the decoding streams (the slots are held by requests still in
// their prefill, or more must finish than are decoding) the same rate,
// decoding streams per mean tokens, carries on.
func slotWait(queued, limit, decoding, mean int64, tokenTime float64) float64 {
	need := queued - limit + 1
	if need <= 0 || limit <= 0 {
		return 0
	}
	return float64(need) * float64(mean) / float64(max(decoding, 0)+1) * tokenTime
}

// decodeTime is b's time per output token in seconds: the engine's own
// inter-token latency when it reports it, else step, the time of a step
// that runs the decoding batch by b's cost model.
func decodeTime(b *fleet.Backend, step float64) float64 {
	if t := b.EngineDecodeTime(); t > 0 {
		return t
	}
	return step
}

// stickyTokens is the lead in cached tokens that keeps a request without
// a session key on the holder of its longest cached prefix instead of the
// best candidate (see CacheStickyRatio): for each of the two engines, its
// token budget per step (fleet.Backend.Chunk), at most StickyContextShare
// of its context when known; the smaller of the two.
func stickyTokens(holder, best *fleet.Backend) float64 {
	t := math.Inf(1)
	for _, b := range [2]*fleet.Backend{holder, best} {
		c := float64(b.Chunk())
		if ctx := b.Limits().ContextLen; ctx > 0 {
			c = min(c, StickyContextShare*float64(ctx))
		}
		t = min(t, c)
	}
	return t
}

// freshEngine is b's engine report if it is at most EngineStateMaxAge old,
// else nil.
func freshEngine(b *fleet.Backend, now time.Time) *fleet.EngineState {
	if e := b.Engine(); e != nil && now.Sub(e.At) <= EngineStateMaxAge {
		return e
	}
	return nil
}

// fitsKV reports whether the engine's KV cache has room for uncached more
// tokens: its free blocks as its fresh report e gives them (vLLM counts
// cached blocks no request holds as free, as they are evicted on demand),
// less the uncached prompt tokens routed there that have not started.
// Without a fresh report of usage and capacity (e nil or incomplete) it
// reports true: the rule then leaves the estimate alone.
func fitsKV(e *fleet.EngineState, l *fleet.Load, uncached int64) bool {
	free, ok := e.FreeKVTokens()
	if !ok {
		return true
	}
	return free-float64(l.PendingPrefill) >= float64(uncached)
}

// Routed implements Observer: it remembers where a session's request went
// (Sessions.Routed: a claim when that places or moves the conversation),
// so that its next turn finds the conversation even if the prefix index
// has lost it, or its text shares nothing with the last turn's.
func (p *KVRoute) Routed(in *Input, d Decision) {
	if in.View == nil || in.View.SessionKey == "" {
		return
	}
	p.sessions.Routed(in.SessionHash, in.Candidates[d.Index].ID, in.Now.UnixNano(), in.Replica)
}

// LearnSession implements SessionLearner.
func (p *KVRoute) LearnSession(c Claim, id int) { p.sessions.Learn(c, id) }

// SessionOf implements SessionLearner.
func (p *KVRoute) SessionOf(h uint64) (int, Claim) { return p.sessions.Lookup(h) }

var (
	_ Policy         = (*KVRoute)(nil)
	_ Observer       = (*KVRoute)(nil)
	_ SessionLearner = (*KVRoute)(nil)
)
