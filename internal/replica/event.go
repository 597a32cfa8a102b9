// Package replica shares what one kvroute router knows with the other
// replicas in front of the same fleet: the decisions it made (a request's
// backend, its prompt's block hashes and its conversation), the load those
// requests hold as they move from routed to first byte to done, and a
// heartbeat that reports this replica's whole load. It owns the events and
// their wire encoding, the queue that takes them off the routing path
// (Outbox), the recent history a late peer asks for (History), and the
// state of the peers (Peers): what each live peer holds on each backend,
// and when it was last heard.
//
// A peer's events are applied to the local state through the owners that
// local routing uses: its load to fleet.Backend.AddPeerLoad, its blocks and
// conversations to scheduler.Learn (the prefix index and the policy's
// session table, whose claims merge alike at every replica). Backends are named by fleet.Backend.Name, the configured
// name (host:port by default), never by the local fleet ID.
//
// The package does no I/O and reads no clock: the transport (package
// peerlink, over NATS) and the simulator both feed it, with time passed in.
package replica

import (
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/policy"
)

// Kind is what an Event says.
type Kind uint8

// Event kinds.
const (
	// Routed: the sender routed request Request (its number for it) to
	// Backend: Load is the change
	// in its load (one more in flight, its uncached prompt tokens
	// pending), Hashes the prompt's block hashes, Claim the claim by
	// which its conversation lives on Backend (Claim.Session 0 for none).
	Routed Kind = iota + 1
	// Changed: the sender's request Request on Backend had its first byte
	// or ended (Load.InFlight is then -1), changing its load by Load.
	Changed
	// Report: the sender's own load on Backend is Load, in a heartbeat.
	// A heartbeat's reports are the whole of it: a backend it leaves out
	// holds none of the sender's requests.
	Report
	// Learned: a past decision (Hashes, Claim) on Backend, in a snapshot;
	// it carries no load.
	Learned
	// Stored: Backend stored the response whose id hashes to
	// Claim.Session (scheduler.HashResponse) at Claim.At; it carries no
	// load and no hashes. In the stream and in snapshots.
	Stored
	maxKind = Stored
)

// Event is one thing a replica tells its peers.
type Event struct {
	Kind    Kind
	Request uint64
	Backend string
	Load    fleet.Load
	Claim   policy.Claim
	Hashes  []uint64
}

// BatchKind says what a Batch is.
type BatchKind uint8

// Batch kinds.
const (
	// Events is the ordinary stream: Routed and Changed, in the order the
	// sender accounted them.
	Events BatchKind = iota + 1
	// Heartbeat is the sender's whole load (Report events), at its point
	// in the stream: it replaces what its receivers had summed so far.
	Heartbeat
	// Snapshot answers a peer's request with the sender's recent decisions
	// (Learned events).
	Snapshot
	maxBatchKind = Snapshot
)

// Batch is one message between replicas: events from one sender.
type Batch struct {
	Kind BatchKind
	// Replica is the sender's replica ID; Incarnation tells one run of it
	// from the next (a restarted replica's old requests are gone).
	Replica     string
	Incarnation uint64
	// Seq numbers the sender's Events and Heartbeat batches 1, 2, 3...: a
	// gap means some were lost.
	Seq uint64
	// SentAt is the sender's clock when it sent the batch, in Unix
	// nanoseconds, for the lag.
	SentAt int64
	// BlockChars is the sender's prefix block size: block hashes only mean
	// the same thing between replicas with the same.
	BlockChars int
	Events     []Event
}

// OwnReport returns the heartbeat events of f: this replica's own load on
// every backend that has any.
func OwnReport(f *fleet.Fleet, dst []Event) []Event {
	for _, b := range f.Snapshot().All {
		if l := b.OwnLoad(); !l.IsZero() {
			dst = append(dst, Event{Kind: Report, Backend: b.Name, Load: l})
		}
	}
	return dst
}
