package policy

import (
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/slo"
)

// llmd-predicted-latency: llm-d's predicted-latency scheduling, as its
// inference scheduler (llm-d/llm-d-inference-scheduler, pkg/epp/framework/
// plugins: requestcontrol/dataproducer/predictedlatency, the
// latency-slo-admitter, the slo-headroom-tier-filter and the
// latency-scorer) describes it, with one substitution: llm-d predicts each
// endpoint's TTFT and TPOT with XGBoost models trained online in sidecars;
// here kvroute's per-engine learned cost model stands in for them (the
// same predictions as kvroute's, KVRoute.estimateAll), so that the two
// differ only in their rules:
//
//	headroom   SLO - predicted, per objective (an unset objective is 0;
//	           llm-d's buffer factor is 1)
//	admitter   a sheddable request (priority < 0) is admitted when some
//	           endpoint is predicted to meet both objectives, or is idle
//	           (no request dispatched), or cold (KV cache under 2%); else
//	           it is rejected (429)
//	tier       endpoints meeting both (positive) or not (negative); with
//	           both tiers present the positive one is kept, 1 time in 100
//	           the negative one (exploration)
//	scorer     positive tier, strategy "least": each headroom normalised
//	           to [0, 1] over the tier, the one closest to its SLO scoring
//	           highest, blended 0.8 TTFT + 0.2 TPOT (a dimension whose
//	           range is 0 gives its weight to the other); negative tier:
//	           idle endpoints only when there are any, then only the best
//	           non-empty deficit bucket (TPOT missed only, TTFT missed
//	           only, both), scored by the smallest deficit
//	picker     the highest score, ties at random
//
// A request without objectives has headroom 0 - predicted: every endpoint
// is negative, and the lowest predicted latency wins.
type LLMDPredicted struct {
	k   *KVRoute
	rnd *peerRand
}

// llm-d's defaults.
const (
	LLMDTTFTWeight     = 0.8
	LLMDTPOTWeight     = 0.2
	LLMDExploreNeg     = 100 // 1 in 100
	LLMDColdKVUsage    = 0.02
	llmdTierPositive   = 0
	llmdBucketTPOTOnly = 1
	llmdBucketTTFTOnly = 2
	llmdBucketBoth     = 3
)

func init() {
	register("llmd-predicted-latency", func(o Options) Policy {
		k := NewKVRoute(o)
		k.predictAll = true
		return &LLMDPredicted{k: k, rnd: newPeerRand(o.Seed)}
	})
}

// Name implements Policy.
func (*LLMDPredicted) Name() string { return "llmd-predicted-latency" }

// llmdEndpoint is one candidate's headrooms and bucket.
type llmdEndpoint struct {
	ht, hp float64 // headrooms in seconds
	bucket int
	idle   bool
}

// Pick implements Policy.
func (p *LLMDPredicted) Pick(in *Input) Decision {
	r := p.k.request(in)
	cs := p.k.getScratch(len(in.Candidates))
	defer p.k.pool.Put(cs)
	c := *cs
	p.k.estimateAll(in, &r, false, 0, c)
	o := in.Objective
	eps := make([]llmdEndpoint, len(c))
	preds := make([]slo.Prediction, len(c))
	valid, idle, cold := false, false, false
	for k := range c {
		x := &c[k]
		e := &eps[x.i]
		preds[x.i] = slo.Prediction{TTFT: x.est, ITL: x.itl}
		e.ht, e.hp = headroomOf(o.TTFT.Seconds(), x.est), headroomOf(o.ITL.Seconds(), x.itl)
		e.idle = x.load.InFlight == 0
		switch {
		case e.ht >= 0 && e.hp >= 0:
			e.bucket = llmdTierPositive
			valid = true
		case e.ht >= 0:
			e.bucket = llmdBucketTPOTOnly
		case e.hp >= 0:
			e.bucket = llmdBucketTTFTOnly
		default:
			e.bucket = llmdBucketBoth
		}
		idle = idle || e.idle
		if st := in.Candidates[x.i].Engine(); st != nil && st.Has(fleet.EngineKVUsage) && st.KVUsage < LLMDColdKVUsage {
			cold = true
		}
	}
	if o.Class == slo.Sheddable && !o.None() && !valid && !idle && !cold {
		best := 0
		for i := range preds {
			if preds[i].TTFT < preds[best].TTFT {
				best = i
			}
		}
		return Decision{Index: best, EstTTFT: preds[best].TTFT, Pred: preds[best], Shed: true, Note: "shed"}
	}
	positive := valid && (o.None() || p.rnd.intn(LLMDExploreNeg) != 0)
	keep := func(e *llmdEndpoint) bool { return (e.bucket == llmdTierPositive) == positive }
	if !positive {
		// Negative tier: idle endpoints first, then the best bucket.
		if idle {
			prev := keep
			keep = func(e *llmdEndpoint) bool { return prev(e) && e.idle }
		}
		bestBucket := llmdBucketBoth + 1
		for i := range eps {
			if keep(&eps[i]) {
				bestBucket = min(bestBucket, eps[i].bucket)
			}
		}
		prev := keep
		keep = func(e *llmdEndpoint) bool { return prev(e) && e.bucket == bestBucket }
	}
	i := p.score(eps, keep, positive)
	d := Decision{Index: i, EstTTFT: preds[i].TTFT, Pred: preds[i], Met: eps[i].bucket == llmdTierPositive && !o.None(), Note: "predicted-latency"}
	return d
}

// headroomOf is an objective's headroom: objective - predicted seconds;
// an objective not set is 0, as llm-d reads a missing header, so its
// headroom is -predicted.
func headroomOf(objective, predicted float64) float64 {
	return objective - predicted
}

// score returns the kept endpoint with the highest blended score (ties at
// random): "least" headroom, normalised over the kept endpoints.
func (p *LLMDPredicted) score(eps []llmdEndpoint, keep func(*llmdEndpoint) bool, positive bool) int {
	minT, maxT, minP, maxP := 0.0, 0.0, 0.0, 0.0
	first := true
	for i := range eps {
		e := &eps[i]
		if !keep(e) {
			continue
		}
		if first {
			minT, maxT, minP, maxP, first = e.ht, e.ht, e.hp, e.hp, false
			continue
		}
		minT, maxT = min(minT, e.ht), max(maxT, e.ht)
		minP, maxP = min(minP, e.hp), max(maxP, e.hp)
	}
	wt, wp := LLMDTTFTWeight, LLMDTPOTWeight
	switch {
	case maxT == minT && maxP != minP:
		wt, wp = 0, 1
	case maxP == minP && maxT != minT:
		wt, wp = 1, 0
	}
	norm := func(h, lo, hi float64) float64 {
		if hi == lo {
			return 1
		}
		n := (h - lo) / (hi - lo)
		if positive {
			return 1 - n // least: closest to the SLO
		}
		return n // the smallest deficit
	}
	best, bestS, ties := -1, 0.0, 0
	for i := range eps {
		e := &eps[i]
		if !keep(e) {
			continue
		}
		s := wt*norm(e.ht, minT, maxT) + wp*norm(e.hp, minP, maxP)
		switch {
		case best < 0 || s > bestS:
			best, bestS, ties = i, s, 1
		case s == bestS:
			ties++
			if p.rnd.intn(ties) == 0 {
				best = i
			}
		}
	}
	if best < 0 {
		return 0
	}
	return best
}

// Routed implements Observer.
func (p *LLMDPredicted) Routed(in *Input, d Decision) { p.k.Routed(in, d) }

var _ Observer = (*LLMDPredicted)(nil)
