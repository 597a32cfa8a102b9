package migrate

import "errors"

// Limits bound the moves of one stream: config's migration keys. The
// proxy's relay and the simulator both ask them, so that a stream moves
// in virtual time exactly when it would live.
type Limits struct {
	// MaxAttempts is migration.max_attempts: the attempts at moving one
	// stream; 0 turns moving off.
	MaxAttempts int
	// MaxContextTokens is migration.max_context_tokens: the longest
	// continuation prompt moved, 0 for no bound.
	MaxContextTokens int
}

// ErrTooLong is a continuation over MaxContextTokens.
var ErrTooLong = errors.New("the continuation is longer than migration.max_context_tokens")

// Attempt reports whether one more attempt at moving a stream may be
// made, spent attempts counted so far, and counts it in *spent unless it
// is free: the first attempt of a drain's move is planned (a rolling
// restart may move a stream once for each engine it restarts) and not
// counted. With moving off nothing is attempted.
func (l Limits) Attempt(spent *int, free bool) bool {
	if l.MaxAttempts <= 0 {
		return false
	}
	if free {
		return true
	}
	if *spent >= l.MaxAttempts {
		return false
	}
	*spent++
	return true
}

// Fits returns ErrTooLong when a continuation of promptTokens (the
// router's estimate of its prompt) is over MaxContextTokens, else nil.
func (l Limits) Fits(promptTokens int) error {
	if l.MaxContextTokens > 0 && promptTokens > l.MaxContextTokens {
		return ErrTooLong
	}
	return nil
}
