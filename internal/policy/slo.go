package policy

import (
	"github.com/kvroute/kvroute/internal/costmodel"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/slo"
)

// A request with objectives (Input.Objective) is routed by headroom and
// admitted by promise: each candidate's predicted time to first token is
// its estimate (est: the queue ahead, its own uncached prefill, the
// scorers' seconds, a split's transfer among them) and its predicted
// inter-token latency the decode batch it joins (predictITL), both from
// the candidate's learned cost model; slo.Choose then keeps the pick when
// it keeps the promise, or moves the request to the candidate with the
// least headroom that does, or sheds a sheddable request none can serve
// in time. docs/routing.md, "Objectives".

func init() {
	register("kvroute-slo-blind", func(o Options) Policy { return &SLOBlind{k: NewKVRoute(o)} })
}

// SLOBlind is kvroute routing every request as if it had no objectives:
// the baseline objectives are measured against (kvroute sim, compare).
type SLOBlind struct{ k *KVRoute }

// Name implements Policy.
func (*SLOBlind) Name() string { return "kvroute-slo-blind" }

// Pick implements Policy.
func (p *SLOBlind) Pick(in *Input) Decision {
	in.Objective = slo.Objective{}
	return p.k.Pick(in)
}

// Routed implements Observer.
func (p *SLOBlind) Routed(in *Input, d Decision) { p.k.Routed(in, d) }

// LearnSession implements SessionLearner.
func (p *SLOBlind) LearnSession(c Claim, id int) { p.k.LearnSession(c, id) }

// SessionOf implements SessionLearner.
func (p *SLOBlind) SessionOf(h uint64) (int, Claim) { return p.k.SessionOf(h) }

// predictITL is candidate b's predicted inter-token latency for a request
// of prompt tokens and an output budget of budget (0: the default) that
// joins its decoding batch (load l), costed at co, chunk tokens a step:
// the cost model's (costmodel.Coeffs.ITL), plus what the engine's own
// recent inter-token latency (fleet.Backend.EngineDecodeTime) shows
// beyond its batch's decode step: the prefill of the requests that keep
// arriving there, which the load at routing cannot show.
func predictITL(b *fleet.Backend, co costmodel.Coeffs, l *fleet.Load, prompt, budget, chunk int64) float64 {
	if budget <= 0 {
		budget = request.DefaultOutputBudget
	}
	ctx := float64(l.DecodeTokens)
	itl := co.ITL(float64(l.Decoding+1), ctx+float64(prompt+budget/2), l.PendingPrefill, chunk, budget)
	if seen := b.EngineDecodeTime(); seen > 0 {
		itl += max(seen-co.DecodeStep(float64(max(l.Decoding, 1)), ctx), 0)
	}
	return itl
}

// promise applies slo.Choose to the candidates c (estimated with their
// ITL) and the pick d made without objectives.
func (p *KVRoute) promise(in *Input, c []candidate, d Decision) Decision {
	preds := make([]slo.Prediction, len(c))
	for k := range c {
		preds[c[k].i] = slo.Prediction{TTFT: c[k].est, ITL: c[k].itl}
	}
	p.reserve.Note(in.Objective, in.Now)
	return decideBy(p.reserve.Hold(in.Objective, in.Now), preds, d)
}

// decideBy is d after slo.Choose over preds (indexed as the candidates).
func decideBy(o slo.Objective, preds []slo.Prediction, d Decision) Decision {
	ch := slo.Choose(o, preds, d.Index)
	if ch.Shed() {
		best := 0
		for i := range preds {
			if preds[i].TTFT < preds[best].TTFT {
				best = i
			}
		}
		return Decision{Index: best, EstTTFT: preds[best].TTFT, Pred: preds[best], Shed: true, Note: "shed"}
	}
	if ch.Index != d.Index {
		d = Decision{Index: ch.Index, EstTTFT: preds[ch.Index].TTFT, Note: "headroom"}
	}
	d.Pred, d.Met = preds[d.Index], ch.Met
	return d
}

var (
	_ Observer       = (*SLOBlind)(nil)
	_ SessionLearner = (*SLOBlind)(nil)
)
