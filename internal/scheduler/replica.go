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
	// Routed: request id (numbered 1, 2, 3... by this scheduler) with the
	// prompt's block hashes (kept unchanged until the request is done; the
	// receiver must not modify them) and session key hash (0 for none)
	// went to b, changing its load by d.
	Routed(id uint64, b *fleet.Backend, hashes []uint64, session uint64, d fleet.Load)
	// Changed: request id's first byte or end changed b's load by d (its
	// end: d.InFlight is -1).
	Changed(id uint64, b *fleet.Backend, d fleet.Load)
}

// SetEvents makes e hear of every routing from now on. Call it before the
// first Route.
func (s *Scheduler) SetEvents(e Events) { s.events = e }

// Learn applies a past decision another replica made: b now holds
// hashes, most recent first (evictable), and the conversation with key
// hash session (0 for none) went to b, in the session table of a policy
// that keeps one.
func (s *Scheduler) Learn(b *fleet.Backend, hashes []uint64, session uint64) {
	if len(hashes) > 0 {
		s.index.Insert(b.ID, hashes)
	}
	s.learnSession(b, session)
}

// Pin applies a request another replica routed and that is in flight: as
// for a request routed here, its blocks are pinned on b until Unpin (the
// engine cannot evict them while it runs, and they become the most recent
// when it ends, which is when the engine frees them), and its session
// learnt. It returns the index's handles for Unpin.
func (s *Scheduler) Pin(b *fleet.Backend, hashes []uint64, session uint64) []int32 {
	var nodes []int32
	if len(hashes) > 0 {
		nodes = s.index.AcquireNodes(b.ID, hashes, nil)
	}
	s.learnSession(b, session)
	return nodes
}

// Unpin ends a Pin: the peer's request is done.
func (s *Scheduler) Unpin(b *fleet.Backend, hashes []uint64, nodes []int32) {
	if len(hashes) > 0 {
		s.index.ReleaseNodes(b.ID, hashes, nodes)
	}
}

func (s *Scheduler) learnSession(b *fleet.Backend, session uint64) {
	if session != 0 {
		if l, ok := s.Policy().(policy.SessionLearner); ok {
			l.LearnSession(session, b.ID)
		}
	}
}
