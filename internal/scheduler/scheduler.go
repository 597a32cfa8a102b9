// Package scheduler is kvroute's one routing decision, shared by the live
// proxy and the virtual-time simulator: it computes a request's prefix
// blocks once, matches them against the prefix index, asks the policy for a
// pick among the candidates, records the routed blocks and opens the
// load-accounting ticket. The caller reports the request's fate (first
// byte, done) back through the Assignment; time is always passed in, never
// read from a clock, so that the simulator can drive it in virtual time.
//
// It does no I/O and never sleeps.
package scheduler

import (
	"errors"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/prefix"
	"github.com/kvroute/kvroute/internal/request"
)

// Errors Route returns.
var (
	// ErrUnknownModel: no backend, healthy or not, serves the model (404).
	ErrUnknownModel = errors.New("no backend serves this model")
	// ErrNoBackend: backends serve the model but none is available (503).
	ErrNoBackend = errors.New("no healthy backend for this model")
)

// Config tunes a Scheduler.
type Config struct {
	// BlockChars is the prefix block size in characters; default
	// prefix.DefaultBlockChars.
	BlockChars int
	// Capacity is the default per-backend prefix index capacity in blocks;
	// default prefix.DefaultCapacity.
	Capacity int
}

// Scheduler routes requests over a fleet with one policy.
type Scheduler struct{}

// New returns a scheduler over f using p.
func New(f *fleet.Fleet, p policy.Policy, cfg Config) *Scheduler { panic("unimplemented") }

// Index exposes the prefix index (to set capacities, or forget a crashed
// backend).
func (s *Scheduler) Index() *prefix.Index { panic("unimplemented") }

// Policy returns the scheduler's policy.
func (s *Scheduler) Policy() policy.Policy { panic("unimplemented") }

// Assignment is one routing decision and the request's claim on the chosen
// backend's load.
type Assignment struct {
	Backend *fleet.Backend
	// Reason is short and human-readable, e.g. "prefix=812/1024 est_ttft=0.21s".
	Reason string
	// MatchedTokens is the predicted prefix-cache hit in tokens.
	MatchedTokens int
}

// Route picks a backend for v, skipping the backends whose IDs are in
// exclude (those that already failed this request).
func (s *Scheduler) Route(v *request.View, exclude []int, now time.Time) (*Assignment, error) {
	panic("unimplemented")
}

// FirstByte reports that the first response byte arrived.
func (a *Assignment) FirstByte(now time.Time) { panic("unimplemented") }

// Done reports that the request ended (any outcome). Only the first call counts.
func (a *Assignment) Done(now time.Time) { panic("unimplemented") }
