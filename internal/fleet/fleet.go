// Package fleet owns the set of backends and the router's own accounting of
// their load: in-flight requests, pending prefill tokens, decoding streams
// and their output budget, health, the prefill rate learned from observed
// TTFTs, and the latest state the engine itself reported. State changes
// publish a new immutable Snapshot that pickers read without blocking.
//
// Every increment has exactly one decrement: Backend.Start returns a Ticket
// whose Done releases whatever the request still holds, exactly once.
//
// The package does no network I/O; health checks and metric scrapes live in
// the proxy and feed their results in through setters.
package fleet

import (
	"net/url"
	"sync/atomic"
	"time"
)

// DefaultPrefillRate is the prior prefill rate in tokens per second, used
// until a backend's TTFTs have been observed.
const DefaultPrefillRate = 10000

// Backend is one inference server.
type Backend struct {
	// ID is dense and stable for the fleet's lifetime: 0, 1, 2...
	ID int
	// Name is a human-readable label (host:port, or engine-3 in the simulator).
	Name string
	// URL is the base URL; nil in the simulator.
	URL *url.URL
	// Models served; empty means any model.
	Models []string

	healthy atomic.Bool
	// accounting, see Load
	inflight, pendingPrefill, decoding, decodeBudget, decodeTokens atomic.Int64
	engine                                                         atomic.Pointer[EngineState]
}

// Load is the router's own accounting of a backend, read atomically field
// by field.
type Load struct {
	// InFlight is requests routed and not yet done.
	InFlight int64
	// PendingPrefill is uncached prompt tokens of requests routed whose first
	// response byte has not arrived yet.
	PendingPrefill int64
	// Decoding is requests past their first byte and not yet done.
	Decoding int64
	// DecodeBudget is the sum of the output budgets (max tokens) of the
	// decoding requests.
	DecodeBudget int64
	// DecodeTokens is the sum of the prompt tokens of the decoding
	// requests: the KV cache they hold (Dynamo's "active decode blocks" is
	// DecodeTokens / block size).
	DecodeTokens int64
}

// EngineState is what the engine itself last reported (its metrics), or
// what the simulator reads off its engine model.
type EngineState struct {
	At       time.Time
	Running  int
	Waiting  int
	KVUsage  float64 // 0..1
	KVBlocks int     // capacity in engine blocks, 0 if unknown
}

// Serves reports whether b serves model ("" matches any).
func (b *Backend) Serves(model string) bool { panic("unimplemented") }

// Healthy reports whether b may receive requests.
func (b *Backend) Healthy() bool { return b.healthy.Load() }

// Load returns the router's accounting of b.
func (b *Backend) Load() Load { panic("unimplemented") }

// PrefillRate is the learned prefill rate in tokens per second.
func (b *Backend) PrefillRate() float64 { panic("unimplemented") }

// Engine returns the engine's last reported state, or nil.
func (b *Backend) Engine() *EngineState { return b.engine.Load() }

// SetEngine records the engine's reported state.
func (b *Backend) SetEngine(s *EngineState) { b.engine.Store(s) }

// Start accounts a request routed to b with promptTokens prompt tokens, of
// which uncached are not in b's cache (the router's estimate), and
// outputBudget tokens of output. The Ticket must be ended with Done,
// whatever happens to the request.
func (b *Backend) Start(promptTokens, uncached, outputBudget int64, now time.Time) *Ticket {
	panic("unimplemented")
}

// Ticket is one request's claim on a backend's load counters.
type Ticket struct{}

// FirstByte marks the arrival of the first response byte: the request's
// prefill tokens leave PendingPrefill and it becomes a decoding stream, and
// the observed TTFT teaches the backend's prefill rate. Only the first call
// counts; a call after Done does nothing.
func (t *Ticket) FirstByte(now time.Time) { panic("unimplemented") }

// Done releases everything the request still holds. Only the first call counts.
func (t *Ticket) Done(now time.Time) { panic("unimplemented") }

// Fleet is the set of backends.
type Fleet struct{}

// Snapshot is an immutable view of the fleet's membership and health,
// published whenever either changes. Load counters are read live from the
// backends through their atomics.
type Snapshot struct {
	// All backends, indexed by ID.
	All []*Backend
	// Healthy backends, in ID order.
	Healthy []*Backend
}

// New returns an empty fleet.
func New() *Fleet { panic("unimplemented") }

// Add adds a healthy backend and returns it with its new ID.
func (f *Fleet) Add(name string, u *url.URL, models []string) *Backend { panic("unimplemented") }

// SetHealthy changes b's health and publishes a new snapshot if it changed.
func (f *Fleet) SetHealthy(b *Backend, ok bool) { panic("unimplemented") }

// Snapshot returns the current snapshot; it never blocks.
func (f *Fleet) Snapshot() *Snapshot { panic("unimplemented") }
