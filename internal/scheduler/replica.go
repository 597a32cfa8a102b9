package scheduler

import (
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/policy"
)

// Peer router replicas. Several schedulers in front of one fleet (kvroute
// serve replicas, or the simulator's --replicas) share what each routed:
// Events tells the sharing layer (package replica) of every decision and
// load change this scheduler makes, and Learn applies a peer's decision to
// the same prefix index and session table that local routing writes. A
// peer's load goes to fleet.Backend.AddPeerLoad.

// Events hears of what a scheduler accounts. Its methods run on the
// routing path, inside Route and the Assignment's FirstByte and Done: they
// must not block or do I/O (queue and return).
type Events interface {
	// Routed: a request with the prompt's block hashes (kept unchanged
	// until the request is done; the receiver must not modify them) and
	// session key hash (0 for none) went to b, changing its load by d.
	Routed(b *fleet.Backend, hashes []uint64, session uint64, d fleet.Load)
	// Changed: a request's first byte or end changed b's load by d.
	Changed(b *fleet.Backend, d fleet.Load)
}

// SetEvents makes e hear of every routing from now on. Call it before the
// first Route.
func (s *Scheduler) SetEvents(e Events) { s.events = e }

// Learn applies a decision another replica made: b now holds hashes, most
// recent first (evictable: the peer's requests pin nothing here), and the
// conversation with key hash session (0 for none) went to b, in the
// session table of a policy that keeps one.
func (s *Scheduler) Learn(b *fleet.Backend, hashes []uint64, session uint64) {
	if len(hashes) > 0 {
		s.index.Insert(b.ID, hashes)
	}
	if session != 0 {
		if l, ok := s.Policy().(policy.SessionLearner); ok {
			l.LearnSession(session, b.ID)
		}
	}
}
