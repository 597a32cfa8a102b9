package policy

import (
	"sync/atomic"

	"github.com/cespare/xxhash/v2"
)

// Claim is what a session table holds of a conversation besides its
// backend: which routing made the backend its home. Every replica keeps
// the winning claim of each conversation (Wins), so that replicas which
// hear the same claims, in any order, hold the same backend for it: the
// table is a register whose merge every replica computes alike, not the
// last write each happened to receive.
type Claim struct {
	// Session is the conversation's key hash (HashSession); 0 is none.
	Session uint64
	// Epoch counts the conversation's moves: 0 for the routing that
	// placed it, one more for each routing that took it from its backend
	// to another.
	Epoch uint32
	// At is when the routing that made the claim was decided (the
	// scheduler's now, in Unix nanoseconds), and By the replica that
	// decided it (HashReplica of its ID; 0 for one router).
	At int64
	By uint64
}

// Wins reports whether claim c takes the place of d for the same
// conversation: a later move (a higher Epoch) wins; among claims of one
// epoch, made by replicas that each did not know of the other's, the
// earlier (At), then the lower By. The order is total, so every replica
// settles on the same claim whatever order the claims reach it in.
func (c Claim) Wins(d Claim) bool {
	if c.Epoch != d.Epoch {
		return c.Epoch > d.Epoch
	}
	if c.At != d.At {
		return c.At < d.At
	}
	return c.By < d.By
}

// HashReplica is the one hash of a replica ID that claims carry.
func HashReplica(id string) uint64 { return xxhash.Sum64String(id) }

// sessionEntry is one conversation's home: its backend's fleet ID and the
// claim that made it. Entries are immutable once published.
type sessionEntry struct {
	id    int
	claim Claim
}

// Sessions is kvroute's session table: the backend each conversation
// lives on. It is direct-mapped and lossy (sessionSlotsLog2 slots of one
// pointer; a collision evicts the older conversation, which then falls
// back to its prefix match and its placement), lock-free: a pick reads
// one atomic pointer, and a write replaces an entry only through a
// compare-and-swap, so concurrent writers (routings here, a peer's
// claims) leave the winning claim whatever their order. The table is
// written twice per conversation at most in steady state: when it is
// placed and when it moves; a routing that follows its home writes
// nothing.
type Sessions struct {
	slots [1 << sessionSlotsLog2]atomic.Pointer[sessionEntry]
}

func (t *Sessions) slot(h uint64) *atomic.Pointer[sessionEntry] {
	return &t.slots[h&(1<<sessionSlotsLog2-1)]
}

// Lookup returns the backend ID and the claim of the conversation with
// key hash h, or -1.
func (t *Sessions) Lookup(h uint64) (int, Claim) {
	if e := t.slot(h).Load(); e != nil && e.claim.Session == h && h != 0 {
		return e.id, e.claim
	}
	return -1, Claim{}
}

// Routed records that this replica (by) routed the conversation with key
// hash h to backend id at at: nothing if that is its home; else a claim,
// placing it (epoch 0) when the table does not know it, moving it (one
// epoch more) when it lived elsewhere.
func (t *Sessions) Routed(h uint64, id int, at int64, by uint64) {
	if h == 0 {
		return
	}
	s := t.slot(h)
	for {
		cur := s.Load()
		c := Claim{Session: h, At: at, By: by}
		if cur != nil && cur.claim.Session == h {
			if cur.id == id {
				return
			}
			c.Epoch = cur.claim.Epoch + 1
		}
		if s.CompareAndSwap(cur, &sessionEntry{id: id, claim: c}) {
			return
		}
	}
}

// Learn merges a claim another replica made (or its snapshot carried):
// the conversation c.Session lives on backend id if c wins over the
// table's claim for it, or the table holds none (an older conversation in
// its slot is evicted, as by a routing here).
func (t *Sessions) Learn(c Claim, id int) {
	if c.Session == 0 || id < 0 {
		return
	}
	s := t.slot(c.Session)
	for {
		cur := s.Load()
		if cur != nil && cur.claim.Session == c.Session && (cur.claim == c || !c.Wins(cur.claim)) {
			return
		}
		if s.CompareAndSwap(cur, &sessionEntry{id: id, claim: c}) {
			return
		}
	}
}
