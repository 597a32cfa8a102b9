package fleet

import (
	"context"
	"sync/atomic"
	"time"
)

// signal is a context cancelled when its backend enters a state (starts
// draining, is found hung) and readied afresh when it leaves it: a
// request waiting on the backend watches it without a goroutine of its
// own (context.AfterFunc).
type signal struct {
	p atomic.Pointer[signalCtx]
}

type signalCtx struct {
	ctx    context.Context
	cancel context.CancelFunc
}

// fired is the signal of every backend while it is in the state.
var fired = func() *signalCtx {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return &signalCtx{ctx, cancel}
}()

// wait returns a context done once the state is entered, at once if in
// reports that it is.
func (s *signal) wait(in func() bool) context.Context {
	for {
		if c := s.p.Load(); c != nil {
			return c.ctx
		}
		ctx, cancel := context.WithCancel(context.Background())
		if s.p.CompareAndSwap(nil, &signalCtx{ctx, cancel}) {
			if in() {
				// Entered between the load and the swap, before fire
				// could see this context.
				cancel()
			}
			return ctx
		}
		cancel()
	}
}

// fire cancels the waiting context; the state was just entered.
func (s *signal) fire() {
	if c := s.p.Swap(fired); c != nil {
		c.cancel()
	}
}

// reset readies a new context for the next time; the state was just
// left.
func (s *signal) reset() { s.p.Store(nil) }

// DrainStarted returns a context that is done once b drains (at once if
// it is draining). A backend undrained gets a new one.
func (b *Backend) DrainStarted() context.Context { return b.drainSig.wait(b.Draining) }

// HangFound returns a context that is done once b is found hung (Hung),
// at once if it is. A backend healthy again gets a new one.
func (b *Backend) HangFound() context.Context { return b.hungSig.wait(b.hung.Load) }

// Hung records that b was taken out for keeping the router waiting (its
// breaker opened by timeouts: connections kept, nothing sent), so that
// the requests still waiting there for a first byte go elsewhere.
// SetHealthy(b, true) ends it.
func (f *Fleet) Hung(b *Backend) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !b.hung.Swap(true) {
		b.hungSig.fire()
	}
}

// DrainingSince is when b's current drain started (Drain, or Remove,
// called), and false when b is not draining. It is the one clock of a
// drain's fleet.drain_grace: the streams moved off b and the requests
// re-sent from it count their grace from it alike.
func (b *Backend) DrainingSince() (time.Time, bool) {
	if !b.Draining() {
		return time.Time{}, false
	}
	return time.Unix(0, b.drainedAt.Load()), true
}

// startDrain starts b's drain at now, unless it drains already, and
// reports whether it did: the start is recorded before b is seen
// draining, then its drain signal fires. The caller holds fleet.mu, as
// every writer of b.draining does.
func (b *Backend) startDrain(now time.Time) bool {
	if b.draining.Load() {
		return false
	}
	b.drainedAt.Store(now.UnixNano())
	b.draining.Store(true)
	b.drainSig.fire()
	return true
}

// drainEnded readies a new signal for b's next drain; b.draining was
// just cleared.
func (b *Backend) drainEnded() { b.drainSig.reset() }
