package slo

import "time"

// Prediction is one candidate's predicted latencies for a request, in
// seconds: its time to first token and its mean inter-token latency.
type Prediction struct {
	TTFT, ITL float64
}

// Meets reports whether p is within o's objectives (an unset one is
// always met).
func (o Objective) Meets(p Prediction) bool {
	return (o.TTFT <= 0 || p.TTFT <= o.TTFT.Seconds()) && (o.ITL <= 0 || p.ITL <= o.ITL.Seconds())
}

// Headroom is p's slack within o as a share of the objective: the smaller
// of (objective - predicted) / objective over the objectives set; negative
// when one is missed, 1 with none set.
func (o Objective) Headroom(p Prediction) float64 {
	h := 1.0
	if o.TTFT > 0 {
		t := o.TTFT.Seconds()
		h = min(h, (t-p.TTFT)/t)
	}
	if o.ITL > 0 {
		t := o.ITL.Seconds()
		h = min(h, (t-p.ITL)/t)
	}
	return h
}

// Choice is Choose's answer.
type Choice struct {
	// Index is the candidate to route to; -1 when the request is shed.
	Index int
	// Met is set when the candidate is predicted to meet the objectives.
	Met bool
}

// Shed reports whether the request is to be refused.
func (c Choice) Shed() bool { return c.Index < 0 }

// Margin is the factor a prediction is scaled by before it is held
// against an objective when choosing (Choose): the cost model's TTFT
// prediction errs low by a median of 1.2x and a 90th percentile of 1.7-1.9x
// in the simulator (docs/benchmarks.md, "Objectives"), so a candidate
// predicted to meet an objective with less than half of it to spare is a
// coin toss. A candidate that meets it only without the margin is still
// taken for a request that may not be shed.
const Margin = 1.5

// Choose is kvroute's rule for a request with objectives o (a sheddable
// one as Reserve holds it), given each candidate's prediction and the
// index of the candidate the policy picks without objectives:
//
//  1. among the candidates predicted to meet both objectives with Margin
//     to spare, a sheddable request takes the one with the least headroom
//     (Headroom: llm-d's "least", packing the loose work onto the busiest
//     engines that can still serve it), and any other request the one
//     with the most (the engines with room, where a misprediction costs
//     least);
//  2. else, a sheddable request is refused (Index -1): it would be served
//     late, or take capacity the others need;
//  3. else, a request that may not be shed takes the candidate that meets
//     both without the margin with the most headroom, and when none does,
//     the policy's pick: the best effort, which keeps what the policy
//     weighs beyond latency (a conversation's cache, the fleet's cost of
//     recomputing a prompt).
func Choose(o Objective, preds []Prediction, pick int) Choice {
	shed := o.Class == Sheddable
	if i := mostHeadroom(o, preds, Margin, shed); i >= 0 {
		return Choice{Index: i, Met: true}
	}
	if shed {
		return Choice{Index: -1}
	}
	if i := mostHeadroom(o, preds, 1, false); i >= 0 {
		return Choice{Index: i, Met: true}
	}
	return Choice{Index: pick}
}

// mostHeadroom is the candidate predicted to meet o with its predictions
// scaled by margin that has the most headroom left (the least, when
// least); -1 when none meets o.
func mostHeadroom(o Objective, preds []Prediction, margin float64, least bool) int {
	best, bestH := -1, 0.0
	for i, p := range preds {
		q := Prediction{TTFT: p.TTFT * margin, ITL: p.ITL * margin}
		if !o.Meets(q) {
			continue
		}
		if h := o.Headroom(q); best < 0 || (least && h < bestH) || (!least && h > bestH) {
			best, bestH = i, h
		}
	}
	return best
}

// Attained is what a served request reached of its objectives.
type Attained struct {
	TTFT, ITL bool
}

// Both reports whether both objectives were met.
func (a Attained) Both() bool { return a.TTFT && a.ITL }

// Judge reports which of o's objectives a request met, given its time to
// first token and its mean inter-token latency (0 for a stream of one
// token, which meets any ITL objective).
func (o Objective) Judge(ttft, itl time.Duration) Attained {
	return Attained{TTFT: o.TTFT <= 0 || ttft <= o.TTFT, ITL: o.ITL <= 0 || itl <= o.ITL}
}

// RetryAfter is the Retry-After, in whole seconds (at least 1), a shed
// request is told: the time the best candidate was predicted to need
// beyond the objective, when it had one.
func RetryAfter(o Objective, best Prediction) int {
	over := best.TTFT - o.TTFT.Seconds()
	if o.TTFT <= 0 || over < 1 {
		return 1
	}
	return int(min(over, 3600)) + 1
}
