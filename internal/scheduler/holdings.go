package scheduler

import (
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/request"
)

// Holdings calls fn for every healthy backend that serves v's model with
// the prompt tokens of v it holds by the prefix index (approximate) and
// the rest, converted as a pick converts them (split). hashes are the
// prompt's blocks as Hashes returns them. It reads and changes nothing:
// the conditional split of a request over prefill and decode engines
// weighs these before the request is routed (disagg.Gather).
func (s *Scheduler) Holdings(v *request.View, hashes []uint64, fn func(b *fleet.Backend, cached, uncached int64)) {
	sc := s.scratch.Get().(*scratch)
	defer s.put(sc)
	snap := s.fleet.Snapshot()
	if cap(sc.all) < snap.IDs {
		sc.all = make([]int32, snap.IDs)
	}
	sc.all = sc.all[:snap.IDs]
	s.index.Match(hashes, sc.all)
	parent := s.Parent(v.Model)
	for _, b := range snap.Healthy {
		if !s.serves(b, v.Model, parent) || b.ID >= len(sc.all) {
			continue
		}
		c, u := s.split(v, sc.all[b.ID])
		fn(b, c, u)
	}
}

// pendingOf is the prompt tokens a request v of which uncached are not
// in its backend's cache leaves to compute there, for its load ticket: a
// split request's decode leg computes none but its last (the prefill
// engine computed the rest and its KV cache is carried over), so that
// a decode engine's pending prefill counts the prompts it computes, not
// those it receives.
func pendingOf(v *request.View, uncached int64) int64 {
	if v.Role == policy.RoleDecodeLeg {
		return min(uncached, 1)
	}
	return uncached
}
