package members

import (
	"time"
)

// breakerState is where a backend's circuit breaker stands.
type breakerState int32

const (
	// breakerClosed: the backend takes traffic; consecutive failures are
	// counted.
	breakerClosed breakerState = iota
	// breakerOpen: the backend takes no traffic until its cool-down ends.
	breakerOpen
	// breakerHalfOpen: the cool-down is over; a few probe requests (and
	// the active check) may go through, and the first outcome decides.
	breakerHalfOpen
)

func (s breakerState) String() string {
	switch s {
	case breakerClosed:
		return "closed"
	case breakerOpen:
		return "open"
	case breakerHalfOpen:
		return "half-open"
	}
	return "unknown"
}

// breakerConfig is the breaker's part of the health section.
type breakerConfig struct {
	// threshold is the number of consecutive failures that open a closed
	// breaker.
	threshold int
	// cooldown is the first open period; maxCooldown caps its doubling.
	cooldown, maxCooldown time.Duration
	// probes is how many requests a half-open breaker lets through per
	// probe window (one cool-down).
	probes int
}

// transition is what a breaker event changed, for the caller to apply to
// the fleet (health, prefix index), metrics and logs.
type transition int8

const (
	noChange transition = iota
	toOpen
	toHalfOpen
	toClosed
)

// breaker is one backend's circuit breaker. It is a pure state machine:
// every method takes the time, none reads a clock or locks, so that its
// transitions are tested with an injected clock; the caller serialises
// calls (backendHealth.mu).
//
//	closed --threshold consecutive failures--> open
//	open --cool-down over (expire)--> half-open
//	half-open --success--> closed (cool-down reset)
//	half-open --failure--> open (cool-down doubled, up to the cap)
//
// A breaker opened by a silence (the backend sent nothing in time, which
// a stuck engine's health endpoint does not show) is closed by a request
// only: its half-open state probes with requests even where an active
// check is configured, and the check's successes are not heard.
//
// An outcome reported while open and past the cool-down counts as a probe
// (an active check may land there before the timer moves the breaker).
// Outcomes reported while open and within the cool-down come from requests
// sent before the breaker opened, and are ignored.
type breaker struct {
	state breakerState
	// fails counts consecutive failures while closed.
	fails int
	// until is when an open breaker may go half-open.
	until time.Time
	// cooldown is the current open period; 0 means the configured first.
	cooldown time.Duration
	// probes counts requests let through since window began.
	probes int
	window time.Time
	// silent is a breaker opened by a timeout (see silent): the backend
	// kept its connections and sent nothing, which its health endpoint
	// may not show (a stuck engine whose server still answers /health),
	// so only a request closes it again, never an active check.
	silent bool
}

// failure records a failed request or check at now; silent when the
// backend failed by sending nothing in time (a timeout).
func (b *breaker) failure(now time.Time, c breakerConfig, silent bool) transition {
	switch b.state {
	case breakerClosed:
		b.fails++
		if b.fails < c.threshold {
			return noChange
		}
		b.open(now, c.cooldown)
		b.silent = silent
		return toOpen
	case breakerOpen:
		if now.Before(b.until) {
			return noChange
		}
	}
	// A failed probe: back off. A breaker opened by a silence stays one
	// until a request succeeds.
	b.open(now, min(2*b.current(c), c.maxCooldown))
	b.silent = b.silent || silent
	return toOpen
}

// success records a successful request (check false) or active check
// (check true) at now. A passing check does not clear a closed breaker's
// count of failed requests: an engine whose /health answers while its
// completions fail must still be ejected. Nor does it close a breaker a
// silence opened: only a request that succeeds does.
func (b *breaker) success(now time.Time, c breakerConfig, check bool) transition {
	switch b.state {
	case breakerClosed:
		if !check {
			b.fails = 0
		}
		return noChange
	case breakerOpen:
		if now.Before(b.until) {
			return noChange
		}
	}
	if check && b.silent {
		return noChange
	}
	*b = breaker{}
	return toClosed
}

// expire moves an open breaker whose cool-down is over to half-open.
func (b *breaker) expire(now time.Time) transition {
	if b.state != breakerOpen || now.Before(b.until) {
		return noChange
	}
	b.state = breakerHalfOpen
	b.probes, b.window = 0, now
	return toHalfOpen
}

// allow reports whether a request may be sent at now. An open breaker lets
// nothing through (only expire, called by the caller's timer, ends the
// cool-down, so that the fleet learns of it); a half-open one lets
// c.probes requests through per cool-down: a probe whose outcome never
// comes (its client left) holds its slot only until the window turns.
func (b *breaker) allow(now time.Time, c breakerConfig) bool {
	switch b.state {
	case breakerClosed:
		return true
	case breakerHalfOpen:
		if now.Sub(b.window) >= b.current(c) {
			b.probes, b.window = 0, now
		}
		if b.probes < c.probes {
			b.probes++
			return true
		}
	}
	return false
}

func (b *breaker) open(now time.Time, d time.Duration) {
	b.state, b.fails, b.cooldown, b.until, b.probes = breakerOpen, 0, d, now.Add(d), 0
}

// current is the breaker's current cool-down.
func (b *breaker) current(c breakerConfig) time.Duration {
	if b.cooldown > 0 {
		return b.cooldown
	}
	return c.cooldown
}
