package disagg

import (
	"math"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/scheduler"
)

// Conditional disaggregation: whether a request is split at all. Split, a
// request's prefill runs on a prefill engine and its KV cache is carried
// to a decode engine; whole, it runs on one `both` (else decode) engine,
// where its prefill shares steps with the streams decoding there. Decide
// weighs the two on the engines' costs, for the request and for the
// streams it would slow (docs/routing.md, "Conditional disaggregation"):
//
//	whole:  TTFT = (q_W + u_W) p            harm = n_W u_W p
//	split:  TTFT = (q_P + u_P) p + L + u_D t    harm = 0
//
// where p is the seconds per prefill token (the fleet's learned rate),
// q the prefill tokens queued on an engine, u the prompt tokens it would
// compute (W: the engine that would serve it whole, P: the prefill
// engine), n_W the streams decoding on W, and L + u_D t the KV transfer
// of the u_D tokens the decode engine lacks. Each of W's n_W streams
// waits u_W p longer for its next tokens while the prefill runs beside
// them (a chunked prefill adds its chunk's time to every step it shares),
// which is the harm; the transfer runs beside the decode engine's steps
// and stalls nobody. A request is split when its split TTFT is below its
// whole TTFT plus the harm: so a short uncached part (u_W below
// L / (n_W p - t), with equal queues) is served whole, and so is any
// request while the prefill pool's queue q_P exceeds the whole engine's
// by more than the harm saved (the prefill pool is the bottleneck).

// Side is one candidate engine's figures for a request, as the router
// sees them (its own accounting and prefix index).
type Side struct {
	// OK is false when no engine of the kind can take the request.
	OK bool
	// Queued is the uncached prompt tokens of the requests routed to it
	// before their first token (fleet.Load.PendingPrefill).
	Queued int64
	// Uncached is the request's prompt tokens it does not hold: what it
	// computes (prefill, whole) or receives (decode).
	Uncached int64
	// Decoding is its streams past their first token.
	Decoding int64
}

// Estimate is what Decide weighs for one request: the engine that would
// serve it whole (a both engine, else a decode engine), the prefill
// engine and the decode engine of a split, each the least loaded of its
// kind (Gather), and the cost of a prefill token.
type Estimate struct {
	Whole, Prefill, Decode Side
	// PrefillSeconds is the seconds per prompt token computed (the
	// inverse of the fleet's prefill rate).
	PrefillSeconds float64
}

// Costs are the KV transfer's: a fixed latency per request and a time per
// token carried (the connector's; the engine presets' KVTransferLatency
// and KVTransferPerToken).
type Costs struct {
	TransferLatency, TransferPerToken time.Duration
}

// Choice is Decide's answer, with its figures for the decision log.
type Choice struct {
	Split bool
	// WholeCost and SplitCost are the seconds Decide compared: the whole
	// TTFT plus the harm to the whole engine's streams, and the split TTFT.
	WholeCost, SplitCost float64
	// Reason is a short static word: "split", "short" (the uncached part
	// is too short to be worth a transfer), "prefill-busy" (the prefill
	// pool's queue outweighs the harm), "no-prefill", "no-whole".
	Reason string
}

// Decide says whether a request of estimate e is split, under the
// transfer costs c. It is pure: the same estimate always gives the same
// choice.
func Decide(e Estimate, c Costs) Choice {
	switch {
	case !e.Prefill.OK || !e.Decode.OK:
		return Choice{Reason: "no-prefill"}
	case !e.Whole.OK:
		return Choice{Split: true, Reason: "no-whole"}
	}
	p := max(e.PrefillSeconds, 0)
	whole := float64(e.Whole.Queued+e.Whole.Uncached) * p
	harm := float64(e.Whole.Decoding*e.Whole.Uncached) * p
	transfer := c.TransferLatency.Seconds() + float64(e.Decode.Uncached)*c.TransferPerToken.Seconds()
	split := float64(e.Prefill.Queued+e.Prefill.Uncached)*p + transfer
	ch := Choice{WholeCost: whole + harm, SplitCost: split}
	switch {
	case split < whole+harm:
		ch.Split, ch.Reason = true, "split"
	case float64(e.Prefill.Queued-e.Whole.Queued)*p > harm:
		ch.Reason = "prefill-busy"
	default:
		ch.Reason = "short"
	}
	return ch
}

// Gather reads the estimate of request v (its prompt's blocks hashes)
// off the router's state: for each kind of engine (Roles.Tier of a whole
// request, a prefill leg and a decode leg, lowest tier), the candidate
// with the least prefill work (queued plus its own uncached tokens),
// fewer decoding streams on a tie. rate is the fleet's prefill rate in
// tokens per second; 0: the geometric mean of the candidates' (rateOf).
// It only reads.
func Gather(s *scheduler.Scheduler, roles Roles, v *request.View, hashes []uint64, rate float64) Estimate {
	e := Estimate{}
	var logRate float64
	n := 0
	whole, pre, dec := *v, *v, *v
	whole.Role, pre.Role, dec.Role = "", RolePrefill, RoleDecode
	var wTier, pTier, dTier = -1, -1, -1
	consider := func(side *Side, tier *int, t int, l fleet.Load, uncached int64) {
		if t < 0 || (*tier >= 0 && t > *tier) {
			return
		}
		c := Side{OK: true, Queued: l.PendingPrefill, Uncached: uncached, Decoding: l.Decoding}
		if *tier < 0 || t < *tier || better(c, *side) {
			*side, *tier = c, t
		}
	}
	s.Holdings(v, hashes, func(b *fleet.Backend, _, uncached int64) {
		logRate += math.Log(rateOf(b))
		n++
		l := b.Load()
		consider(&e.Whole, &wTier, roles.Tier(&whole, b), l, uncached)
		consider(&e.Prefill, &pTier, roles.Tier(&pre, b), l, uncached)
		consider(&e.Decode, &dTier, roles.Tier(&dec, b), l, uncached)
	})
	if rate <= 0 && n > 0 {
		rate = math.Exp(logRate / float64(n))
	}
	if rate > 0 {
		e.PrefillSeconds = 1 / rate
	}
	return e
}

// rateOf is b's prefill rate in tokens per second: the engine's own
// (timed without the network), else the one the router learned from
// TTFTs, else fleet.DefaultPrefillRate.
func rateOf(b *fleet.Backend) float64 {
	if r := b.EnginePrefillRate(); r > 0 {
		return r
	}
	if r := b.PrefillRate(); r > 0 && b.PrefillRateSamples() > 0 {
		return r
	}
	return fleet.DefaultPrefillRate
}

// better reports whether a has less prefill work than b, or as much and
// fewer decoding streams.
func better(a, b Side) bool {
	wa, wb := a.Queued+a.Uncached, b.Queued+b.Uncached
	return wa < wb || (wa == wb && a.Decoding < b.Decoding)
}

// Decider is the conditional split of a fleet with prefill engines, for a
// front that sets a request's legs (the proxy, the simulator): it gathers
// a request's estimate and decides.
type Decider struct {
	Sched *scheduler.Scheduler
	Roles Roles
	Costs Costs
}

// Split reports whether request v (with its prompt's block hashes) is
// split: Decide on Gather.
func (d *Decider) Split(v *request.View, hashes []uint64) Choice {
	return Decide(Gather(d.Sched, d.Roles, v, hashes, 0), d.Costs)
}

// RoleBoth is the role of an engine that takes whole requests.
const RoleBoth = config.RoleBoth
