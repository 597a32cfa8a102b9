package fleet

import (
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/internal/costmodel"
)

// Cost returns b's cost model (package costmodel): its engine's
// coefficients learned online from what the router sees of it (the TTFT
// of every request, split by its known cached part: Ticket.FirstByte) and
// what the engine reports (its inter-token latency and prefill time:
// Learn). Until SetCostModel gives it another, a backend starts from the
// generic prior. It never blocks.
func (b *Backend) Cost() *costmodel.Model {
	if m := b.cost.Load(); m != nil {
		return m
	}
	b.cost.CompareAndSwap(nil, costmodel.New(costmodel.Generic()))
	return b.cost.Load()
}

// SetCostModel gives b the cost model m: one started from its engine's
// preset (a prior the first observations overrule), or a frozen one (the
// simulator told the true coefficients).
func (b *Backend) SetCostModel(m *costmodel.Model) { b.cost.Store(m) }

// Chunk is b's token budget per engine step: its engine's
// max_num_batched_tokens when known (Limits), else its cost model's
// prior's.
func (b *Backend) Chunk() int64 {
	if c := b.limits.maxBatchedTokens.Load(); c > 0 {
		return c
	}
	return b.Cost().Chunk()
}

// observeTTFT teaches b's cost model one request's time to first token:
// the prefill work the backend finished between the request's routing
// and its first token (work tokens, its own uncached ones included,
// which follow cached ones in its context), in steps that also ran the
// decoding streams l shows. As for the learned rate, a prefill of fewer
// than MinRateWork tokens teaches nothing: its TTFT is the network, the
// queue and one step, and a server that answers at once (a cached
// response, a fake) would look infinitely fast. A request that found every sequence slot
// taken when it was routed (queued at least the engine's cap) waited for
// a slot the model does not price: it teaches nothing.
func (b *Backend) observeTTFT(work, uncached, cached, queued int64, l Load, ttft time.Duration, now time.Time) {
	if work < MinRateWork || ttft <= 0 {
		return
	}
	if c := b.Limits().MaxNumSeqs; c > 0 && queued >= int64(c) {
		return
	}
	steps := float64(costmodel.Steps(work, b.Chunk()))
	// The attention pairs only of a request that had the engine's prefill
	// to itself (no other request's first byte came meanwhile): in a queue,
	// what the work finished does not explain (prompts prefilled in part,
	// preempted, waiting for KV blocks) grows with a long prompt's
	// duration, and the attention term would absorb it (the learned term
	// came out 1,000 times the engine's on the 70B preset's mixed
	// workload).
	var pairs float64
	if work == uncached {
		pairs = costmodel.AttnPairs(uncached, cached)
	}
	b.Cost().Observe(costmodel.Sample{
		Steps:   steps,
		Tokens:  float64(work),
		Pairs:   pairs,
		Seqs:    steps * float64(max(l.Decoding, 0)),
		Ctx:     steps * float64(max(l.DecodeTokens, 0)),
		Seconds: ttft.Seconds(),
	}, now)
	b.fleet.anchor(now)
}

// learnCost teaches b's cost model what one engine reading r shows: the
// mean step time its inter-token latency gives, for the sequences it ran
// (its running count, else the router's decoding streams) over the context
// they hold (its KV cache in use, else the router's count), with the
// prompt tokens it computed meanwhile spread over those steps (an engine
// that does not tell them teaches no step time); its own
// prefill time for the tokens it prefilled; and the time its CPU tier's
// loads took a token (costmodel.Model.ObserveLoad).
func (b *Backend) learnCost(r Reading) {
	s := r.State
	m := b.Cost()
	if r.DecodeTokens >= 1 && r.DecodeSeconds > 0 && r.ComputedTokens >= 0 {
		l := b.KnownLoad()
		seqs, ctx := float64(l.Decoding), float64(l.DecodeTokens)
		if s.Has(EngineRunning) && s.Running > 0 {
			seqs = float64(s.Running)
		}
		if s.Has(EngineKVUsage) && s.KVBlocks > 0 && s.BlockSize > 0 {
			ctx = min(max(s.KVUsage, 0), 1) * float64(s.KVBlocks) * float64(s.BlockSize)
		}
		seqs = max(seqs, 1)
		// Every running sequence gets a token a step, so the tokens over
		// the sequences are the steps the reading spans.
		steps := max(r.DecodeTokens/seqs, 1)
		m.Observe(costmodel.Sample{
			Steps:   1,
			Tokens:  max(r.ComputedTokens, 0) / steps,
			Seqs:    seqs,
			Ctx:     ctx,
			Seconds: r.DecodeSeconds / r.DecodeTokens,
		}, s.At)
	}
	if r.HostLoadTokens >= MinLoadTokens && r.HostLoadSeconds > 0 {
		m.ObserveLoad(costmodel.TierHost, r.HostLoadTokens, r.HostLoadSeconds)
	}
	if r.PrefillTokens >= MinRateWork && r.PrefillSeconds > 0 {
		// The requests' prefill times summed, over the tokens they
		// computed: how many steps they took, and with what batch, the
		// reading does not say, so it teaches the time per token alone.
		m.Observe(costmodel.Sample{Tokens: r.PrefillTokens, Seconds: r.PrefillSeconds}, s.At)
	}
	b.fleet.anchor(s.At)
}

// streamMark is what a ticket's first byte found on its backend: the
// prefilled count (Backend.prefilled), the decoding streams (its own
// included) and the prompt tokens they hold. Atomic: the first byte and
// the settle may run on different goroutines.
type streamMark struct{ prefilled, seqs, ctx atomic.Int64 }

func (m *streamMark) mark(prefilled, seqs, ctx int64) {
	m.prefilled.Store(prefilled)
	m.seqs.Store(seqs)
	m.ctx.Store(ctx)
}

// Decoded teaches t's backend's cost model what the router saw of the
// request's decode, the relay's inter-token timings: tokens tokens after
// its first in span (its first token's arrival to its last's), one
// engine step each, run among the decoding streams and the context they
// hold (the mean of the backend's load at its first byte and now). The
// span also holds the prefill work the backend finished meanwhile (the
// prompt tokens its other requests computed in the same steps), which the
// sample does not measure: how those tokens were spread over the steps,
// and so what they cost, the relay cannot see, and a span that holds a
// long prompt's prefill would teach the per-token cost from a decode
// (the learned prefill price then follows the decode streams, not the
// prompts). So that time is taken out at the model's current price and
// the sample teaches the step, sequence and context costs alone; a span
// that the prefill explains (almost) entirely teaches nothing. Call it
// before Done, once the stream ended; a request that never reached its
// first byte, or is done, teaches nothing.
func (t *Ticket) Decoded(tokens int64, span time.Duration, now time.Time) {
	if tokens < 1 || span <= 0 || t.state.Load() != stateDecoding {
		return
	}
	b := t.b
	l := b.KnownLoad()
	steps := float64(tokens)
	seqs := float64(t.stream.seqs.Load()+max(l.Decoding, 1)) / 2
	ctx := float64(t.stream.ctx.Load()+max(l.DecodeTokens, 0)) / 2
	m := b.Cost()
	prefill := float64(max(b.prefilled.Load()-t.stream.prefilled.Load(), 0)) * m.Coeffs(now).Token
	decode := span.Seconds() - prefill
	if decode < DecodeShare*span.Seconds() {
		return
	}
	m.Observe(costmodel.Sample{
		Steps:   steps,
		Seqs:    steps * seqs,
		Ctx:     steps * ctx,
		Seconds: decode,
	}, now)
	b.fleet.anchor(now)
}

// DecodeShare is the least share of a relayed stream's span that its
// decode steps must explain, once the prefill finished meanwhile is taken
// out at its price, for the stream to teach the decode costs (Decoded):
// below it the sample is mostly the other requests' prefill, and its
// remainder mostly the error of that price.
const DecodeShare = 0.5

// AnchorEvery is how often, at most, the fleet's coefficients are
// recomputed and given to every backend's cost model as what it decays
// toward (see anchor).
const AnchorEvery = time.Second

// anchor gives every member's cost model the fleet's coefficients as what
// it decays toward (costmodel.Model.SetAnchor): the geometric mean of the
// fits that rest on at least their prior's weight of samples at now and
// are within the estimate's bounds (costmodel.Model.Learned). An
// engine that no traffic refreshes then returns to what its peers show
// (a healthy engine locked out by a bad reading returns to the others'
// figures, an idle engine among identical ones to theirs) rather than to
// a generic guess. At most once every AnchorEvery of sample time, O(fleet
// size); with no fit to go by, the priors stay.
func (f *Fleet) anchor(now time.Time) {
	if f == nil {
		return
	}
	last := f.anchorAt.Load()
	if now.UnixNano()-last < int64(AnchorEvery) || !f.anchorAt.CompareAndSwap(last, now.UnixNano()) {
		return
	}
	all := f.Snapshot().All
	var mean costmodel.Mean
	for _, b := range all {
		m := b.Cost()
		if c, ok := m.Learned(); ok && m.Evidence(now) >= m.Prior().Samples {
			mean.Add(c)
		}
	}
	c := mean.Coeffs()
	if c == (costmodel.Coeffs{}) {
		return
	}
	for _, b := range all {
		b.Cost().SetAnchor(&c)
	}
}
