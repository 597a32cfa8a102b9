package fleet

import (
	"context"
	"time"
)

// drainSignal is a context cancelled when its backend starts draining.
type drainSignal struct {
	ctx    context.Context
	cancel context.CancelFunc
}

// drained is the signal of every backend while it drains.
var drained = func() *drainSignal {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return &drainSignal{ctx, cancel}
}()

// DrainStarted returns a context that is done once b drains (at once if
// it is draining): a request waiting on b can watch it without a
// goroutine of its own (context.AfterFunc). A backend undrained gets a
// new one.
func (b *Backend) DrainStarted() context.Context {
	for {
		if s := b.drainCtx.Load(); s != nil {
			return s.ctx
		}
		ctx, cancel := context.WithCancel(context.Background())
		if b.drainCtx.CompareAndSwap(nil, &drainSignal{ctx, cancel}) {
			if b.Draining() {
				// Drained between the load and the swap, before
				// startDrain could see this signal.
				cancel()
			}
			return ctx
		}
		cancel()
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
	if s := b.drainCtx.Swap(drained); s != nil {
		s.cancel()
	}
	return true
}

// drainEnded readies a new signal for b's next drain; b.draining was
// just cleared.
func (b *Backend) drainEnded() { b.drainCtx.Store(nil) }
