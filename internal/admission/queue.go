package admission

import (
	"fmt"
	"slices"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
)

// Order is how the waiters of one tenant at one priority are taken.
type Order int

const (
	// FCFS takes them first come, first served.
	FCFS Order = iota
	// Deadline takes them earliest deadline first, a waiter's deadline
	// being its arrival plus Slack times its own cost (see Entry.Cost),
	// at most Cap: a short prompt overtakes a long one that arrived less
	// than that before it, and never one that arrived earlier. This is
	// the weighted-shortest-processing-time order (cost over weight) with
	// an aging term: key = cost - age/Slack, whose order does not change
	// with time and equals the deadline's. What a waiter can lose to
	// being overtaken is therefore bounded: only requests that arrive
	// within min(Slack x its own cost, Cap) after it pass it.
	Deadline
)

// DefaultSlack and DefaultCap are the Deadline order's slack and cap,
// measured on the Mooncake trace, a burst of it and the built-in workloads
// (docs/routing.md, "Late binding"): without the cap, a 100k-token prompt
// (10 s at the default rate) could be passed by 40 s of arrivals, which
// raised p99 TTFT by a third in a burst.
const (
	DefaultSlack = 4.0
	DefaultCap   = 5 * time.Second
)

// ParseOrder reads an order's name: "fcfs" or "deadline".
func ParseOrder(s string) (Order, error) {
	switch s {
	case "", "fcfs":
		return FCFS, nil
	case "deadline":
		return Deadline, nil
	}
	return FCFS, fmt.Errorf("order %q: want fcfs or deadline", s)
}

// String returns the order's name as ParseOrder reads it.
func (o Order) String() string {
	if o == Deadline {
		return "deadline"
	}
	return "fcfs"
}

// Cost is the time a request's uncached prompt tokens take to prefill on
// an idle backend at the fleet's default rate: its own share of work, what
// the Deadline order weighs it by. The live router and the simulator
// compute it the same way, from the scheduler's prefix match.
func Cost(uncachedTokens int) time.Duration {
	return time.Duration(float64(max(uncachedTokens, 1)) / fleet.DefaultPrefillRate * float64(time.Second))
}

// Entry is one waiter of a Queue. The caller fills the exported fields
// before Push and must not change them while the entry is queued.
type Entry struct {
	// Model is the model the request asks for; Next skips entries whose
	// model is not ready.
	Model string
	// Priority: higher is taken first.
	Priority int
	// Tenant is the fairness key (see Tenant).
	Tenant string
	// Enqueued is when the request started waiting.
	Enqueued time.Time
	// Cost is the request's own work (see Cost), for the Deadline order.
	Cost time.Duration
	// Objective, when positive, is the request's own time to first token
	// objective (package slo): the Deadline order then takes its
	// deadline as Enqueued + Objective, the promise it was made, in place
	// of the slack times its cost.
	Objective time.Duration
	// Value is the caller's.
	Value any

	key    time.Time // the tenant queue's sort key: the deadline, or zero
	seq    uint64    // arrival order, the tie break
	queued bool
}

// Queue is the order in which waiting requests are taken: by priority
// (higher first), then round robin across the tenants with waiters at that
// priority, then within a tenant by the queue's Order. It is pure: no
// clock, no lock, no goroutine. The live admission Controller keeps one
// under its lock, and the simulator drives one in virtual time; both take
// waiters with Next when capacity frees up.
type Queue struct {
	order Order
	slack float64
	cap   time.Duration
	// levels are the non-empty priority levels, highest first.
	levels []*level
	n      int
	seq    uint64
}

// level is the waiters of one priority.
type level struct {
	prio    int
	tenants map[string]*tenantQueue
	// ring is the tenants with waiters, served round robin from next.
	ring []*tenantQueue
	next int
}

// tenantQueue is one tenant's waiters at one priority, in the queue's
// order.
type tenantQueue struct {
	name    string
	entries []*Entry
}

// NewQueue returns an empty queue taking each tenant's waiters in order o;
// slack and limit are the Deadline order's slack and cap (DefaultSlack and
// DefaultCap when not positive).
func NewQueue(o Order, slack float64, limit time.Duration) *Queue {
	if !(slack > 0) {
		slack = DefaultSlack
	}
	if limit <= 0 {
		limit = DefaultCap
	}
	return &Queue{order: o, slack: slack, cap: limit}
}

// Len returns the number of waiters.
func (q *Queue) Len() int { return q.n }

// WaitingAtOrAbove reports whether a waiter of priority p or higher waits.
func (q *Queue) WaitingAtOrAbove(p int) bool {
	return len(q.levels) > 0 && q.levels[0].prio >= p
}

// before reports whether a is taken before b within one tenant.
func (q *Queue) before(a, b *Entry) bool {
	if !a.key.Equal(b.key) {
		return a.key.Before(b.key)
	}
	return a.seq < b.seq
}

// Push adds e. Pushing an entry that is already queued does nothing.
func (q *Queue) Push(e *Entry) {
	if e == nil || e.queued {
		return
	}
	q.seq++
	e.seq = q.seq
	e.key = time.Time{}
	if q.order == Deadline {
		// In float64 seconds first, so that a huge cost cannot overflow.
		lead := min(q.slack*max(e.Cost, 0).Seconds(), q.cap.Seconds())
		e.key = e.Enqueued.Add(time.Duration(lead * float64(time.Second)))
		if e.Objective > 0 {
			e.key = e.Enqueued.Add(e.Objective)
		}
	}
	i, found := slices.BinarySearchFunc(q.levels, e.Priority, func(l *level, p int) int { return p - l.prio })
	if !found {
		q.levels = slices.Insert(q.levels, i, &level{prio: e.Priority, tenants: map[string]*tenantQueue{}})
	}
	l := q.levels[i]
	tq := l.tenants[e.Tenant]
	if tq == nil {
		tq = &tenantQueue{name: e.Tenant}
		l.tenants[e.Tenant] = tq
	}
	if len(tq.entries) == 0 {
		// A tenant that joins the ring goes last in the current round, so
		// it cannot cut ahead of tenants already waiting their turn.
		if l.next == 0 {
			l.ring = append(l.ring, tq)
		} else {
			l.ring = slices.Insert(l.ring, l.next, tq)
			l.next++
		}
	}
	at, _ := slices.BinarySearchFunc(tq.entries, e, func(x, t *Entry) int {
		if q.before(x, t) {
			return -1
		}
		return 1
	})
	tq.entries = slices.Insert(tq.entries, at, e)
	e.queued = true
	q.n++
}

// Remove takes e out of the queue wherever it is, and reports whether it
// was queued.
func (q *Queue) Remove(e *Entry) bool {
	if e == nil || !e.queued {
		return false
	}
	li := slices.IndexFunc(q.levels, func(l *level) bool { return l.prio == e.Priority })
	if li < 0 {
		return false
	}
	l := q.levels[li]
	tq := l.tenants[e.Tenant]
	if tq == nil {
		return false
	}
	i := slices.Index(tq.entries, e)
	if i < 0 {
		return false
	}
	tq.entries = slices.Delete(tq.entries, i, i+1)
	e.queued = false
	q.n--
	if len(tq.entries) > 0 {
		return true
	}
	delete(l.tenants, tq.name)
	ri := slices.Index(l.ring, tq)
	l.ring = slices.Delete(l.ring, ri, ri+1)
	if ri < l.next {
		l.next--
	}
	if l.next >= len(l.ring) {
		l.next = 0
	}
	if len(l.ring) == 0 {
		q.levels = slices.Delete(q.levels, li, li+1)
	}
	return true
}

// Next removes and returns the first waiter, in queue order, whose model
// ready reports true for, or nil when there is none. A waiter whose model
// is not ready does not hold up the waiters of another model behind it.
// ready is called at most once per model in one call of Next.
func (q *Queue) Next(ready func(model string) bool) *Entry {
	if q.n == 0 {
		return nil
	}
	var memo map[string]bool
	ok := func(model string) bool {
		if r, seen := memo[model]; seen {
			return r
		}
		if memo == nil {
			memo = map[string]bool{}
		}
		r := ready(model)
		memo[model] = r
		return r
	}
	for _, l := range q.levels {
		for k := range len(l.ring) {
			ri := (l.next + k) % len(l.ring)
			for _, e := range l.ring[ri].entries {
				if !ok(e.Model) {
					continue
				}
				// The next turn goes to the tenant after this one.
				l.next = ri + 1
				if l.next >= len(l.ring) {
					l.next = 0
				}
				q.Remove(e)
				return e
			}
		}
	}
	return nil
}

// Late binding's defaults (admission.late_binding): hold a request while
// every backend has DefaultHoldTokens of prefill routed to it and not yet
// started, four steps of chunked prefill (4 x 8,192 tokens, vLLM's
// max_num_batched_tokens), and take the held requests in DefaultHoldOrder.
// Two steps held more often: on the whole Mooncake trace p99 0.5% higher
// at load 0.5 and 0.3 points of hit rate lost at every load; eight steps
// hardly ever held below 0.9 and were 8% worse at 0.7 (docs/routing.md).
const (
	DefaultHoldTokens = 4 * 8192
	DefaultHoldOrder  = Deadline
)
