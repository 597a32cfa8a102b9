package sim

import (
	"time"

	"github.com/kvroute/kvroute/internal/admission"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/request"
)

// Hold configures late binding in a run: the router holds a request while
// every engine has at least Tokens of prefill routed to it and not yet
// started (the admission queue's max_pending_prefill_tokens_per_backend),
// and binds held requests, in the queue's Order, when a first token or a
// completion frees an engine. Binding is an ordinary routing decision, at
// that moment: the hold decides when, the policy still decides where.
//
// The decision is the live router's own: an admission.Gate, which the live
// admission Controller wraps with its lock and channels, driven here in
// virtual time. A request the gate grants is routed Transit later, and
// its grant released then: meanwhile the gate grants nobody else and
// every arrival waits (see admission.Gate), as live while the router
// routes a granted request (or does any other work between the grant and
// the routing, such as a tokenizer call).
type Hold struct {
	// Tokens is the per-engine bound of queued prefill, in tokens.
	Tokens int64
	// Order, Slack and Cap order the held requests (admission.Queue).
	Order admission.Order
	Slack float64
	Cap   time.Duration
	// Transit is the time from a grant to the routing of the request
	// granted (work the router does in between); 0 routes it at the
	// grant's instant, as a live router routes in microseconds.
	Transit time.Duration
}

// held is one request the router holds.
type held struct {
	k      int
	v      *request.View
	hashes []uint64
}

// gate returns the hold's admission gate over the healthy backends of f.
func (h *Hold) gate(f *fleet.Fleet) *admission.Gate {
	lim := admission.Limits{MaxPendingPrefill: h.Tokens}
	return admission.NewGate(h.Order, h.Slack, h.Cap, lim.Saturated(f))
}

// hold reports true when late binding is on and the k-th request may not
// go at once (see admission.Gate.GoesNow): it then waits in the gate, and
// the gate grants what it can, as the live queue does when a request joins
// it. Every request has priority 0 and one tenant: the simulated clients
// send neither.
func (s *sim) hold(k int, v *request.View, hashes []uint64) bool {
	if s.held == nil {
		return false
	}
	now := Epoch.Add(s.now)
	if s.held.GoesNow(v.Model, 0, now) {
		return false
	}
	hs := hashes
	if hs == nil {
		hs = s.sched.Hashes(v)
	}
	s.held.Wait(&admission.Entry{
		Model:    v.Model,
		Enqueued: now,
		Cost:     admission.Cost(s.sched.Uncached(v, hs)),
		// A request's TTFT objective is its deadline (docs/routing.md,
		// "Objectives").
		Objective: v.Objective.TTFT,
		Value:     &held{k: k, v: v, hashes: hashes},
	})
	s.bindHeld()
	return true
}

// bindHeld routes the held requests the gate grants, one at a time: each
// is routed Hold.Transit after its grant (at once without), which puts its
// load where the gate's saturation rule reads it, and then releases its
// grant, which lets the gate grant the next.
func (s *sim) bindHeld() {
	if s.held == nil {
		return
	}
	now := Epoch.Add(s.now)
	for e := s.held.Grant(now); e != nil; e = s.held.Grant(now) {
		s.granted = e.Value.(*held)
		if s.cfg.Hold.Transit > 0 {
			s.push(s.now+s.cfg.Hold.Transit, evBind, 0)
			return
		}
		s.routeGranted()
	}
}

// bindGranted routes the granted request at the end of its transit, and
// grants the next.
func (s *sim) bindGranted() {
	s.routeGranted()
	s.bindHeld()
}

// routeGranted routes the request whose grant is in transit and releases
// the grant.
func (s *sim) routeGranted() {
	h := s.granted
	s.granted = nil
	s.bind(h.k, h.v, h.hashes)
	s.held.Release()
}

// finish fails the requests still held when no event is left to bind
// them; with engines that always finish their work there are none.
func (s *sim) finish() {
	if s.held == nil {
		return
	}
	for _, e := range s.held.Flush() {
		h := e.Value.(*held)
		s.fail(h.k, h.v.PromptTokens, 0, "held in the router at the end of the run")
	}
}
