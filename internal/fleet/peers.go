package fleet

import "sync/atomic"

// Peer replicas. When several kvroute replicas route over the same
// backends, each one counts the requests it routed itself (the Load of its
// tickets) and adds what its peers report: the replica package keeps each
// peer's share and hands the changes in through AddPeerLoad, so that the
// fleet holds one sum per backend and pickers read it with the rest of
// Load, lock-free. A peer that goes silent is subtracted as a whole by the
// same call (its share, negated).

// peerLoad is the sum of the live peers' load on one backend.
type peerLoad struct {
	inflight, pendingPrefill, decoding, decodeBudget, decodeTokens atomic.Int64
}

// load reads the sum, each field clamped at 0: a peer's report and its
// later deltas may cross (see replica.Peers), and a negative load would
// make a backend look better than idle.
func (p *peerLoad) load() Load {
	return Load{
		InFlight:       max(p.inflight.Load(), 0),
		PendingPrefill: max(p.pendingPrefill.Load(), 0),
		Decoding:       max(p.decoding.Load(), 0),
		DecodeBudget:   max(p.decodeBudget.Load(), 0),
		DecodeTokens:   max(p.decodeTokens.Load(), 0),
	}
}

// add adds d to the sum.
func (p *peerLoad) add(d Load) {
	p.inflight.Add(d.InFlight)
	p.pendingPrefill.Add(d.PendingPrefill)
	p.decoding.Add(d.Decoding)
	p.decodeBudget.Add(d.DecodeBudget)
	p.decodeTokens.Add(d.DecodeTokens)
}

// AddPeerLoad adds d, a change in the load peer replicas hold on b, to
// what Load reports. Prefill finished by a peer's request (a negative
// PendingPrefill with a new decoding stream, its first byte) also counts
// toward the prefill work against which b's rate samples are measured.
func (b *Backend) AddPeerLoad(d Load) {
	b.peers.add(d)
	if d.Decoding > 0 && d.PendingPrefill < 0 {
		b.prefilled.Add(-d.PendingPrefill)
	}
}

// AddPresumedLoad adds d to the load this router presumes its peers are
// adding to b right now, before their events can reach it: Load counts it,
// PeerLoad does not. The scheduler adds a routing's load for each peer
// and takes it back once the peers' own events would have arrived
// (scheduler.SetBlindWindow).
func (b *Backend) AddPresumedLoad(d Load) {
	b.presumed.add(d)
}

// Scale returns l with every field multiplied by k.
func (l Load) Scale(k int64) Load {
	return Load{l.InFlight * k, l.PendingPrefill * k, l.Decoding * k, l.DecodeBudget * k, l.DecodeTokens * k}
}

// PeerLoad returns the load b's live peer replicas hold on it, as Load adds it.
func (b *Backend) PeerLoad() Load { return b.peers.load() }

// add adds o to l field by field.
func (l *Load) add(o Load) {
	l.InFlight += o.InFlight
	l.PendingPrefill += o.PendingPrefill
	l.Decoding += o.Decoding
	l.DecodeBudget += o.DecodeBudget
	l.DecodeTokens += o.DecodeTokens
}

// Add returns l + o field by field.
func (l Load) Add(o Load) Load { l.add(o); return l }

// Neg returns -l field by field.
func (l Load) Neg() Load {
	return Load{-l.InFlight, -l.PendingPrefill, -l.Decoding, -l.DecodeBudget, -l.DecodeTokens}
}

// IsZero reports whether every field of l is 0.
func (l Load) IsZero() bool { return l == Load{} }
