package lifecycle

import (
	"errors"
	"net/http"
	"time"

	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/scheduler"
)

// Route takes a parsed request (View, Body, Hashes set) to its backends:
// its token ids first (the front's Tokenize: a /tokenize call may take its
// whole timeout, which must not be spent holding an admission grant, or
// the queue admits nobody meanwhile), then admission, then one decision
// per leg, then the grant's release. It reports false when the request
// was answered instead (rejected, refused, or its client gone).
func (p *Plane) Route(r *Request) bool {
	if !r.Passthrough {
		r.Keys = r.front.Tokenize(r)
	}
	release, e := r.front.Admit(r)
	if e != nil {
		r.Reject(e)
		return false
	}
	defer release() // the request's load is accounted (or it failed to route)
	for i := range r.Legs {
		l := &r.Legs[i]
		a, err := p.route(r, l, r.Start)
		if err != nil && l.Optional && i < len(r.Legs)-1 {
			l.skipped = true
			continue
		}
		if err != nil && i > 0 {
			// A later leg found no backend (its engines ejected, say):
			// the request is served whole where the fleet allows it,
			// and its refusal is charged to no engine of an earlier leg.
			return p.routeWhole(r, err)
		}
		if err != nil {
			r.Reject(routeError(err, r.View))
			return false
		}
		p.assign(r, l, a)
	}
	p.counted(r)
	return true
}

// routeWhole routes a split request one of whose later legs found no
// backend (err) as one whole request: the legs routed so far are
// released, and the request gets its one plain leg, routed on its own
// view (the roles filter lets a whole request go to an engine of any
// role that serves it whole). It reports false, the request rejected with
// no backend's name, when none can take it.
func (p *Plane) routeWhole(r *Request, err error) bool {
	now := time.Now()
	for i := range r.Legs {
		if a := r.Legs[i].A; a != nil {
			a.Done(now)
		}
	}
	r.Whole = wholeNoLeg + r.Legs[len(r.Legs)-1].Role + " engine"
	r.one = [1]Leg{}
	r.SetLegs(r.one[:]...)
	a, werr := p.route(r, &r.Legs[0], now)
	if werr != nil {
		r.Reject(routeError(err, r.View))
		return false
	}
	p.assign(r, &r.Legs[0], a)
	p.counted(r)
	return true
}

// wholeNoLeg starts the Whole of a request served whole because a later
// leg found no backend.
const wholeNoLeg = "no backend for its "

// counted counts a routed request once (Routed), with the decision of its
// first leg routed: the engine that computes its prompt.
func (p *Plane) counted(r *Request) {
	if p.Routed == nil {
		return
	}
	for i := range r.Legs {
		if a := r.Legs[i].A; a != nil {
			p.Routed(r.View, a)
			return
		}
	}
}

// route asks the scheduler for a backend for leg l, away from those it
// tried, in a route span of its own: a retry's decision is traced as the
// first one.
func (p *Plane) route(r *Request, l *Leg, now time.Time) (*scheduler.Assignment, error) {
	r.trace.RouteStart()
	v := l.View
	if v == nil {
		v = r.View
	}
	a, err := p.Sched.RoutePrecise(v, r.Hashes, r.Keys, l.Tried, now)
	r.trace.RouteEnd(a, err)
	return a, err
}

// assign makes a leg l's current assignment (a retry's too; the request
// is counted once, by Route).
func (p *Plane) assign(r *Request, l *Leg, a *scheduler.Assignment) {
	l.A, l.Target = a, p.Set.Of(a.Backend)
}

// routeError maps the scheduler's errors to client errors.
func routeError(err error, v *request.View) *openai.Error {
	model := v.Model
	if se, ok := errors.AsType[*scheduler.ShedError](err); ok {
		return se.OpenAI() // a sheddable request no backend can serve in time
	}
	switch {
	case errors.Is(err, scheduler.ErrResponseGone):
		// The engine's own answer for a response it does not hold: no
		// engine left in the fleet holds it.
		return openai.ResponseNotFound(v.PreviousResponseID)
	case errors.Is(err, scheduler.ErrUnknownModel):
		return &openai.Error{Status: http.StatusNotFound, Type: openai.TypeNotFound, Code: "model_not_found",
			Message: "the model '" + model + "' does not exist on any backend"}
	case errors.Is(err, scheduler.ErrNoBackend):
		return &openai.Error{Status: http.StatusServiceUnavailable, Type: openai.TypeUnavailable, Code: "no_healthy_backend",
			Message: "no healthy backend serves the model '" + model + "'", RetryAfter: 1}
	}
	return &openai.Error{Status: http.StatusInternalServerError, Type: openai.TypeServer, Code: "routing_error", Message: err.Error()}
}
