package lifecycle

import (
	"time"

	"github.com/kvroute/kvroute/internal/scheduler"
	"github.com/kvroute/kvroute/internal/slo"
)

// Attainment is what a settled request with latency objectives attained:
// the one place that decides whether its objectives were met, how many of
// its tokens are goodput and how far its prediction was from what was
// observed, whatever front carried it (the router's relay or a data plane
// that reported the answer's phases). Settle hands it to Plane.Attained.
type Attainment struct {
	// Model is the request's model (its metric label), Class its
	// criticality.
	Model string
	Class slo.Class
	// Shed is set for a sheddable request refused at once because no
	// backend was predicted to meet its objectives; nothing else is.
	Shed bool
	// Judged is set for a request served whole (a complete 2xx body):
	// Met is what it attained. A request not judged (an error, a
	// refusal, a client that left, a body cut) met none of its
	// objectives.
	Judged bool
	Met    slo.Attained
	// Goodput is the output tokens of a request within both objectives.
	Goodput int
	// Backend is the backend of the request's last leg, and TTFTRatio and
	// ITLRatio its observed over predicted latencies, 0 when either side
	// is unknown.
	Backend             string
	TTFTRatio, ITLRatio float64
}

// attainment is what settled r, its body ended as end, attained; false
// when it has no objectives, and for a request whose data plane never
// reported its answer (Unreported: neither met nor missed, it is not
// recorded at all).
func (r *Request) attainment(end BodyEnd) (Attainment, bool) {
	if r.View == nil || r.View.Objective.None() || r.unreported {
		return Attainment{}, false
	}
	o := r.View.Objective
	a := Attainment{Model: r.Model, Class: o.Class}
	if r.Code == scheduler.CodeShed {
		a.Shed = true
		return a, true
	}
	if r.Status/100 != 2 || !end.Complete || len(r.Legs) == 0 {
		return a, true
	}
	var itl time.Duration
	if end.Out > 1 {
		itl = end.Decoding / time.Duration(end.Out-1)
	}
	a.Judged, a.Met = true, o.Judge(r.TTFT, itl)
	if a.Met.Both() {
		a.Goodput = end.Out
	}
	last := r.Legs[len(r.Legs)-1].A
	if last == nil {
		return a, true
	}
	a.Backend = last.Backend.Name
	if p := last.Pred; p.TTFT > 0 && r.TTFT > 0 {
		a.TTFTRatio = r.TTFT.Seconds() / p.TTFT
	}
	if p := last.Pred; p.ITL > 0 && itl > 0 {
		a.ITLRatio = itl.Seconds() / p.ITL
	}
	return a, true
}

// attained hands a settled request's attainment to Plane.Attained.
func (p *Plane) attained(r *Request, end BodyEnd) {
	if p.Attained == nil {
		return
	}
	if a, ok := r.attainment(end); ok {
		p.Attained(a)
	}
}
