package admission

import "time"

// Gate is the admission decision as pure code: whether an arriving request
// goes at once, and which waiter is granted next when capacity frees up. It
// holds the waiters (a Queue) and whether a grant is in transit: a waiter
// granted whose load does not show yet in what saturated reads, because it
// is not routed yet. It has no clock, no lock and no goroutine, and time is
// given: the live Controller keeps one under its lock, with the timers and
// channels of its waiting clients, and the simulator (late binding) drives
// one in virtual time. Both therefore admit by the same rule:
//
//   - A request goes at once only when no grant is in transit, nobody of
//     its priority or higher waits, and its model is not saturated.
//   - A waiter is granted only when no grant is in transit.
//
// Until a granted request is routed, saturated still reads the capacity it
// was granted as free: a second grant, or an arrival let through, would
// take the same capacity again. So one freed slot admits one request, and
// an arrival never passes a waiter that was granted but is not routed yet.
// The price is that grants are serial: the time from a grant to its
// release (routing) bounds how fast the queue drains, so nothing slow (a
// tokenizer call) may run between the two.
type Gate struct {
	q         *Queue
	saturated func(model string, now time.Time) bool
	transit   bool
}

// NewGate returns a gate with no waiters, whose waiters are taken in the
// order of NewQueue(o, slack, limit), and whose requests for a model are
// held while saturated(model, now) reports true.
func NewGate(o Order, slack float64, limit time.Duration, saturated func(model string, now time.Time) bool) *Gate {
	return &Gate{q: NewQueue(o, slack, limit), saturated: saturated}
}

// Len returns the number of waiters.
func (g *Gate) Len() int { return g.q.Len() }

// Idle reports whether nobody waits and no grant is in transit: then a
// request goes at once exactly when its model is not saturated, which lets
// the live Controller decide without its lock.
func (g *Gate) Idle() bool { return g.q.Len() == 0 && !g.transit }

// GoesNow reports whether a request for model at priority arriving at now
// may go at once, without waiting: no grant is in transit, nobody of its
// priority or higher waits, and model is not saturated. A request that
// goes at once holds no grant and releases nothing.
func (g *Gate) GoesNow(model string, priority int, now time.Time) bool {
	return !g.transit && !g.q.WaitingAtOrAbove(priority) && !g.saturated(model, now)
}

// Wait queues e, a request that may not go at once (see GoesNow), filled
// in as Queue.Push requires. The caller then calls Grant: capacity may be
// free for the waiters ahead of it (for another model).
func (g *Gate) Wait(e *Entry) { g.q.Push(e) }

// Leave takes e out of the queue, when its client went away or it waited
// its limit, and reports whether it was still queued (not granted).
func (g *Gate) Leave(e *Entry) bool { return g.q.Remove(e) }

// Grant removes and returns the waiter to admit at now, or nil: none while
// a grant is in transit, else the first in queue order whose model is not
// saturated. The caller must call Release once for the waiter granted, as
// soon as its load shows in what saturated reads (right after routing), or
// when it gives the request up before that; then Grant again.
func (g *Gate) Grant(now time.Time) *Entry {
	if g.transit || g.q.Len() == 0 {
		return nil
	}
	e := g.q.Next(func(model string) bool { return !g.saturated(model, now) })
	g.transit = e != nil
	return e
}

// Release ends the grant in transit (see Grant). The caller calls it once
// per grant: a second call would end the next waiter's grant early, and
// let a third request take the capacity that one was granted.
func (g *Gate) Release() { g.transit = false }

// Flush removes every waiter, in queue order, for a caller that stops
// (the simulator at the end of a run), and returns them.
func (g *Gate) Flush() []*Entry {
	out := make([]*Entry, 0, g.q.Len())
	for e := g.q.Next(func(string) bool { return true }); e != nil; e = g.q.Next(func(string) bool { return true }) {
		out = append(out, e)
	}
	return out
}
