package fleet

import "context"

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
				// drainStarted could see this signal.
				cancel()
			}
			return ctx
		}
		cancel()
	}
}

// drainStarted fires b's drain signal; b.draining was just set.
func (b *Backend) drainStarted() {
	if s := b.drainCtx.Swap(drained); s != nil {
		s.cancel()
	}
}

// drainEnded readies a new signal for b's next drain; b.draining was
// just cleared.
func (b *Backend) drainEnded() { b.drainCtx.Store(nil) }
