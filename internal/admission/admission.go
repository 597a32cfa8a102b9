// Package admission owns the router's admission queue: when every backend
// that could serve a request is saturated, the request waits here instead
// of being piled onto an engine that is already behind. The queue is
// ordered by priority (higher first) and, within one priority, fair across
// tenants (round robin between the tenants' queues, each first come first
// served or earliest deadline first; see Queue). A waiter leaves
// when capacity frees up, when it has waited its limit (429), or when its
// client goes away; a request that finds the queue full gets 429 at once.
//
// The package decides nothing about where a request goes (package
// scheduler does) and does no network I/O. What "saturated" means is given
// by the caller: a function of the model, usually Limits.Saturated over the
// fleet's load accounting and the engines' reported queues.
//
// A nil *Controller admits everything at no cost, which is how the proxy
// runs when no limit is configured.
//
// The admission decision (Gate: who goes at once, who is granted next, and
// the grant in transit), the order of the waiters (Queue) and the rule that
// holds a request (Limits.SaturatedAt) are pure code, with the time given:
// the Controller wraps a Gate with a lock, timers and its waiters' channels
// for the live router, and the simulator drives one in virtual time (late
// binding: hold while every backend has four steps of prefill queued, bind
// as one frees up).
package admission

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/openai"
)

// Defaults of Config.
const (
	// DefaultMaxQueue bounds the waiters; beyond it requests get 429 at once.
	DefaultMaxQueue = 1024
	// DefaultMaxWait is how long a request may wait before it gets 429.
	DefaultMaxWait = 30 * time.Second
	// DefaultRecheck is the period of the re-check while anybody waits:
	// engine-reported queues change without an event the router sees.
	DefaultRecheck = 50 * time.Millisecond
	// DefaultEngineMaxAge is the age beyond which an engine's reported
	// state is too stale to declare a backend saturated.
	DefaultEngineMaxAge = 2 * time.Second
)

// PriorityHeader carries a request's priority: an integer, higher first,
// default 0. The router reads it only from trusted fronts (the proxy's
// credentials decide); this package only parses it.
const PriorityHeader = "X-Kvroute-Priority"

// Config tunes the queue. Zero fields take the defaults above.
type Config struct {
	// MaxQueue is the most requests that may wait at once.
	MaxQueue int
	// MaxWait is the longest a request waits before it gets 429.
	MaxWait time.Duration
	// Recheck is the period at which waiters are re-checked against
	// saturated while the queue is not empty.
	Recheck time.Duration
	// Order is how one tenant's waiters at one priority are taken: FCFS
	// (the zero value) or Deadline, with Slack and Cap (see Order; zero:
	// DefaultSlack and DefaultCap).
	Order Order
	Slack float64
	Cap   time.Duration
}

func (c Config) withDefaults() Config {
	if c.MaxQueue <= 0 {
		c.MaxQueue = DefaultMaxQueue
	}
	if c.MaxWait <= 0 {
		c.MaxWait = DefaultMaxWait
	}
	if c.Recheck <= 0 {
		c.Recheck = DefaultRecheck
	}
	return c
}

// Controller is the admission queue. Its methods are safe for concurrent
// use; a nil *Controller admits every request at once.
type Controller struct {
	cfg       Config
	saturated func(model string, now time.Time) bool
	m         *metrics

	// queued mirrors gate.Len() and idle gate.Idle(), so that Admit, Wake
	// and Len can skip the lock when nobody waits and no grant is in
	// transit, the common case.
	queued atomic.Int64
	idle   atomic.Bool

	mu sync.Mutex
	// gate decides: the waiters, in the order they are taken, and the
	// grant in transit.
	gate *Gate
	// ticking is whether the re-check goroutine runs; it runs only while
	// somebody waits, so an idle controller owns no goroutine.
	ticking bool
	// grantEvery is a moving average of the interval between grants from
	// the queue, from which Retry-After is estimated; 0 until known.
	grantEvery time.Duration
	lastGrant  time.Time
}

// waiter is one queued request.
type waiter struct {
	entry    Entry
	enqueued time.Time
	// ready is closed when the waiter is granted; granted is set under
	// Controller.mu at the same moment.
	ready    chan struct{}
	granted  bool
	released atomic.Bool
}

// New returns a controller that queues requests while saturated(model, now)
// reports true (Limits.Saturated gives one). saturated is called with the
// controller's lock held, so it must be quick and must not call back into
// the controller. Metrics are registered on reg unless it is nil.
func New(cfg Config, saturated func(model string, now time.Time) bool, reg prometheus.Registerer) (*Controller, error) {
	if saturated == nil {
		return nil, fmt.Errorf("admission: nil saturated function")
	}
	c := &Controller{cfg: cfg.withDefaults(), saturated: saturated, m: newMetrics(),
		gate: NewGate(cfg.Order, cfg.Slack, cfg.Cap, saturated)}
	c.idle.Store(true)
	if reg != nil {
		if err := c.m.register(reg); err != nil {
			return nil, fmt.Errorf("admission: register metrics: %w", err)
		}
	}
	return c, nil
}

// noRelease is the release of a request admitted without waiting.
func noRelease() {}

// Admit returns when the request may be routed. It returns at once when
// the model's backends are not all saturated, nobody of equal or higher
// priority waits (a newcomer never skips the queue past a waiter of its
// priority) and no waiter's grant is in transit (see Gate). Otherwise the
// request waits for capacity, and is taken in the queue's order (see
// Queue: in the Deadline order a short newcomer may be taken before a long
// request that arrived shortly before it).
//
// The error is an *openai.Error with status 429 when the queue is full or
// the request waited Config.MaxWait, or the context's error when the client
// went away while waiting (its place in the queue is freed at once).
//
// After a nil error the caller must call release exactly once, as soon as
// the request's load shows in what saturated reads (right after routing),
// or when it gives the request up before that. Until then no other waiter
// is admitted, so that one freed slot admits one request and not the whole
// queue. Further calls of release do nothing. Slow work (reading the body,
// tokenizing the prompt) therefore belongs before Admit: run while holding
// a grant, it would hold up every waiter behind it.
func (c *Controller) Admit(ctx context.Context, model string, priority int, tenant string) (release func(), err error) {
	return c.AdmitCost(ctx, model, priority, tenant, nil)
}

// AdmitCost is Admit for a request whose own work cost returns (see Cost),
// by which the Deadline order takes it. cost is called only when the
// request may have to wait and the order is Deadline, outside the
// controller's lock; nil is a cost of 0.
func (c *Controller) AdmitCost(ctx context.Context, model string, priority int, tenant string, cost func() time.Duration) (release func(), err error) {
	return c.AdmitBy(ctx, model, priority, tenant, cost, 0)
}

// AdmitBy is AdmitCost for a request with a time to first token objective
// (0 for none), which the Deadline order takes as its deadline
// (Entry.Objective).
func (c *Controller) AdmitBy(ctx context.Context, model string, priority int, tenant string, cost func() time.Duration, objective time.Duration) (release func(), err error) {
	if c == nil {
		return noRelease, nil
	}
	// Fast path: nobody waits and no grant is in transit, so the gate
	// lets the request go exactly when its model is not saturated.
	// Concurrent arrivals may all pass here at once; the limits are soft
	// by that much.
	if c.idle.Load() && !c.saturated(model, time.Now()) {
		return noRelease, nil
	}
	var own time.Duration
	if cost != nil && c.cfg.Order == Deadline {
		own = cost()
	}
	c.mu.Lock()
	now := time.Now()
	if c.gate.GoesNow(model, priority, now) {
		c.mu.Unlock()
		return noRelease, nil
	}
	if c.gate.Len() >= c.cfg.MaxQueue {
		ra := c.retryAfterLocked()
		c.mu.Unlock()
		c.m.rejections.WithLabelValues("full").Inc()
		return nil, &openai.Error{Status: http.StatusTooManyRequests, Type: openai.TypeRateLimit, Code: "queue_full", RetryAfter: ra,
			Message: fmt.Sprintf("every backend for model %q is saturated and the router's queue is full (%d waiting); retry later", model, c.cfg.MaxQueue)}
	}
	w := &waiter{entry: Entry{Model: model, Priority: priority, Tenant: tenant, Enqueued: now, Cost: own, Objective: objective}, enqueued: now, ready: make(chan struct{})}
	w.entry.Value = w
	c.gate.Wait(&w.entry)
	// Capacity may already be free for this model (the waiters ahead may be
	// for another one).
	c.dispatchLocked(now)
	if !c.ticking {
		c.ticking = true
		go c.tick()
	}
	c.mu.Unlock()

	timer := time.NewTimer(c.cfg.MaxWait)
	select {
	case <-w.ready:
	case <-ctx.Done():
	case <-timer.C:
	}
	timer.Stop()

	c.mu.Lock()
	if !w.granted {
		c.gate.Leave(&w.entry)
		c.mirrorLocked()
		ra := c.retryAfterLocked()
		c.mu.Unlock()
		waited := time.Since(w.enqueued)
		if ctx.Err() != nil {
			c.m.wait.WithLabelValues("cancelled").Observe(waited.Seconds())
			return nil, fmt.Errorf("admission: client gone after waiting %v: %w", waited.Round(time.Millisecond), ctx.Err())
		}
		c.m.wait.WithLabelValues("timeout").Observe(waited.Seconds())
		c.m.rejections.WithLabelValues("timeout").Inc()
		return nil, &openai.Error{Status: http.StatusTooManyRequests, Type: openai.TypeRateLimit, Code: "queue_timeout", RetryAfter: ra,
			Message: fmt.Sprintf("every backend for model %q stayed saturated while the request waited %v in the router's queue; retry later", model, c.cfg.MaxWait)}
	}
	c.mu.Unlock()
	c.m.wait.WithLabelValues("admitted").Observe(time.Since(w.enqueued).Seconds())
	release = func() { c.release(w) }
	if err := ctx.Err(); err != nil {
		// Granted, but the client left meanwhile: hand the grant on.
		release()
		return nil, fmt.Errorf("admission: client gone: %w", err)
	}
	return release, nil
}

// release ends w's grant once and lets the next waiter in.
func (c *Controller) release(w *waiter) {
	if !w.released.CompareAndSwap(false, true) {
		return
	}
	c.mu.Lock()
	c.gate.Release()
	c.dispatchLocked(time.Now())
	c.mu.Unlock()
}

// Wake re-checks the waiters against saturated. Call it when load drops: a
// request finished or had its first byte, a backend came back. It costs an
// atomic load when nobody waits.
func (c *Controller) Wake() {
	if c == nil || c.queued.Load() == 0 {
		return
	}
	c.mu.Lock()
	c.dispatchLocked(time.Now())
	c.mu.Unlock()
}

// Len returns the number of waiting requests.
func (c *Controller) Len() int {
	if c == nil {
		return 0
	}
	return int(c.queued.Load())
}

// tick re-checks the waiters every Recheck while anybody waits, and stops
// when the queue is empty.
func (c *Controller) tick() {
	t := time.NewTicker(c.cfg.Recheck)
	defer t.Stop()
	for range t.C {
		c.mu.Lock()
		if c.gate.Len() == 0 {
			c.ticking = false
			c.mu.Unlock()
			return
		}
		c.dispatchLocked(time.Now())
		c.mu.Unlock()
	}
}

// mirrorLocked publishes the gate's length and idleness to the lock-free
// readers and the length gauge, after the gate changed.
func (c *Controller) mirrorLocked() {
	n := c.gate.Len()
	c.queued.Store(int64(n))
	c.idle.Store(c.gate.Idle())
	c.m.length.Set(float64(n))
}

// dispatchLocked grants the waiter the gate grants at now, if any: the
// first in queue order whose model is not saturated, unless a grant is
// still in transit.
func (c *Controller) dispatchLocked(now time.Time) {
	if e := c.gate.Grant(now); e != nil {
		c.grantLocked(e.Value.(*waiter), now)
	}
	c.mirrorLocked()
}

// grantLocked admits w, which the gate granted at now.
func (c *Controller) grantLocked(w *waiter, now time.Time) {
	c.m.admitted.Inc()
	if !c.lastGrant.IsZero() {
		// Intervals longer than MaxWait are idle gaps, not drain rate.
		if d := now.Sub(c.lastGrant); d < c.cfg.MaxWait {
			if c.grantEvery == 0 {
				c.grantEvery = d
			} else {
				c.grantEvery += (d - c.grantEvery) / 5
			}
		}
	}
	c.lastGrant = now
	w.granted = true
	close(w.ready)
}

// retryAfterLocked estimates in whole seconds when a rejected request
// would find room: the queue's length times the recent interval between
// grants, at least 1 and at most MaxWait.
func (c *Controller) retryAfterLocked() int {
	maxS := int(math.Ceil(c.cfg.MaxWait.Seconds()))
	if c.grantEvery == 0 {
		return 1
	}
	s := int(math.Ceil((time.Duration(c.queued.Load()+1) * c.grantEvery).Seconds()))
	return min(max(s, 1), max(maxS, 1))
}

// ParsePriority reads the X-Kvroute-Priority header: absent or empty means
// 0; anything but an integer in [-1000000, 1000000] is a 400.
func ParsePriority(h http.Header) (int, *openai.Error) {
	v := strings.TrimSpace(h.Get(PriorityHeader))
	if v == "" {
		return 0, nil
	}
	p, err := strconv.Atoi(v)
	if err != nil || p < -1_000_000 || p > 1_000_000 {
		return 0, openai.BadRequest("invalid_priority",
			fmt.Sprintf("header %s: %q is not an integer between -1000000 and 1000000 (higher is served first, default 0)", PriorityHeader, v))
	}
	return p, nil
}

// Tenant returns the fairness key of a request: the value of header when
// header is set and present, else the client's API key (openai.ClientKey), else
// "" (all anonymous requests share one tenant). The value is hashed, so an
// API key is never kept in clear.
func Tenant(h http.Header, header string) string {
	v := ""
	if header != "" {
		v = h.Get(header)
	}
	if v == "" {
		v, _ = openai.ClientKey(h)
	}
	if v == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(v))
	return hex.EncodeToString(sum[:12])
}

// Limits say when a backend is saturated. A zero limit is off.
type Limits struct {
	// MaxInFlight is the most requests the router keeps in flight on one
	// backend.
	MaxInFlight int64
	// MaxPendingPrefill is the most uncached prompt tokens waiting for
	// their first byte on one backend (the router's estimate).
	MaxPendingPrefill int64
	// MaxEngineWaiting is the most requests the engine itself may report
	// queued; its report counts only while fresher than EngineMaxAge.
	MaxEngineWaiting int
	// EngineMaxAge is how old an engine report may be to count; 0 means
	// DefaultEngineMaxAge.
	EngineMaxAge time.Duration
}

// Enabled reports whether any limit is set.
func (l Limits) Enabled() bool {
	return l.MaxInFlight > 0 || l.MaxPendingPrefill > 0 || l.MaxEngineWaiting > 0
}

// BackendSaturated reports whether b has reached any limit at now.
func (l Limits) BackendSaturated(b *fleet.Backend, now time.Time) bool {
	if l.MaxInFlight > 0 || l.MaxPendingPrefill > 0 {
		ld := b.KnownLoad()
		if l.MaxInFlight > 0 && ld.InFlight >= l.MaxInFlight {
			return true
		}
		if l.MaxPendingPrefill > 0 && ld.PendingPrefill >= l.MaxPendingPrefill {
			return true
		}
	}
	if l.MaxEngineWaiting > 0 {
		age := l.EngineMaxAge
		if age <= 0 {
			age = DefaultEngineMaxAge
		}
		// A stale or missing report says nothing about now; the router's
		// own accounting still applies.
		if es := b.Engine(); es != nil && now.Sub(es.At) <= age && es.Has(fleet.EngineWaiting) && es.Waiting >= l.MaxEngineWaiting {
			return true
		}
	}
	return false
}

// Saturated returns the function New takes: SaturatedAt over the fleet's
// healthy backends.
func (l Limits) Saturated(f *fleet.Fleet) func(model string, now time.Time) bool {
	return func(model string, now time.Time) bool {
		return l.SaturatedAt(f.Snapshot().Healthy, model, now)
	}
}

// SaturatedAt reports whether a model's backends are saturated at now:
// every one of backends serving it has reached a limit. A model that none
// of them serves is not saturated, so that the request goes on to get its
// 404 or 503 from the scheduler. The live router and the simulator (late
// binding) decide to hold a request with it.
func (l Limits) SaturatedAt(backends []*fleet.Backend, model string, now time.Time) bool {
	any := false
	for _, b := range backends {
		if !b.Serves(model) {
			continue
		}
		if !l.BackendSaturated(b, now) {
			return false
		}
		any = true
	}
	return any
}
