package replica

import (
	"math"

	"github.com/kvroute/kvroute/internal/fleet"
)

// What a peer can make this replica hold. Peers are other kvroute
// replicas, but anyone who can publish on the sync subjects speaks as one
// (docs/reliability.md, "Sync between replicas"), so each thing a peer's
// messages add to is bounded here, whatever the peer sends:
//
//   - Peers: at most maxPeers live at once (SetMaxPeers); a batch from a
//     new replica ID beyond it is refused and counted (Stats.Refused).
//   - Pins: a peer's requests in flight pin their blocks in the prefix
//     index, where nothing evicts them. While the backend's pinned blocks
//     exceed its capacity, or the blocks all peers pin there do, the
//     oldest pin of the peer that pins the most there is released
//     (Stats.Evicted): the index never holds more than its capacity
//     because of peers, a flooding peer loses its own pins first, and
//     the pins' hashes, which Peers keeps for the release, are bounded
//     by the capacity too.
//   - Load: a peer's load on a backend is clamped to ClaimBound, what
//     the engine can hold (Stats.Clamped).

// DefaultMaxPeers is the default cap on live peers (config sync.max_peers).
const DefaultMaxPeers = 64

// SetMaxPeers caps the live peers at n (DefaultMaxPeers if n <= 0). Peers
// already live stay; new ones are refused until some are forgotten.
func (p *Peers) SetMaxPeers(n int) {
	if n <= 0 {
		n = DefaultMaxPeers
	}
	p.mu.Lock()
	p.maxPeers = n
	p.mu.Unlock()
}

// admit reports whether a batch from a replica ID not live may make it a
// peer, counting it if not. The caller holds p.mu.
func (p *Peers) admit() bool {
	limit := p.maxPeers
	if limit <= 0 {
		limit = DefaultMaxPeers
	}
	if len(p.peers) < limit {
		return true
	}
	p.stats.Refused++
	return false
}

// held is one peer's pins on one backend, oldest first.
type held struct {
	// blocks is the hashes its pins there hold, pins how many there are.
	blocks, pins int
	// order is its pins as they came; an entry whose pin has ended (or
	// whose request number was pinned again since) is stale and skipped.
	order []pinRef
	head  int
}

// pinRef names one pin: its request number and the serial its peer gave it.
type pinRef struct{ request, serial uint64 }

// hold records pn as pr's pin of its request id, ending a pin the number
// had (a bug of the sender's), then releases the oldest pins on pn's
// backend while they hold more than it can (see bound). pn.hashes must be
// pr's own copy. The caller holds p.mu.
func (p *Peers) hold(pr *peer, id uint64, pn pin) {
	p.release(pr, id)
	pr.serial++
	pn.serial = pr.serial
	pr.pins[id] = pn
	if pr.held == nil {
		pr.held = map[*fleet.Backend]*held{}
	}
	h := pr.held[pn.b]
	if h == nil {
		h = &held{}
		pr.held[pn.b] = h
	}
	h.blocks += len(pn.hashes)
	h.pins++
	h.order = append(h.order, pinRef{request: id, serial: pn.serial})
	p.bound(pn.b)
}

// release ends pr's pin of request id, if it has one. The caller holds p.mu.
func (p *Peers) release(pr *peer, id uint64) {
	pn, ok := pr.pins[id]
	if !ok {
		return
	}
	p.unpin(pn)
	delete(pr.pins, id)
	h := pr.held[pn.b]
	if h == nil {
		return
	}
	h.blocks -= len(pn.hashes)
	h.pins--
	if h.pins == 0 {
		delete(pr.held, pn.b)
		return
	}
	// Drop the stale entries in place when they are most of the order, so
	// that its length stays within a small multiple of the live pins.
	if n := len(h.order) - h.head; n > 2*h.pins+16 {
		kept := h.order[:0]
		for _, r := range h.order[h.head:] {
			if q, ok := pr.pins[r.request]; ok && q.serial == r.serial {
				kept = append(kept, r)
			}
		}
		clear(h.order[len(kept):])
		h.order, h.head = kept, 0
	}
}

// oldest returns pr's oldest pin on b; pr holds at least one there.
func (pr *peer) oldest(b *fleet.Backend) uint64 {
	h := pr.held[b]
	for {
		r := h.order[h.head]
		h.head++
		if q, ok := pr.pins[r.request]; ok && q.serial == r.serial {
			return r.request
		}
	}
}

// bound releases the oldest pin of the peer pinning the most blocks on b,
// while b's pinned blocks exceed its capacity in the prefix index or its
// peers' pins hold more hashes than that capacity. When this replica's
// own requests alone pin more, every peer's pins there go: they are
// learnt blocks then, evictable. The caller holds p.mu.
func (p *Peers) bound(b *fleet.Backend) {
	for {
		pinned, capacity := p.sched.Pinned(b)
		var top *peer
		total := 0
		for _, pr := range p.peers {
			if h := pr.held[b]; h != nil {
				total += h.blocks
				if top == nil || h.blocks > top.held[b].blocks {
					top = pr
				}
			}
		}
		if top == nil || (pinned <= capacity && total <= capacity) {
			return
		}
		id := top.oldest(b)
		p.stats.Evicted += uint64(len(top.pins[id].hashes))
		p.release(top, id)
	}
}

// Bounds of a peer's claim on a backend whose limits are unknown:
// DefaultClaimSeqs sequences (vLLM's max_num_seqs is 256 to 1,024) of
// DefaultClaimContext tokens each.
const (
	DefaultClaimSeqs    = 1024
	DefaultClaimContext = 1 << 17
)

// ClaimBound is the most load one peer may hold on b: twice what its
// engine runs at once (its sequence cap, as fleet.Backend.Limits knows
// it, else DefaultClaimSeqs), in requests and in streams, and that many
// requests of a whole context (its context length, else
// DefaultClaimContext) in each token count. Twice: room for a queue as
// deep as the batch, for an engine whose cap was learnt from below.
// Beyond it an honest replica's load is not worth less, but the engine's
// own metrics (its waiting queue, its KV usage) then tell the policy
// more than any router's accounting does.
func ClaimBound(b *fleet.Backend) fleet.Load {
	lim := b.Limits()
	seqs, ctx := int64(lim.MaxNumSeqs), int64(lim.ContextLen)
	if seqs <= 0 {
		seqs = DefaultClaimSeqs
	}
	if ctx <= 0 {
		ctx = DefaultClaimContext
	}
	// Both are at most 2^31 (fleet keeps them as ints from config and
	// engines), so the products stay far below 2^63.
	seqs, ctx = min(seqs, math.MaxInt32), min(ctx, math.MaxInt32)
	n := 2 * seqs
	return fleet.Load{InFlight: n, PendingPrefill: n * ctx, Decoding: n, DecodeBudget: n * ctx, DecodeTokens: n * ctx}
}

// clampClaim returns l + d field by field, saturating, within [0, bound],
// and whether it exceeded bound.
func clampClaim(l, d, bound fleet.Load) (fleet.Load, bool) {
	clamped := false
	f := func(v, dv, hi int64) int64 {
		s := v + dv
		switch {
		case dv > 0 && s < v:
			s = math.MaxInt64
		case dv < 0 && s > v:
			s = math.MinInt64
		}
		if s > hi {
			clamped = true
		}
		// Below 0 is a peer's report crossing its later events, or a
		// claim to cancel another peer's load: 0, not counted.
		return min(max(s, 0), hi)
	}
	out := fleet.Load{
		InFlight:       f(l.InFlight, d.InFlight, bound.InFlight),
		PendingPrefill: f(l.PendingPrefill, d.PendingPrefill, bound.PendingPrefill),
		Decoding:       f(l.Decoding, d.Decoding, bound.Decoding),
		DecodeBudget:   f(l.DecodeBudget, d.DecodeBudget, bound.DecodeBudget),
		DecodeTokens:   f(l.DecodeTokens, d.DecodeTokens, bound.DecodeTokens),
	}
	return out, clamped
}
