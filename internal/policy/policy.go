// Package policy holds the routing policies: the baselines users run today
// (round-robin, random, least-request, power-of-two), session-hash, prefix,
// kvroute (the default), and the published routers of our peers,
// reimplemented from their public descriptions. Each policy lives in its own
// file.
//
// A policy is a pick over a request view and a snapshot of candidates; it
// never does I/O and never blocks on anything but a short internal lock.
// The scheduler (package scheduler) computes the prefix match once and hands
// it in; policies with state of their own (the peers' own radix trees and
// hash rings) learn about routed requests through Observer.
package policy

import (
	"fmt"
	"sort"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/prefix"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/slo"
)

// Input is everything a policy may look at. It is valid only during Pick.
type Input struct {
	View *request.View
	// Hashes are the chain hashes of View.Prompt's full blocks of BlockChars.
	Hashes     []uint64
	BlockChars int
	// Candidates are the healthy backends that serve the model, not
	// excluded by retries; never empty.
	Candidates []*fleet.Backend
	// Matched[i] is the number of leading blocks of Hashes that
	// Candidates[i] holds according to the router's prefix index.
	Matched []int32
	// Cached[i] is Matched[i] in prompt tokens (at most
	// View.PromptTokens), and Uncached[i] the rest of the prompt
	// (View.PromptTokens - Cached[i]): the tokens Candidates[i] would
	// compute. The scheduler converts blocks to tokens once, for every
	// policy; a policy never converts blocks itself.
	Cached, Uncached []int64
	// Extra[i] is the seconds the scheduler's scorers (Scorer) add to
	// the time to first token on Candidates[i]; nil without scorers.
	Extra []float64
	// Tiers[i] is how Cached[i] spreads over Candidates[i]'s cache tiers
	// (prompt tokens on its GPU, then in host memory, then on disk), and
	// Load[i] the seconds it takes to load the lower tiers' part into GPU
	// memory before computing the rest (the scheduler's price of it,
	// scheduler/tiers.go); both nil when no backend has a tier below its
	// GPU: every cached token is then on the GPU.
	Tiers []TierTokens
	Load  []float64
	Now   time.Time
	// SessionHash is HashSession(View.SessionKey), hashed once per
	// request by the scheduler; 0 when the request has no session key.
	SessionHash uint64
	// Replicas is how many live router replicas (this one included) route
	// over the same fleet, each seeing the others' decisions only after a
	// delay; 0 or 1 for one router. ReplicaArc is this replica's place
	// among them on the circle of fleet.Backend.Arc, in [0, 1): replicas
	// sorted by ID take evenly spaced places. Burst is set when this
	// replica has routed another request within that delay: arrivals come
	// in bursts, and its peers are then likely routing blind beside it.
	// See kvroute's ReplicaSkew.
	Replicas   int
	ReplicaArc float64
	Burst      bool
	// Replica is this replica's ID hashed (HashReplica), which the claims
	// of its session table carry; 0 for one router. It is set whenever
	// the router shares state with replicas (sync), live or not.
	Replica uint64
	// Objective is the request's latency objectives and criticality; the
	// zero value (None) for a request without objectives, which a policy
	// routes as before, at no cost (package slo).
	Objective slo.Objective
}

// TierTokens is a candidate's cached prompt tokens per cache tier,
// indexed by prefix.Tier.
type TierTokens [prefix.NumTiers]int64

// HashSession is the one hash of a session key that the scheduler and the
// policies share; 0 for no key.
func HashSession(key string) uint64 {
	if key == "" {
		return 0
	}
	return xxhash.Sum64String(key)
}

// Decision is a policy's answer.
type Decision struct {
	// Index into Input.Candidates.
	Index int
	// EstTTFT is the policy's estimate of the time to first token in
	// seconds, 0 when the policy makes none.
	EstTTFT float64
	// Note is a short static word on why (e.g. "sticky", "least-loaded"),
	// or empty. It must not be built per request.
	Note string
	// With Input.Objective set, a policy that predicts latencies gives
	// the chosen candidate's prediction (Pred), whether it is predicted
	// to meet the objectives (Met), and Shed when the request is to be
	// refused instead (a sheddable one no candidate can serve in time:
	// slo.Choose); Pred is then the best candidate's.
	Pred slo.Prediction
	Met  bool
	Shed bool
}

// Policy picks a backend.
type Policy interface {
	Name() string
	Pick(in *Input) Decision
}

// Observer is implemented by policies that keep routing state of their own.
// Routed is called once for every request after the pick is final.
type Observer interface {
	Routed(in *Input, d Decision)
}

// SessionLearner is implemented by policies that keep a session table
// (conversation -> backend, with the Claim that made it its home).
// SessionOf returns the backend ID a conversation lives on and its claim
// (-1 if the table does not know it), which the scheduler tells the
// peers with every routing that follows it; LearnSession merges a claim
// another router replica made on backend id (package replica): the table
// keeps the claim that Wins, so replicas that heard the same claims hold
// the same backend, whatever order they heard them in.
type SessionLearner interface {
	SessionOf(session uint64) (id int, c Claim)
	LearnSession(c Claim, id int)
}

// Options tune the policies; zero values mean the documented defaults.
type Options struct {
	// Seed seeds the random choices (random, power-of-two, tie-breaks).
	Seed int64
	// LoadFactor is CHWBL's bound on a backend's load relative to the mean
	// (session-hash, kubeai-chwbl); default 1.25.
	LoadFactor float64
	// TransferPerToken is the KV transfer's time per prompt token carried
	// from a prefill to a decode engine (the disaggregation config's),
	// which kvroute's decode-leg pick weighs for an engine whose cost
	// model prior gives none; 0: DefaultTransferPerToken.
	TransferPerToken time.Duration
}

var registry = map[string]func(Options) Policy{}

// register is called from each policy file's init.
func register(name string, f func(Options) Policy) { registry[name] = f }

// New returns a new instance of the named policy.
func New(name string, opt Options) (Policy, error) {
	f, ok := registry[name]
	if !ok {
		return nil, fmt.Errorf("unknown policy %q (known: %v)", name, Names())
	}
	return f(opt), nil
}

// Names lists the known policies, sorted.
func Names() []string {
	n := make([]string, 0, len(registry))
	for k := range registry {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}

// Default is the policy kvroute serve uses unless told otherwise.
const Default = "kvroute"
