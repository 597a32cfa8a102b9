package scheduler

import (
	"time"

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
	// receiver must not modify them) went to b, changing its load by d;
	// its conversation lives on b by claim c (c.Session is 0 for a request
	// without a session key, or one that did not go to its conversation's
	// home).
	Routed(id uint64, b *fleet.Backend, hashes []uint64, c policy.Claim, d fleet.Load)
	// Changed: request id's first byte or end changed b's load by d (its
	// end: d.InFlight is -1).
	Changed(id uint64, b *fleet.Backend, d fleet.Load)
}

// SetEvents makes e hear of every routing from now on. Call it before the
// first Route.
func (s *Scheduler) SetEvents(e Events) { s.events = e }

// replicaPlace is what SetReplicas stores.
type replicaPlace struct {
	n   int
	arc float64
}

// SetReplicas tells the policy that n live router replicas (this one
// included) route over the fleet and that this one is the rank-th of them
// in the order of their IDs (0 <= rank < n): see policy.Input.Replicas.
// The owner of the peers' liveness (replica.Peers) calls it whenever a
// peer comes or goes.
func (s *Scheduler) SetReplicas(rank, n int) {
	if n <= 1 || rank < 0 || rank >= n {
		s.replicas.Store(nil)
		return
	}
	s.replicas.Store(&replicaPlace{n: n, arc: float64(rank) / float64(n)})
}

// SetBlindWindow tells the scheduler how long its peers' decisions take
// to reach it (the sync delay: batching, the NATS hop, the receiver). A
// routing here is presumed to be matched by one of each peer's for that
// long: replicas that read the same fleet within a burst of arrivals make
// the same choices, each unaware of the others', and presuming them is
// what keeps each replica from piling its share of the burst onto the
// backend that looked best to all of them. 0 presumes nothing.
func (s *Scheduler) SetBlindWindow(d time.Duration) { s.blind.Store(int64(max(d, 0))) }

// BlindWindow returns what SetBlindWindow last set.
func (s *Scheduler) BlindWindow() time.Duration { return time.Duration(s.blind.Load()) }

// presumption is a routing's load presumed on b for each peer, until at.
type presumption struct {
	b     *fleet.Backend
	d     fleet.Load
	until time.Time
}

// presume presumes, for the blind window (see SetBlindWindow), that each
// of the replicas-1 peers is routing a request like this one, which a
// routing to b made at now with load d, to the same backend: replicas
// that read the same fleet in the same instant choose alike. The caller
// holds s.decide.
func (s *Scheduler) presume(b *fleet.Backend, d fleet.Load, replicas int, now time.Time) {
	w := time.Duration(s.blind.Load())
	if replicas <= 1 || w <= 0 {
		return
	}
	// Only what the request adds before its first byte: the peers' own
	// events replace the presumption long before it would decode.
	d = fleet.Load{InFlight: d.InFlight, PendingPrefill: d.PendingPrefill}.Scale(int64(replicas - 1))
	b.AddPresumedLoad(d)
	s.presumed = append(s.presumed, presumption{b: b, d: d, until: now.Add(w)})
}

// forgetPresumed takes back the presumptions whose window has passed by
// now: the peers' own events have arrived by then. The caller holds
// s.decide.
func (s *Scheduler) forgetPresumed(now time.Time) {
	k := 0
	for ; k < len(s.presumed) && !now.Before(s.presumed[k].until); k++ {
		s.presumed[k].b.AddPresumedLoad(s.presumed[k].d.Neg())
	}
	if k > 0 {
		clear(s.presumed[:k])
		s.presumed = s.presumed[k:]
	}
}

// SetReplicaID tells the scheduler this replica's ID (sync.replica_id),
// which the claims of its policy's session table carry: among claims made
// at the same instant, the lower ID's hash wins at every replica
// (policy.Claim.Wins). The owner of the peers (replica.Peers) sets it.
func (s *Scheduler) SetReplicaID(id string) { s.replicaID.Store(policy.HashReplica(id)) }

// Replicas returns what SetReplicas last set: the live replicas (1 for
// one router) and this one's place among them in [0, 1).
func (s *Scheduler) Replicas() (n int, arc float64) {
	if rp := s.replicas.Load(); rp != nil {
		return rp.n, rp.arc
	}
	return 1, 0
}

// Learn applies a past decision another replica made: b now holds
// hashes, most recent first (evictable), and the conversation of claim c
// (c.Session 0 for none) lives on b if c wins in the session table of a
// policy that keeps one.
func (s *Scheduler) Learn(b *fleet.Backend, hashes []uint64, c policy.Claim) {
	if len(hashes) > 0 {
		s.index.Insert(b.ID, hashes)
	}
	s.learnSession(b, c)
}

// Pin applies a request another replica routed and that is in flight: as
// for a request routed here, its blocks are pinned on b until Unpin (the
// engine cannot evict them while it runs, and they become the most recent
// when it ends, which is when the engine frees them), and its session's
// claim learnt. It returns the index's handles for Unpin.
func (s *Scheduler) Pin(b *fleet.Backend, hashes []uint64, c policy.Claim) []int32 {
	var nodes []int32
	if len(hashes) > 0 {
		nodes = s.index.AcquireNodes(b.ID, hashes, nil)
	}
	s.learnSession(b, c)
	return nodes
}

// Pinned returns the blocks b holds pinned in the prefix index (its own
// requests' and its peers') and its capacity in blocks (see
// prefix.Index.Pinned).
func (s *Scheduler) Pinned(b *fleet.Backend) (pinned, capacity int) { return s.index.Pinned(b.ID) }

// Unpin ends a Pin: the peer's request is done.
func (s *Scheduler) Unpin(b *fleet.Backend, hashes []uint64, nodes []int32) {
	if len(hashes) > 0 {
		s.index.ReleaseNodes(b.ID, hashes, nodes)
	}
}

func (s *Scheduler) learnSession(b *fleet.Backend, c policy.Claim) {
	if l := s.pol.Load().sessions; c.Session != 0 && l != nil {
		l.LearnSession(c, b.ID)
	}
}

// claimOf is the claim by which the conversation with key hash session
// lives on backend id, for the peers; the zero Claim when the policy
// keeps no session table (l nil) or the conversation lives elsewhere (the
// request did not go to its home).
func claimOf(l policy.SessionLearner, session uint64, id int) policy.Claim {
	if session != 0 && l != nil {
		if home, c := l.SessionOf(session); home == id {
			return c
		}
	}
	return policy.Claim{}
}
