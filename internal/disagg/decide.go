package disagg

import (
	"math"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/scheduler"
)

// Conditional disaggregation: whether a request is split at all. Split, a
// request's prefill runs on a prefill engine and its KV cache is carried
// to a decode engine; whole, it runs on one `both` (else decode) engine,
// where its prefill shares steps with the streams decoding there. Decide
// weighs the two on the engines' costs, for the request and for the
// streams it would stall (docs/routing.md, "Conditional disaggregation"):
//
//	whole:  TTFT = (q_W + u_W) p                 stall = u_W p  (0 when W decodes nothing)
//	split:  TTFT = (q_P + u_P) p + L + u_D t + s_D
//
// where p is the seconds per prefill token (the fleet's rate), q the
// prefill tokens queued on an engine, u the prompt tokens it computes (W:
// the engine that would serve the request whole, P: the prefill engine),
// L + u_D t the KV transfer of the u_D tokens the decode engine lacks, and
// s_D the decode engine's step (its inter-token time), which produces the
// first token of a split request. A whole request's prefill adds its u_W p
// to the inter-token gaps of the steps it shares with W's streams: every
// stream there sees that stall once, in the same steps, so the share of
// inter-token gaps it lengthens, and with it their percentiles, is that
// time whatever the number of streams. A request is split when its split
// TTFT is below its whole TTFT plus the stall. So a short uncached part
// is served whole (with equal queues, u_W below (L + s_D) / (p - t): the
// transfer and the extra step cost more than the stall saved), and so is
// a request while the prefill pool's queue exceeds the whole engine's by
// more than the stall (the prefill pool is the bottleneck), which keeps
// the pool's queue within one prefill of the whole engines'.

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
	// Step is its time per output token in seconds (the engine's own
	// inter-token latency), 0 when unknown.
	Step float64
}

// Estimate is what Decide weighs for one request: the engine that would
// serve it whole (a both engine, else a decode engine), the prefill
// engine and the decode engine of a split, each the least loaded of its
// kind (Gather), and the cost of a prefill token.
type Estimate struct {
	Whole, Prefill, Decode Side
	// Held is the fewest prompt tokens a decode-leg candidate lacks: the
	// uncached part on the decode engine that holds the longest prefix
	// (what llm-d's prefix-based decider reads off its decode pick).
	Held int64
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
	// TTFT plus the stall of the whole engine's streams, and the split
	// TTFT.
	WholeCost, SplitCost float64
	// Reason is a short static word: "split", "short" (the uncached part
	// is too short to be worth a transfer), "prefill-busy" (the prefill
	// pool's queue outweighs the stall), "no-prefill", "no-whole";
	// "policy" from Decider.Split when the policy decided.
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
	var stall float64
	if e.Whole.Decoding > 0 {
		stall = float64(e.Whole.Uncached) * p
	}
	transfer := c.TransferLatency.Seconds() + float64(e.Decode.Uncached)*c.TransferPerToken.Seconds()
	split := float64(e.Prefill.Queued+e.Prefill.Uncached)*p + transfer + max(e.Decode.Step, 0)
	ch := Choice{WholeCost: whole + stall, SplitCost: split}
	switch {
	case split < whole+stall:
		ch.Split, ch.Reason = true, "split"
	case float64(e.Prefill.Queued-e.Whole.Queued)*p > stall:
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
// fewer decoding streams on a tie. The prefill is priced at the
// geometric mean of the candidates' prefill rates at now, each its cost
// model's (fleet.Backend.PrefillRate): the estimate the pick prices the
// same engines by. It only reads.
func Gather(s *scheduler.Scheduler, roles Roles, v *request.View, hashes []uint64, now time.Time) Estimate {
	e := Estimate{}
	var logRate float64
	n := 0
	whole, pre, dec := *v, *v, *v
	whole.Role, pre.Role, dec.Role = "", RolePrefill, RoleDecode
	var wTier, pTier, dTier, hTier = -1, -1, -1, -1
	e.Held = int64(max(v.PromptTokens, 0))
	var step float64
	consider := func(side *Side, tier *int, t int, l fleet.Load, uncached int64) {
		if t < 0 || (*tier >= 0 && t > *tier) {
			return
		}
		c := Side{OK: true, Queued: l.PendingPrefill, Uncached: uncached, Decoding: l.Decoding, Step: step}
		if *tier < 0 || t < *tier || better(c, *side) {
			*side, *tier = c, t
		}
	}
	s.Holdings(v, hashes, func(b *fleet.Backend, _, uncached int64) {
		logRate += math.Log(b.PrefillRate(now))
		n++
		l := b.Load()
		step = b.EngineDecodeTime()
		consider(&e.Whole, &wTier, roles.Tier(&whole, b), l, uncached)
		consider(&e.Prefill, &pTier, roles.Tier(&pre, b), l, uncached)
		t := roles.Tier(&dec, b)
		consider(&e.Decode, &dTier, t, l, uncached)
		if t >= 0 && (hTier < 0 || t < hTier || (t == hTier && uncached < e.Held)) {
			e.Held, hTier = uncached, t
		}
	})
	if n > 0 {
		if rate := math.Exp(logRate / float64(n)); rate > 0 {
			e.PrefillSeconds = 1 / rate
		}
	}
	return e
}

// better reports whether a has less prefill work than b, or as much and
// fewer decoding streams.
func better(a, b Side) bool {
	wa, wb := a.Queued+a.Uncached, b.Queued+b.Uncached
	return wa < wb || (wa == wb && a.Decoding < b.Decoding)
}

// Decider is the conditional split of a fleet with prefill engines, for a
// front that sets a request's legs (the proxy, the simulator): it gathers
// a request's estimate and decides, so that kvroute serve and kvroute sim
// make the one decision.
type Decider struct {
	Sched *scheduler.Scheduler
	Roles Roles
	Costs Costs
}

// Split reports whether request v (with its prompt's block hashes) is
// split: Decide on Gather, unless the scheduler's policy has a split
// decision of its own (policy.PairDecider: a peer's P/D policy, as its
// authors built it), which is asked instead on the same estimate (Reason
// "policy").
func (d *Decider) Split(v *request.View, hashes []uint64, now time.Time) Choice {
	e := Gather(d.Sched, d.Roles, v, hashes, now)
	if pd, ok := d.Sched.Policy().(policy.PairDecider); ok {
		return Choice{Split: pd.Disaggregate(int64(v.PromptTokens), e.Held), Reason: "policy"}
	}
	return Decide(e, d.Costs)
}

// RoleBoth is the role of an engine that takes whole requests.
const RoleBoth = config.RoleBoth
