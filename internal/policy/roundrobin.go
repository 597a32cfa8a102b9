package policy

import "sync/atomic"

func init() { register("round-robin", func(Options) Policy { return &RoundRobin{} }) }

// RoundRobin sends each request to the next candidate in turn, blind to
// load, cost and cache.
//
// The counter is shared by all requests, so when the candidate set shrinks
// (a retry excludes a backend, a backend is ejected) the rotation simply
// continues over the smaller set.
type RoundRobin struct {
	next atomic.Uint64
}

// Name implements Policy.
func (*RoundRobin) Name() string { return "round-robin" }

// Pick implements Policy.
func (p *RoundRobin) Pick(in *Input) Decision {
	n := p.next.Add(1) - 1
	return Decision{Index: int(n % uint64(len(in.Candidates))), Note: "turn"}
}

var _ Policy = (*RoundRobin)(nil)
