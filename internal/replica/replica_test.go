package replica

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/prefix"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/scheduler"
)

var t0 = time.Unix(1_700_000_000, 0)

func sampleBatch() *Batch {
	return &Batch{
		Kind: Events, Replica: "r1", Incarnation: 42, Seq: 7, SentAt: t0.UnixNano(), BlockChars: 64,
		Events: []Event{
			{Kind: Routed, Request: 300, Backend: "a:1", Load: fleet.Load{InFlight: 1, PendingPrefill: 900}, Claim: policy.Claim{Session: 1<<63 | 5, Epoch: 3, At: -7, By: 1 << 62}, Hashes: []uint64{1, 2, 1 << 60}},
			{Kind: Changed, Request: 300, Backend: "b:2", Load: fleet.Load{PendingPrefill: -900, Decoding: 1, DecodeBudget: 256, DecodeTokens: 1000}},
			{Kind: Changed, Backend: "a:1", Load: fleet.Load{InFlight: -1, Decoding: -1, DecodeBudget: -256, DecodeTokens: -1000}},
			{Kind: Learned, Backend: "b:2", Claim: policy.Claim{Session: 9, At: 1e18}, Hashes: []uint64{3}},
			{Kind: Report, Backend: "a:1", Load: fleet.Load{InFlight: 3}},
			{Kind: Stored, Backend: "b:2", Claim: policy.Claim{Session: 77, At: 5e17}, Hashes: []uint64{}},
		},
	}
}

func TestCodecRoundTrip(t *testing.T) {
	in := sampleBatch()
	p := Append(nil, in)
	var out Batch
	if err := Decode(p, &out); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(in, &out) {
		t.Fatalf("round trip:\n in %+v\nout %+v", in, &out)
	}
	// Every truncation is refused, never a panic.
	for n := range len(p) {
		if err := Decode(p[:n], &out); !errors.Is(err, ErrMalformed) {
			t.Fatalf("truncated to %d bytes: err %v", n, err)
		}
	}
}

func TestDecodeRefuses(t *testing.T) {
	good := Append(nil, sampleBatch())
	cases := map[string][]byte{
		"empty":      nil,
		"magic":      append([]byte("XX"), good[2:]...),
		"version":    append([]byte{'K', 'R', 9}, good[3:]...),
		"batch kind": append([]byte{'K', 'R', wireVersion, 0}, good[4:]...),
		"trailing":   append(append([]byte{}, good...), 0),
	}
	hdr := Append(nil, &Batch{Kind: Events})
	// Claim 2^40 names.
	cases["names"] = append(hdr[:len(hdr)-2], 0x80, 0x80, 0x80, 0x80, 0x80, 0x20)
	// A Routed event claiming 2^20 hashes in a short message.
	one := Append(nil, &Batch{Kind: Events, Events: []Event{{Kind: Routed, Backend: "x", Hashes: []uint64{7}}}})
	cases["hash count"] = append(one[:len(one)-9], 0x80, 0x80, 0x40, 1, 2, 3, 4, 5, 6, 7, 8)
	for name, p := range cases {
		var b Batch
		if err := Decode(p, &b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err %v, want ErrMalformed", name, err)
		}
	}
}

// FuzzDecode drives what a replica does with a message from the sync
// subjects: open it with the group's key (a tagged message opens only
// with it) and decode it.
func FuzzDecode(f *testing.F) {
	key, err := NewKey([]byte("fuzz-key-fuzz-key-fuzz-key-fuzz-key"))
	if err != nil {
		f.Fatal(err)
	}
	const subject = "kvroute.events.r1"
	f.Add(Append(nil, sampleBatch()))
	f.Add(Append(nil, &Batch{Kind: Heartbeat, Replica: "x"}))
	f.Add([]byte("KR\x01\x01"))
	f.Add(key.Seal(Append(nil, sampleBatch()), subject, ""))
	f.Fuzz(func(t *testing.T, p []byte) {
		if msg, err := key.Open(subject, "", p); err == nil {
			// Only a message sealed with the key opens: the seeds'.
			if string(key.Seal(append([]byte(nil), msg...), subject, "")) != string(p) {
				t.Fatal("opened a message its tag does not cover")
			}
			p = msg
		} else if !errors.Is(err, ErrUnauthenticated) {
			t.Fatalf("open: %v", err)
		}
		var b Batch
		if err := Decode(p, &b); err != nil {
			return
		}
		// What decodes re-encodes to a message that decodes the same.
		var again Batch
		if err := Decode(Append(nil, &b), &again); err != nil {
			t.Fatalf("re-encoded batch does not decode: %v", err)
		}
		if len(again.Events) != len(b.Events) || again.Replica != b.Replica {
			t.Fatalf("re-encoding changed the batch")
		}
	})
}

// fixture is one replica's fleet of backends a:1 and b:2 and its scheduler.
func fixture(t testing.TB) (*fleet.Fleet, *scheduler.Scheduler, *Peers) {
	t.Helper()
	f := fleet.New()
	f.Add("a:1", nil, nil)
	f.Add("b:2", nil, nil)
	s := scheduler.New(f, policy.NewKVRoute(policy.Options{}), scheduler.Config{})
	return f, s, NewPeers("self", f, s, 5*time.Second)
}

func TestPeersLoad(t *testing.T) {
	f, _, p := fixture(t)
	a, b := f.Snapshot().All[0], f.Snapshot().All[1]
	routed := Event{Kind: Routed, Backend: "a:1", Load: fleet.Load{InFlight: 1, PendingPrefill: 100}}
	first := Event{Kind: Changed, Backend: "a:1", Load: fleet.Load{PendingPrefill: -100, Decoding: 1, DecodeBudget: 10, DecodeTokens: 100}}
	steps := []struct {
		name  string
		batch Batch
		at    time.Duration
		a, b  fleet.Load
		isNew bool
	}{
		{"routed", Batch{Kind: Events, Replica: "p", Incarnation: 1, Seq: 1, Events: []Event{routed, routed}}, 0,
			fleet.Load{InFlight: 2, PendingPrefill: 200}, fleet.Load{}, true},
		{"first byte", Batch{Kind: Events, Replica: "p", Incarnation: 1, Seq: 2, Events: []Event{first}}, time.Second,
			fleet.Load{InFlight: 2, PendingPrefill: 100, Decoding: 1, DecodeBudget: 10, DecodeTokens: 100}, fleet.Load{}, false},
		{"own ignored", Batch{Kind: Events, Replica: "self", Incarnation: 1, Seq: 1, Events: []Event{routed}}, time.Second,
			fleet.Load{InFlight: 2, PendingPrefill: 100, Decoding: 1, DecodeBudget: 10, DecodeTokens: 100}, fleet.Load{}, false},
		{"heartbeat replaces", Batch{Kind: Heartbeat, Replica: "p", Incarnation: 1, Seq: 3, Events: []Event{{Kind: Report, Backend: "b:2", Load: fleet.Load{InFlight: 4}}}}, 2 * time.Second,
			fleet.Load{}, fleet.Load{InFlight: 4}, false},
		{"second peer", Batch{Kind: Events, Replica: "q", Incarnation: 1, Seq: 1, Events: []Event{routed}}, 2 * time.Second,
			fleet.Load{InFlight: 1, PendingPrefill: 100}, fleet.Load{InFlight: 4}, true},
		{"restart forgets", Batch{Kind: Heartbeat, Replica: "p", Incarnation: 2, Seq: 1}, 3 * time.Second,
			fleet.Load{InFlight: 1, PendingPrefill: 100}, fleet.Load{}, true},
		{"snapshot carries no load", Batch{Kind: Snapshot, Replica: "p", Incarnation: 2, Events: []Event{{Kind: Learned, Backend: "b:2", Hashes: []uint64{1}}}}, 3 * time.Second,
			fleet.Load{InFlight: 1, PendingPrefill: 100}, fleet.Load{}, false},
	}
	for _, st := range steps {
		got := p.Apply(&st.batch, t0.Add(st.at))
		if got.New != st.isNew {
			t.Errorf("%s: New %v, want %v", st.name, got.New, st.isNew)
		}
		if a.PeerLoad() != st.a || b.PeerLoad() != st.b {
			t.Errorf("%s: peer load a %+v b %+v, want %+v %+v", st.name, a.PeerLoad(), b.PeerLoad(), st.a, st.b)
		}
	}
	if a.OwnLoad() != (fleet.Load{}) || a.Load() != a.PeerLoad() {
		t.Errorf("own load %+v, load %+v", a.OwnLoad(), a.Load())
	}
	if n := p.Live(); n != 2 {
		t.Errorf("live %d, want 2", n)
	}
	// q was last heard at 2s, p at 3s: at 7.5s only q is past 5s.
	if n := p.Expire(t0.Add(7500 * time.Millisecond)); n != 1 {
		t.Errorf("after q's timeout %d live, want 1", n)
	}
	if a.PeerLoad() != (fleet.Load{}) {
		t.Errorf("expired peer's load stays: %+v", a.PeerLoad())
	}
	if s := p.Stats(); s.Expired != 1 || s.Gaps != 0 {
		t.Errorf("stats %+v", s)
	}
}

func TestPeersLearn(t *testing.T) {
	f, s, p := fixture(t)
	prompt := string(make([]byte, 64*4))
	v := &request.View{Prompt: prompt, PromptTokens: 64, SessionKey: "conv-1"}
	hashes := prefix.Hash(nil, prompt, s.BlockChars())
	p.Apply(&Batch{Kind: Events, Replica: "p", Incarnation: 1, Seq: 1, BlockChars: s.BlockChars(), Events: []Event{
		{Kind: Routed, Backend: "b:2", Load: fleet.Load{InFlight: 1}, Claim: policy.Claim{Session: policy.HashSession("conv-1")}, Hashes: hashes},
	}}, t0)
	out := make([]int32, 2)
	s.Index().Match(hashes, out)
	if out[1] != int32(len(hashes)) || out[0] != 0 {
		t.Fatalf("index after a peer's routing: %v, want b to hold %d blocks", out, len(hashes))
	}
	// The session's next turn follows, although b carries the peer's load
	// (the engines have been seen before: no cold-start cap).
	for _, b := range f.Snapshot().All {
		b.ObserveRunning(0, 0, -1)
	}
	a, err := s.Route(v, nil, t0)
	if err != nil {
		t.Fatal(err)
	}
	if a.Backend != f.Snapshot().All[1] {
		t.Errorf("routed to %s (%s), want b:2", a.Backend.Name, a.Reason)
	}
	a.Done(t0)
	// A mismatched block size keeps the session and drops the hashes.
	other := prefix.Hash(nil, "x"+prompt, s.BlockChars())
	p.Apply(&Batch{Kind: Events, Replica: "p", Incarnation: 1, Seq: 2, BlockChars: 32, Events: []Event{
		{Kind: Routed, Backend: "a:1", Load: fleet.Load{InFlight: 1}, Hashes: other},
	}}, t0)
	s.Index().Match(other, out)
	if out[0] != 0 {
		t.Errorf("hashes of another block size were applied: %v", out)
	}
}

// TestPeersStored: a response one replica learnt was stored reaches a
// peer through the outbox, the codec and Apply, whose continuations then
// go to the engine holding it; the history carries it to a late peer.
func TestPeersStored(t *testing.T) {
	f, s, _ := fixture(t)
	o := NewOutbox(8)
	s.SetEvents(o)
	b := f.Snapshot().All[1]
	s.ResponseStored("resp_1", b, t0)
	evs := o.Drain(nil, 8)
	if len(evs) != 1 || evs[0].Kind != Stored {
		t.Fatalf("outbox %+v", evs)
	}
	var in Batch
	if err := Decode(Append(nil, &Batch{Kind: Events, Replica: "p", Incarnation: 1, Seq: 1, BlockChars: 64, Events: evs}), &in); err != nil {
		t.Fatal(err)
	}
	h := NewHistory(4, 4)
	h.Add(in.Events[0])
	for _, batch := range []*Batch{&in, {Kind: Snapshot, Replica: "q", Incarnation: 1, BlockChars: 64, Events: h.Events(nil)}} {
		pf, ps, pp := fixture(t)
		pp.Apply(batch, t0)
		if name, ok := ps.ResponseHome("resp_1", t0); !ok || name != "b:2" {
			t.Fatalf("peer's table after a %v batch: %q %v", batch.Kind, name, ok)
		}
		for range 4 {
			a, err := ps.Route(&request.View{PreviousResponseID: "resp_1", Prompt: "x"}, nil, t0)
			if err != nil || a.Backend != pf.Snapshot().All[1] {
				t.Fatalf("continuation routed to %v (%v)", a, err)
			}
			a.Done(t0)
		}
	}
}

func TestOutboxDrops(t *testing.T) {
	o := NewOutbox(2)
	f := fleet.New()
	b := f.Add("a:1", nil, nil)
	for range 5 {
		o.Changed(1, b, fleet.Load{InFlight: 1})
	}
	if got := o.Drain(nil, 10); len(got) != 2 || o.Dropped() != 3 {
		t.Fatalf("drained %d, dropped %d; want 2 and 3", len(got), o.Dropped())
	}
}

func TestHistoryBounds(t *testing.T) {
	h := NewHistory(3, 5)
	for i := range 5 {
		h.Add(Event{Kind: Routed, Backend: "a", Claim: policy.Claim{Session: uint64(i)}, Hashes: make([]uint64, 2)})
	}
	got := h.Events(nil)
	// 5 hashes allow two events of 2.
	if len(got) != 2 || got[0].Claim.Session != 3 || got[1].Claim.Session != 4 || got[0].Kind != Learned {
		t.Fatalf("history %+v", got)
	}
	h.Add(Event{Kind: Changed, Backend: "a"})
	if len(h.Events(nil)) != 2 {
		t.Fatal("a Changed event entered the history")
	}
}

// TestPeersPin: a peer's request in flight pins its blocks here until its
// end, or until the peer is forgotten.
func TestPeersPin(t *testing.T) {
	for _, end := range []string{"done", "restart", "timeout"} {
		t.Run(end, func(t *testing.T) {
			_, s, p := fixture(t)
			s.Index().SetCapacity(0, 4) // room for the peer's pins (see TestPeersFloodBounded)
			hashes := []uint64{11, 12, 13, 14}
			p.Apply(&Batch{Kind: Events, Replica: "p", Incarnation: 1, Seq: 1, BlockChars: s.BlockChars(), Events: []Event{
				{Kind: Routed, Request: 1, Backend: "a:1", Load: fleet.Load{InFlight: 1}, Hashes: hashes},
			}}, t0)
			s.Index().SetCapacity(0, 1)
			if n := s.Index().Len(0); n != 4 {
				t.Fatalf("a peer's request in flight: %d blocks held, want its 4 pinned", n)
			}
			switch end {
			case "done":
				p.Apply(&Batch{Kind: Events, Replica: "p", Incarnation: 1, Seq: 2, Events: []Event{
					{Kind: Changed, Request: 1, Backend: "a:1", Load: fleet.Load{InFlight: -1}},
				}}, t0)
			case "restart":
				p.Apply(&Batch{Kind: Heartbeat, Replica: "p", Incarnation: 2, Seq: 1}, t0)
			case "timeout":
				p.Expire(t0.Add(time.Minute))
			}
			s.Index().SetCapacity(0, 1)
			if n := s.Index().Len(0); n != 1 {
				t.Errorf("after %s: %d blocks held, want 1 (unpinned, evicted to capacity)", end, n)
			}
		})
	}
}

// The scheduler learns how many replicas are live and where this one
// stands among them in the order of their IDs, as peers come, restart and
// go silent.
func TestPeersPlace(t *testing.T) {
	_, s, p := fixture(t) // this replica is "self"
	hb := func(id string, inc uint64) *Batch {
		return &Batch{Kind: Heartbeat, Replica: id, Incarnation: inc, Seq: 1}
	}
	steps := []struct {
		name  string
		apply *Batch
		at    time.Duration
		n     int
		arc   float64
	}{
		{"alone", nil, 0, 1, 0},
		{"a peer after us", hb("west", 1), 0, 2, 0},
		{"a peer before us", hb("east", 1), time.Second, 3, 1.0 / 3},
		{"a restart keeps the count", hb("west", 2), 2 * time.Second, 3, 1.0 / 3},
		{"east silent past its timeout", nil, 6500 * time.Millisecond, 2, 0},
		{"west silent too", nil, 8 * time.Second, 1, 0},
	}
	for _, st := range steps {
		if st.apply != nil {
			p.Apply(st.apply, t0.Add(st.at))
		} else {
			p.Expire(t0.Add(st.at))
		}
		if n, arc := s.Replicas(); n != st.n || arc != st.arc {
			t.Errorf("%s: %d replicas, arc %v; want %d, %v", st.name, n, arc, st.n, st.arc)
		}
	}
}

// The blind window the scheduler presumes peers' decisions for is the lag
// of their event batches (sender's clock to arrival), bounded.
func TestPeersBlindWindow(t *testing.T) {
	_, s, p := fixture(t)
	send := func(seq uint64, lag time.Duration) {
		at := t0.Add(time.Duration(seq) * time.Second)
		p.Apply(&Batch{Kind: Events, Replica: "peer", Incarnation: 1, Seq: seq, SentAt: at.Add(-lag).UnixNano()}, at)
	}
	send(1, 3*time.Millisecond)
	if got := s.BlindWindow(); got != 3*time.Millisecond {
		t.Fatalf("after one batch 3 ms late: %v", got)
	}
	for k := uint64(2); k < 60; k++ {
		send(k, time.Millisecond)
	}
	if got := s.BlindWindow(); got < 900*time.Microsecond || got > 1100*time.Microsecond {
		t.Fatalf("after many batches 1 ms late: %v, want about 1 ms", got)
	}
	for k := uint64(60); k < 120; k++ {
		send(k, time.Hour) // a skewed clock, not a delay
	}
	if got := s.BlindWindow(); got > MaxBlindWindow {
		t.Fatalf("window %v beyond MaxBlindWindow", got)
	}
}

// TestPeersCatchUp: after a cut and a reconnection, CaughtUp stays open
// until every peer live at the cut has sent a heartbeat and a snapshot;
// the bound ends it (counted), a stale bound does not end a newer
// catch-up, and without a cut nothing waits.
func TestPeersCatchUp(t *testing.T) {
	_, _, p := fixture(t)
	caughtUp := func() bool {
		select {
		case <-p.CaughtUp():
			return true
		default:
			return false
		}
	}
	if p.CatchUp(1); !caughtUp() {
		t.Fatal("a connection without a cut before waits")
	}
	hb := func(id string, seq uint64) *Batch {
		return &Batch{Kind: Heartbeat, Replica: id, Incarnation: 1, Seq: seq, BlockChars: 64}
	}
	snap := func(id string) *Batch { return &Batch{Kind: Snapshot, Replica: id, Incarnation: 1, BlockChars: 64} }
	p.Apply(hb("p", 1), t0)
	p.Apply(hb("q", 1), t0)
	p.Cut()
	// While cut, nothing waits (routing goes on), and what arrives does
	// not count toward the catch-up.
	p.Apply(hb("p", 2), t0)
	p.Apply(snap("p"), t0)
	if !caughtUp() {
		t.Fatal("requests wait while the replica is cut off")
	}
	if !p.Pending() {
		t.Fatal("a cut does not await its catch-up")
	}
	gen, _ := p.CatchUp(2)
	// The reconnection's handler, after a request started its catch-up.
	if _, started := p.CatchUp(2); started || p.Pending() || caughtUp() {
		t.Fatalf("a second start of one reconnection's catch-up: started %v, pending %v, caught up %v; want false, false, false", started, p.Pending(), caughtUp())
	}
	for _, step := range []struct {
		b    *Batch
		want bool
	}{
		{hb("p", 3), false}, {snap("p"), false}, {snap("q"), false}, {hb("x", 1), false}, {hb("q", 2), true},
	} {
		p.Apply(step.b, t0)
		if caughtUp() != step.want {
			t.Fatalf("after %v from %s: caught up %v, want %v", step.b.Kind, step.b.Replica, !step.want, step.want)
		}
	}
	if n := p.Stats().CatchUpsCut; n != 0 {
		t.Fatalf("%d catch-ups cut short, want 0", n)
	}
	// A second cut: q never comes back. The first catch-up's bound passes
	// and does not end the second; the second's does, and is counted.
	p.Cut()
	gen2, _ := p.CatchUp(3)
	p.Apply(hb("p", 4), t0)
	p.Apply(snap("p"), t0)
	p.EndCatchUp(gen)
	if caughtUp() {
		t.Fatal("an older catch-up's bound ended the newer one")
	}
	p.EndCatchUp(gen2)
	if !caughtUp() || p.Stats().CatchUpsCut != 1 {
		t.Fatalf("after its bound: caught up %v, %d cut short; want true, 1", caughtUp(), p.Stats().CatchUpsCut)
	}
}
