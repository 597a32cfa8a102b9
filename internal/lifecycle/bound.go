package lifecycle

import "time"

// Timer is a running deadline: what time.AfterFunc returns, behind an
// interface so that tests can decide when it fires (SetAfterFunc).
type Timer interface {
	// Stop reports false when the deadline passed first: its function has
	// run or is about to (it ends the wait it bounds: closes the body,
	// cancels the context). The caller then treats the wait as timed out,
	// whatever the wait itself returned, never reading a flag the
	// function sets (it may not have set it yet).
	Stop() bool
	// Reset restarts the deadline d from now.
	Reset(d time.Duration) bool
}

// afterFunc starts a deadline; tests replace it (SetAfterFunc).
var afterFunc = func(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// AfterFunc runs f once d has passed, unless the Timer is stopped first:
// the one way every wait on a backend is bounded (the first byte, the
// first token, a prefill answer's body, and the relay's stream idle
// timeout).
func AfterFunc(d time.Duration, f func()) Timer { return afterFunc(d, f) }

// SetAfterFunc replaces how deadlines are started and returns what it
// replaced: for tests that decide when a deadline fires.
func SetAfterFunc(f func(d time.Duration, fn func()) Timer) func(d time.Duration, fn func()) Timer {
	prev := afterFunc
	afterFunc = f
	return prev
}
