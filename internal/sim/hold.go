package sim

import (
	"time"

	"github.com/kvroute/kvroute/internal/admission"
	"github.com/kvroute/kvroute/internal/request"
)

// Hold configures late binding in a run: the router holds a request while
// every engine has at least Tokens of prefill routed to it and not yet
// started (the admission queue's max_pending_prefill_tokens_per_backend),
// and binds held requests, in the queue's Order, when a first token or a
// completion frees an engine. Binding is an ordinary routing decision, at
// that moment: the hold decides when, the policy still decides where.
type Hold struct {
	// Tokens is the per-engine bound of queued prefill, in tokens.
	Tokens int64
	// Order, Slack and Cap order the held requests (admission.Queue).
	Order admission.Order
	Slack float64
	Cap   time.Duration
}

// held is one request the router holds.
type held struct {
	k      int
	v      *request.View
	hashes []uint64
}

// limits are the hold's admission limits.
func (h *Hold) limits() admission.Limits {
	return admission.Limits{MaxPendingPrefill: h.Tokens}
}

// hold queues the k-th request in the router and reports true when late
// binding is on and it must wait: others wait already, or every engine is
// at the bound. It then binds what it can, as the live queue does when a
// request joins it.
func (s *sim) hold(k int, v *request.View, hashes []uint64) bool {
	if s.held == nil {
		return false
	}
	now := Epoch.Add(s.now)
	if s.held.Len() == 0 && !s.cfg.Hold.limits().SaturatedAt(s.fleet.Snapshot().Healthy, v.Model, now) {
		return false
	}
	hs := hashes
	if hs == nil {
		hs = s.sched.Hashes(v)
	}
	s.held.Push(&admission.Entry{
		Model:    v.Model,
		Enqueued: now,
		Cost:     admission.Cost(s.sched.Uncached(v, hs)),
		Value:    &held{k: k, v: v, hashes: hashes},
	})
	s.bindHeld()
	return true
}

// bindHeld routes held requests, in the queue's order, while an engine is
// below the bound.
func (s *sim) bindHeld() {
	if s.held == nil || s.held.Len() == 0 {
		return
	}
	lim := s.cfg.Hold.limits()
	now := Epoch.Add(s.now)
	ready := func(model string) bool { return !lim.SaturatedAt(s.fleet.Snapshot().Healthy, model, now) }
	for {
		e := s.held.Next(ready)
		if e == nil {
			return
		}
		h := e.Value.(*held)
		s.bind(h.k, h.v, h.hashes)
	}
}

// finish fails the requests still held when no event is left to bind
// them; with engines that always finish their work there are none.
func (s *sim) finish() {
	if s.held == nil {
		return
	}
	for s.held.Len() > 0 {
		e := s.held.Next(func(string) bool { return true })
		h := e.Value.(*held)
		s.fail(h.k, h.v.PromptTokens, 0, "held in the router at the end of the run")
	}
}
