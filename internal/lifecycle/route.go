package lifecycle

import (
	"errors"
	"net/http"
	"time"

	"github.com/kvroute/kvroute/internal/openai"
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
		if err != nil {
			r.Reject(routeError(err, r.View.Model))
			return false
		}
		p.assign(r, l, a)
	}
	return true
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

// assign makes a leg l's current assignment.
func (p *Plane) assign(r *Request, l *Leg, a *scheduler.Assignment) {
	l.A, l.Target = a, p.Set.Of(a.Backend)
	if p.Routed != nil {
		p.Routed(r.View, a)
	}
}

// routeError maps the scheduler's errors to client errors.
func routeError(err error, model string) *openai.Error {
	switch {
	case errors.Is(err, scheduler.ErrUnknownModel):
		return &openai.Error{Status: http.StatusNotFound, Type: openai.TypeNotFound, Code: "model_not_found",
			Message: "the model '" + model + "' does not exist on any backend"}
	case errors.Is(err, scheduler.ErrNoBackend):
		return &openai.Error{Status: http.StatusServiceUnavailable, Type: openai.TypeUnavailable, Code: "no_healthy_backend",
			Message: "no healthy backend serves the model '" + model + "'", RetryAfter: 1}
	}
	return &openai.Error{Status: http.StatusInternalServerError, Type: openai.TypeServer, Code: "routing_error", Message: err.Error()}
}
