package replica

import (
	"errors"
	"fmt"
	"testing"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/request"
)

// peerHashes is what peers pin on b in p's bookkeeping: the hashes their
// pins keep.
func peerHashes(p *Peers, b *fleet.Backend) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, pr := range p.peers {
		for _, pn := range pr.pins {
			if pn.b == b {
				n += len(pn.hashes)
			}
		}
	}
	return n
}

// TestPeersFloodBounded: a forged peer publishing Routed events of fresh
// block hashes, never ending them (issue: 100 events of 1,000 a message
// took one backend's index to 10.9 million blocks against a capacity of
// 28,181), cannot take the backend's prefix index beyond its capacity;
// its own pins go first, an honest peer's stay. Scaled down (50 times the
// capacity, not 400) to run in seconds under the race detector.
func TestPeersFloodBounded(t *testing.T) {
	const (
		capacity = 1000
		messages = 10
		events   = 50
		hashes   = 100
		flood    = messages * events * hashes
	)
	f, s, p := fixture(t)
	a := f.Snapshot().All[0]
	s.Index().SetCapacity(a.ID, capacity)
	honest := []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	p.Apply(&Batch{Kind: Events, Replica: "q", Incarnation: 1, Seq: 1, BlockChars: s.BlockChars(), Events: []Event{
		{Kind: Routed, Request: 1, Backend: "a:1", Load: fleet.Load{InFlight: 1}, Hashes: honest},
	}}, t0)
	next := uint64(1 << 40)
	for seq := uint64(1); seq <= messages; seq++ {
		b := &Batch{Kind: Events, Replica: "forger", Incarnation: 1, Seq: seq, BlockChars: s.BlockChars()}
		for range events {
			hs := make([]uint64, hashes)
			for i := range hs {
				next++
				hs[i] = next
			}
			b.Events = append(b.Events, Event{Kind: Routed, Request: next, Backend: "a:1", Hashes: hs})
		}
		p.Apply(b, t0)
		if n := s.Index().Len(a.ID); n > capacity {
			t.Fatalf("after %d forged messages (%d blocks): the index holds %d blocks on a, capacity %d", seq, seq*events*hashes, n, capacity)
		}
		if n := peerHashes(p, a); n > capacity {
			t.Fatalf("after %d forged messages: peers' pins keep %d hashes, capacity %d", seq, n, capacity)
		}
	}
	out := make([]int32, 2)
	s.Index().Match(honest, out)
	if out[0] != int32(len(honest)) {
		t.Errorf("the honest peer's pinned blocks were evicted: a holds %d of %d", out[0], len(honest))
	}
	if st := p.Stats(); st.Evicted < flood-capacity {
		t.Errorf("evicted %d blocks, want at least %d", st.Evicted, flood-capacity)
	}

	// Pins of one hash repeated pin one block in the index but keep every
	// copy: counted as they are kept.
	for seq := uint64(messages + 1); seq <= 2*messages; seq++ {
		b := &Batch{Kind: Events, Replica: "forger", Incarnation: 1, Seq: seq, BlockChars: s.BlockChars()}
		for range events {
			next++
			hs := make([]uint64, hashes)
			for i := range hs {
				hs[i] = next
			}
			b.Events = append(b.Events, Event{Kind: Routed, Request: next, Backend: "a:1", Hashes: hs})
		}
		p.Apply(b, t0)
		if n := peerHashes(p, a); n > capacity {
			t.Fatalf("repeated hashes: peers' pins keep %d hashes, capacity %d", n, capacity)
		}
	}
}

// TestPeersClampClaims: a forged heartbeat claiming 10^17 requests on a
// backend (issue: a backend starved 30 of 30) counts as at most
// ClaimBound, twice what its engine runs; a negative claim cannot cancel
// another peer's load.
func TestPeersClampClaims(t *testing.T) {
	f, s, p := fixture(t)
	a, b := f.Snapshot().All[0], f.Snapshot().All[1]
	for _, be := range []*fleet.Backend{a, b} {
		be.SetMaxNumSeqs(8)
		be.SetContextLen(4096)
	}
	huge := fleet.Load{InFlight: 1e17, PendingPrefill: 1e17, Decoding: 1e17, DecodeBudget: 1e17, DecodeTokens: 1e17}
	p.Apply(&Batch{Kind: Heartbeat, Replica: "q", Incarnation: 1, Seq: 1, Events: []Event{
		{Kind: Report, Backend: "b:2", Load: fleet.Load{InFlight: 3}},
	}}, t0)
	p.Apply(&Batch{Kind: Heartbeat, Replica: "forger", Incarnation: 1, Seq: 1, Events: []Event{
		{Kind: Report, Backend: "a:1", Load: huge},
		{Kind: Report, Backend: "b:2", Load: fleet.Load{InFlight: -3}},
	}}, t0)
	// Deltas beyond it, up to overflow, change nothing.
	p.Apply(&Batch{Kind: Events, Replica: "forger", Incarnation: 1, Seq: 2, Events: []Event{
		{Kind: Routed, Request: 1, Backend: "a:1", Load: huge},
		{Kind: Changed, Request: 1, Backend: "a:1", Load: fleet.Load{InFlight: 1 << 62, PendingPrefill: 1 << 62}},
		{Kind: Changed, Request: 1, Backend: "a:1", Load: fleet.Load{InFlight: 1 << 62, PendingPrefill: 1 << 62}},
	}}, t0)
	got := a.PeerLoad()
	if got.InFlight > 2*8 || got.Decoding > 2*8 || got.PendingPrefill > 2*8*4096 || got.DecodeTokens > 2*8*4096 || got.DecodeBudget > 2*8*4096 {
		t.Fatalf("a forged claim of %+v counts as %+v; want at most twice 8 sequences of 4096 tokens", huge, got)
	}
	if got != ClaimBound(a) {
		t.Errorf("peer load %+v, want the bound %+v", got, ClaimBound(a))
	}
	if l := b.PeerLoad(); l.InFlight != 3 {
		t.Errorf("a negative claim cancelled the honest peer's load on b: %+v", l)
	}
	if st := p.Stats(); st.Clamped == 0 {
		t.Errorf("no clamp counted: %+v", st)
	}
	// Routing: the claim weighs as a full engine, not as an infinite one:
	// once b carries as much, a gets requests again.
	toA := 0
	for i := range 60 {
		v := &request.View{Prompt: fmt.Sprintf("%08d", i) + string(make([]byte, 16_000)), PromptTokens: 4000}
		as, err := s.Route(v, nil, t0)
		if err != nil {
			t.Fatal(err)
		}
		if as.Backend == a {
			toA++
		}
	}
	t.Logf("%d of 60 requests to a under the forged claim", toA)
	if toA == 0 {
		t.Errorf("a got none of 60 requests under a forged claim")
	}
}

// TestPeersCapped: a flood of fresh replica IDs (issue: 1.35 million of
// them made 10,715 peers) makes at most max_peers peers; the live ones
// keep working and the rest are refused, counted.
func TestPeersCapped(t *testing.T) {
	_, s, p := fixture(t)
	p.Apply(&Batch{Kind: Heartbeat, Replica: "honest", Incarnation: 1, Seq: 1}, t0)
	const ids = 10_000
	refused := 0
	for i := range ids {
		if p.Apply(&Batch{Kind: Heartbeat, Replica: fmt.Sprintf("forged-%d", i), Incarnation: 1, Seq: 1}, t0).Refused {
			refused++
		}
	}
	if n := p.Live(); n > DefaultMaxPeers {
		t.Fatalf("%d fresh replica IDs made %d live peers, cap %d", ids, n, DefaultMaxPeers)
	}
	if n, _ := s.Replicas(); n != DefaultMaxPeers+1 {
		t.Errorf("the scheduler counts %d replicas, want %d", n, DefaultMaxPeers+1)
	}
	if a := p.Apply(&Batch{Kind: Heartbeat, Replica: "honest", Incarnation: 1, Seq: 2}, t0); a.Refused || a.New {
		t.Errorf("a live peer at the cap: %+v", a)
	}
	if st := p.Stats(); st.Refused != uint64(refused) || refused != ids-(DefaultMaxPeers-1) {
		t.Errorf("refused %d, counted %d; want %d", refused, st.Refused, ids-(DefaultMaxPeers-1))
	}
	// Once the forged ones fall silent, a new peer gets in.
	p.Expire(t0.Add(p.timeout + 1))
	if a := p.Apply(&Batch{Kind: Heartbeat, Replica: "late", Incarnation: 1, Seq: 1}, t0.Add(p.timeout+1)); !a.New {
		t.Errorf("a new peer after the flood expired: %+v", a)
	}
	p.SetMaxPeers(1)
	if a := p.Apply(&Batch{Kind: Heartbeat, Replica: "another", Incarnation: 1, Seq: 1}, t0.Add(p.timeout+1)); !a.Refused {
		t.Errorf("max peers 1, a second peer: %+v", a)
	}
}

// TestKey: a sealed message opens only with the same key, subject and
// reply, unaltered.
func TestKey(t *testing.T) {
	k1, err := NewKey([]byte("0123456789abcdef0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	k2, _ := NewKey([]byte("0123456789abcdef0123456789abcdeX"))
	if _, err := NewKey([]byte("short")); err == nil {
		t.Error("a 5-byte key was accepted")
	}
	msg := Append(nil, sampleBatch())
	sealed := k1.Seal(append([]byte(nil), msg...), "kvroute.events.r1", "")
	if got, err := k1.Open("kvroute.events.r1", "", sealed); err != nil || string(got) != string(msg) {
		t.Fatalf("open: %v", err)
	}
	flipped := append([]byte(nil), sealed...)
	flipped[10] ^= 1
	for name, try := range map[string]func() error{
		"other key":     func() error { _, err := k2.Open("kvroute.events.r1", "", sealed); return err },
		"other subject": func() error { _, err := k1.Open("kvroute.events.r2", "", sealed); return err },
		"other reply":   func() error { _, err := k1.Open("kvroute.events.r1", "x", sealed); return err },
		"altered":       func() error { _, err := k1.Open("kvroute.events.r1", "", flipped); return err },
		"untagged":      func() error { _, err := k1.Open("kvroute.events.r1", "", msg); return err },
		"short":         func() error { _, err := k1.Open("kvroute.events.r1", "", sealed[:TagSize-1]); return err },
	} {
		if err := try(); !errors.Is(err, ErrUnauthenticated) {
			t.Errorf("%s: %v, want ErrUnauthenticated", name, err)
		}
	}
	// A replica without a key reads a tagged message as malformed.
	var b Batch
	if err := Decode(sealed, &b); !errors.Is(err, ErrMalformed) {
		t.Errorf("a tagged message decoded without the key: %v", err)
	}
	var none *Key
	if got, err := none.Open("s", "", msg); err != nil || string(none.Seal(got, "s", "")) != string(msg) {
		t.Error("a nil key changed the message")
	}
}
