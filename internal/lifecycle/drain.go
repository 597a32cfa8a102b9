package lifecycle

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"
)

// ErrDrainedWaiting is an attempt that was still waiting for its first
// byte fleet.drain_grace after its backend started draining: nothing
// reached the client, so it is sent elsewhere as it is, neither judged
// against the backend nor counted as a retry.
var ErrDrainedWaiting = errors.New("the backend was drained before its first byte")

// ErrHungWaiting is an attempt that was still waiting for its first byte
// when its backend was found hung (its breaker opened by timeouts: the
// engine keeps its connections and sends nothing): nothing reached the
// client, so it is sent elsewhere at once, as a drained one is.
var ErrHungWaiting = errors.New("the backend was found hung before its first byte")

// drainBound cancels an attempt's context DrainGrace after its backend
// started draining (fleet.Backend.DrainingSince), unless the attempt had its first byte (done) first.
// It costs no goroutine while the backend is not draining. A nil
// *drainBound bounds nothing.
type drainBound struct {
	mu    sync.Mutex
	ended bool
	// cut is why the bound cut the attempt (ErrDrainedWaiting,
	// ErrHungWaiting), nil while it has not.
	cut          error
	timer        Timer
	stopWatching func() bool
	stopHang     func() bool
}

// boundDrain returns out under the drain bound of leg l's backend.
func (p *Plane) boundDrain(r *Request, l *Leg, out *http.Request) (*http.Request, *drainBound) {
	if !p.ResendDrained || r.Passthrough {
		return out, nil
	}
	ctx, cancel := context.WithCancelCause(out.Context())
	db := &drainBound{}
	b := l.Target.B
	db.stopWatching = context.AfterFunc(b.DrainStarted(), func() {
		db.mu.Lock()
		defer db.mu.Unlock()
		if db.ended {
			return
		}
		// The grace runs from the drain's start, which the streams moved
		// off b count from too; this attempt may have begun after it.
		left := p.DrainGrace
		if since, ok := b.DrainingSince(); ok {
			left -= time.Since(since)
		}
		db.timer = AfterFunc(max(left, 0), func() { db.fire(ErrDrainedWaiting, cancel) })
	})
	// A backend found hung later (not one already so: the attempt may be
	// the probe that shows it back) cuts the attempt at once.
	db.stopHang = func() bool { return false }
	if hang := b.HangFound(); hang.Err() == nil {
		db.stopHang = context.AfterFunc(hang, func() { db.fire(ErrHungWaiting, cancel) })
	}
	// The attempt's context is a child of the request's, which the front
	// cancels when the request ends: cancel need not be kept.
	return out.WithContext(ctx), db
}

// fire cuts the attempt for cause, unless it had its first byte or was
// cut already.
func (db *drainBound) fire(cause error, cancel context.CancelCauseFunc) {
	db.mu.Lock()
	if db.ended || db.cut != nil {
		db.mu.Unlock()
		return
	}
	db.cut = cause
	db.mu.Unlock()
	cancel(cause)
}

// done ends the bound once the attempt has its first byte (or failed)
// and returns why it cut the attempt first (ErrDrainedWaiting,
// ErrHungWaiting), nil if it did not.
func (db *drainBound) done() error {
	if db == nil {
		return nil
	}
	db.stopWatching()
	db.stopHang()
	db.mu.Lock()
	defer db.mu.Unlock()
	db.ended = true
	if db.timer != nil {
		db.timer.Stop()
	}
	return db.cut
}
