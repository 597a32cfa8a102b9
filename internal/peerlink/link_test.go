package peerlink

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/replica"
	"github.com/kvroute/kvroute/internal/scheduler"
)

// link is one replica under test: its link, its one backend a:1, its
// scheduler and its metrics.
type link struct {
	*Link
	b     *fleet.Backend
	sched *scheduler.Scheduler
	reg   *prometheus.Registry
}

// startLink starts replica id's link to the NATS server at url over a
// fleet of the backend a:1, with the default sync settings changed by
// mod (nil: none).
func startLink(t *testing.T, url, id string, mod func(*config.Sync)) *link {
	t.Helper()
	s := config.Default().Sync
	s.URL, s.ReplicaID = url, id
	if mod != nil {
		mod(&s)
	}
	f := fleet.New()
	b := f.Add("a:1", nil, nil)
	sched := scheduler.New(f, policy.NewKVRoute(policy.Options{}), scheduler.Config{})
	reg := prometheus.NewRegistry()
	l, err := New(Config{Sync: s, Fleet: f, Scheduler: sched, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return &link{Link: l, b: b, sched: sched, reg: reg}
}

// metric is the value of the link's counter or gauge name.
func (l *link) metric(t *testing.T, name string) float64 {
	t.Helper()
	mfs, err := l.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			m := mf.GetMetric()[0]
			return m.GetCounter().GetValue() + m.GetGauge().GetValue() + float64(m.GetHistogram().GetSampleCount())
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// tap records the batches published on a subject, decoded.
type tap struct {
	mu      sync.Mutex
	batches []replica.Batch
}

func listen(t *testing.T, url, subj string) *tap {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	tp := &tap{}
	if _, err := nc.Subscribe(subj, func(m *nats.Msg) {
		var b replica.Batch
		if err := replica.Decode(m.Data, &b); err != nil {
			t.Errorf("%s: undecodable batch: %v", subj, err)
			return
		}
		tp.mu.Lock()
		tp.batches = append(tp.batches, b)
		tp.mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return tp
}

// of returns the batches of kind seen so far.
func (tp *tap) of(kind replica.BatchKind) []replica.Batch {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	var out []replica.Batch
	for _, b := range tp.batches {
		if b.Kind == kind {
			out = append(out, b)
		}
	}
	return out
}

// seqs returns the sequence numbers of every batch seen so far.
func (tp *tap) seqs() []uint64 {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	var out []uint64
	for _, b := range tp.batches {
		out = append(out, b.Seq)
	}
	return out
}

// hashes returns n block hashes from base on.
func hashes(base uint64, n int) []uint64 {
	h := make([]uint64, n)
	for i := range h {
		h[i] = base + uint64(i)
	}
	return h
}

// TestEventsBatched: events queued within sync.flush_interval leave in one
// batch, unless the batch reaches maxBatchBytes first, which sends it at
// once; the batches on the events subject carry consecutive sequence
// numbers, heartbeats included.
func TestEventsBatched(t *testing.T) {
	ns := natsServer(t)
	tp := listen(t, ns.ClientURL(), "kvroute.events.r1")
	r1 := startLink(t, ns.ClientURL(), "r1", func(s *config.Sync) {
		s.Heartbeat = time.Hour // only the one on connecting
		s.FlushInterval = 2 * time.Second
	})
	waitUntil(t, "the connecting heartbeat", func() bool { return len(tp.of(replica.Heartbeat)) == 1 })

	// Three decisions of 20,000 blocks (160 kB of hashes) each: the
	// second fills the batch past maxBatchBytes, the third waits for the
	// flush interval.
	const blocks = 20_000
	for i := range 3 {
		r1.outbox.Routed(uint64(i+1), r1.b, hashes(uint64(i)*blocks, blocks), policy.Claim{}, fleet.Load{InFlight: 1})
	}
	waitUntil(t, "the three decisions", func() bool {
		n := 0
		for _, b := range tp.of(replica.Events) {
			n += len(b.Events)
		}
		return n == 3
	})
	var sizes []int
	for _, b := range tp.of(replica.Events) {
		sizes = append(sizes, len(b.Events))
	}
	if !slices.Equal(sizes, []int{2, 1}) {
		t.Errorf("batches of %v events, want [2 1] (the first two fill a batch, the third waits for the flush)", sizes)
	}
	if seqs := tp.seqs(); !slices.Equal(seqs, []uint64{1, 2, 3}) {
		t.Errorf("sequence numbers %v, want [1 2 3]", seqs)
	}

	// Small events within the interval: one batch.
	for i := range 5 {
		r1.outbox.Changed(uint64(10+i), r1.b, fleet.Load{InFlight: -1})
	}
	waitUntil(t, "the five changes", func() bool { return len(tp.of(replica.Events)) == 3 })
	if b := tp.of(replica.Events)[2]; len(b.Events) != 5 {
		t.Errorf("the five changes came in a batch of %d", len(b.Events))
	}
	if c := r1.Counts(); c.Queued != 8 || c.Taken != 8 || c.Streamed != 8 {
		t.Errorf("counts %+v, want 8 queued, taken and streamed", c)
	}
	if got := r1.metric(t, "kvroute_sync_events_published_total"); got != 8 {
		t.Errorf("kvroute_sync_events_published_total %v, want 8", got)
	}
}

// TestEventsSentAtOnce: with no flush interval (the default) each event
// leaves as soon as the sender takes it.
func TestEventsSentAtOnce(t *testing.T) {
	ns := natsServer(t)
	tp := listen(t, ns.ClientURL(), "kvroute.events.r1")
	r1 := startLink(t, ns.ClientURL(), "r1", func(s *config.Sync) { s.Heartbeat = time.Hour })
	waitUntil(t, "the connecting heartbeat", func() bool { return len(tp.of(replica.Heartbeat)) == 1 })
	r1.outbox.Changed(1, r1.b, fleet.Load{InFlight: 1})
	waitUntil(t, "the change", func() bool { return len(tp.of(replica.Events)) == 1 })
}

// TestHeartbeatCarriesLoad: a replica's heartbeat reports its whole own
// load, which replaces its share at a peer, without any event; a peer
// silent for sync.peer_timeout is forgotten with its load.
func TestHeartbeatCarriesLoad(t *testing.T) {
	ns := natsServer(t)
	fast := func(s *config.Sync) { s.Heartbeat, s.PeerTimeout = 50*time.Millisecond, 2*time.Second }
	r1 := startLink(t, ns.ClientURL(), "r1", fast)
	r2 := startLink(t, ns.ClientURL(), "r2", fast)
	waitUntil(t, "the replicas to hear each other", func() bool { return r1.Peers().Live() == 1 && r2.Peers().Live() == 1 })

	// Load taken outside the scheduler: no event tells of it.
	now := time.Now()
	tk := r1.b.Start(100, 100, 10, now)
	waitUntil(t, "r2 to see r1's request in flight", func() bool { return r2.b.PeerLoad().InFlight == 1 })
	if got := r2.b.PeerLoad().PendingPrefill; got != 100 {
		t.Errorf("r2 sees %d pending prefill tokens of r1's, want 100", got)
	}
	tk.FirstByte(now)
	tk.Done(now)
	waitUntil(t, "r2 to see r1's load gone", func() bool { return r2.b.PeerLoad().IsZero() })

	tk = r1.b.Start(10, 10, 10, time.Now())
	waitUntil(t, "r2 to see r1's new request", func() bool { return r2.b.PeerLoad().InFlight == 1 })
	r1.Abort() // silent from now on, its request never ends
	waitUntil(t, "r2 to forget r1", func() bool { return r2.Peers().Live() == 0 })
	if l := r2.b.PeerLoad(); !l.IsZero() {
		t.Errorf("r2 still holds r1's load %+v after forgetting it", l)
	}
	if got := r2.metric(t, "kvroute_sync_peers_expired_total"); got != 1 {
		t.Errorf("kvroute_sync_peers_expired_total %v, want 1", got)
	}
	if got := r2.metric(t, "kvroute_sync_peers"); got != 0 {
		t.Errorf("kvroute_sync_peers %v, want 0", got)
	}
	_ = tk
}

// TestSnapshotToLatePeer: a replica that joins late asks every peer for
// its history and learns the decisions they made before it was there.
func TestSnapshotToLatePeer(t *testing.T) {
	ns := natsServer(t)
	r1 := startLink(t, ns.ClientURL(), "r1", nil)
	inbox := listen(t, ns.ClientURL(), "kvroute.inbox.r2")
	const blocks = 40
	r1.outbox.Routed(1, r1.b, hashes(1000, blocks), policy.Claim{}, fleet.Load{})
	waitUntil(t, "r1 to send its decision", func() bool { return r1.Counts().Taken == 1 })

	r2 := startLink(t, ns.ClientURL(), "r2", nil)
	waitUntil(t, "r1's snapshot to reach r2", func() bool { return len(inbox.of(replica.Snapshot)) >= 1 })
	snap := inbox.of(replica.Snapshot)[0]
	if snap.Replica != "r1" || len(snap.Events) != 1 || len(snap.Events[0].Hashes) != blocks {
		t.Fatalf("snapshot from %s of %d events, want r1's one decision", snap.Replica, len(snap.Events))
	}
	waitUntil(t, "r2 to learn r1's blocks", func() bool { return r2.sched.Index().Len(r2.b.ID) == blocks })
	if s := r2.Peers().Stats(); s.Snapshots == 0 {
		t.Errorf("r2 counted no snapshot: %+v", s)
	}
}

// TestSnapshotRequestAnswered: a request for this replica's history is
// answered on the asker's inbox, an empty history with an empty snapshot;
// a request to every replica is asked back.
func TestSnapshotRequestAnswered(t *testing.T) {
	ns := natsServer(t)
	r1 := startLink(t, ns.ClientURL(), "r1", nil)
	inbox := listen(t, ns.ClientURL(), "kvroute.inbox.p")
	asked := make(chan *nats.Msg, 4)
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := nc.ChanSubscribe("kvroute.snapshot.p", asked); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	subscribed(t, ns, "kvroute.snapshot.r1", "kvroute.snapshot")
	if err := nc.PublishRequest("kvroute.snapshot.r1", "kvroute.inbox.p", nil); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "r1's empty snapshot", func() bool { return len(inbox.of(replica.Snapshot)) == 1 })
	if b := inbox.of(replica.Snapshot)[0]; b.Replica != "r1" || len(b.Events) != 0 {
		t.Errorf("snapshot from %s of %d events, want r1's, empty", b.Replica, len(b.Events))
	}

	r1.outbox.Routed(1, r1.b, hashes(1, 4), policy.Claim{}, fleet.Load{InFlight: 1})
	waitUntil(t, "r1 to send its decision", func() bool { return r1.Counts().Taken == 1 })
	if err := nc.PublishRequest("kvroute.snapshot", "kvroute.inbox.p", nil); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "r1's second snapshot", func() bool { return len(inbox.of(replica.Snapshot)) == 2 })
	if b := inbox.of(replica.Snapshot)[1]; len(b.Events) != 1 {
		t.Errorf("second snapshot of %d events, want r1's one decision", len(b.Events))
	}
	// Only the request to every replica was asked back, once.
	select {
	case m := <-asked:
		if m.Reply != "kvroute.inbox.r1" {
			t.Errorf("asked back with reply %q, want kvroute.inbox.r1", m.Reply)
		}
	case <-time.After(time.Minute):
		t.Fatal("a request to every replica was not asked back")
	}
	select {
	case m := <-asked:
		t.Errorf("asked back twice (%s): the request to r1 alone was asked back too", m.Reply)
	case <-time.After(100 * time.Millisecond):
	}
}

// TestReconnection: while NATS is down the link says so and drops what
// it would send (counted, never buffered); when NATS is back on the same
// address the link reconnects by itself, the peers hear each other
// again, and requests wait for the catch-up (CaughtUp) until the peers
// known at the cut have reported.
func TestReconnection(t *testing.T) {
	ns := natsServer(t)
	port := ns.Addr().(*net.TCPAddr).Port
	fast := func(s *config.Sync) { s.Heartbeat, s.PeerTimeout = 50*time.Millisecond, 30*time.Second }
	r1 := startLink(t, ns.ClientURL(), "r1", fast)
	r2 := startLink(t, ns.ClientURL(), "r2", fast)
	waitUntil(t, "the replicas to hear each other", func() bool { return r1.Peers().Live() == 1 && r2.Peers().Live() == 1 })
	if got := r1.metric(t, "kvroute_sync_connected"); got != 1 {
		t.Fatalf("kvroute_sync_connected %v while connected", got)
	}

	ns.Shutdown()
	waitUntil(t, "r1 to see NATS gone", func() bool { return !r1.Connected() })
	if got := r1.metric(t, "kvroute_sync_connected"); got != 0 {
		t.Errorf("kvroute_sync_connected %v while NATS is down", got)
	}
	dropped := r1.metric(t, "kvroute_sync_events_dropped_total")
	r1.outbox.Changed(1, r1.b, fleet.Load{InFlight: 1})
	waitUntil(t, "r1 to drop its change", func() bool { return r1.metric(t, "kvroute_sync_events_dropped_total") > dropped })

	ns2, err := LoopbackServer(port)
	if err != nil {
		t.Skipf("cannot restart NATS on port %d: %v", port, err)
	}
	t.Cleanup(ns2.Shutdown)
	waitUntil(t, "r1 to reconnect", func() bool { return r1.Connected() && r2.Connected() })
	select {
	case <-r1.CaughtUp():
	case <-time.After(time.Minute):
		t.Fatal("r1 never caught up with r2 after the reconnection")
	}
	if s := r1.Peers().Stats(); s.CatchUpsCut != 0 {
		t.Errorf("the catch-up was cut by its timer: %+v", s)
	}
	if got := r1.metric(t, "kvroute_sync_connected"); got != 1 {
		t.Errorf("kvroute_sync_connected %v after the reconnection", got)
	}
	if r1.Peers().Live() != 1 || r2.Peers().Live() != 1 {
		t.Errorf("live peers after the reconnection: r1 %d, r2 %d; want 1 each", r1.Peers().Live(), r2.Peers().Live())
	}
}

// TestBadTagDroppedBeforeDecoding: with a sync key, a message whose tag is
// missing or wrong is dropped before it is decoded: malformed bytes with
// a bad tag count as unauthenticated, never as malformed; the same bytes
// with the right tag reach the decoder.
func TestBadTagDroppedBeforeDecoding(t *testing.T) {
	ns := natsServer(t)
	secret := strings.Repeat("0123456789abcdef", 4)
	keyFile := filepath.Join(t.TempDir(), "sync.key")
	if err := os.WriteFile(keyFile, []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	r1 := startLink(t, ns.ClientURL(), "r1", func(s *config.Sync) { s.KeyFile = keyFile })
	waitUntil(t, "r1 to connect", r1.Connected)
	right, _ := replica.NewKey([]byte(secret))
	wrong, _ := replica.NewKey([]byte(strings.Repeat("x", 64)))
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	subj := "kvroute.events.p"
	garbage := []byte("not a batch at all, not a batch at all")
	subscribed(t, ns, subj)
	for _, msg := range [][]byte{garbage, wrong.Seal(slices.Clone(garbage), subj, "")} {
		if err := nc.Publish(subj, msg); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, "r1 to refuse both", func() bool { return r1.Peers().Stats().Unauthenticated == 2 })
	if got := r1.Peers().Stats().Malformed; got != 0 {
		t.Errorf("%d messages with a bad tag were decoded", got)
	}
	if err := nc.Publish(subj, right.Seal(slices.Clone(garbage), subj, "")); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "r1 to find the tagged garbage malformed", func() bool { return r1.Peers().Stats().Malformed == 1 })
	if got := r1.metric(t, "kvroute_sync_malformed_total"); got != 1 {
		t.Errorf("kvroute_sync_malformed_total %v, want 1", got)
	}
	if got := r1.metric(t, "kvroute_sync_unauthenticated_total"); got != 2 {
		t.Errorf("kvroute_sync_unauthenticated_total %v, want 2", got)
	}
}

// TestSyncMetrics: what a peer sends is counted where it is applied
// (events received, the lag of each batch, gaps in its sequence), a new
// peer is asked for its history, and live peers are shown.
func TestSyncMetrics(t *testing.T) {
	ns := natsServer(t)
	r1 := startLink(t, ns.ClientURL(), "r1", nil)
	waitUntil(t, "r1 to connect", r1.Connected)
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	asked := make(chan *nats.Msg, 4)
	if _, err := nc.ChanSubscribe("kvroute.snapshot.p", asked); err != nil {
		t.Fatal(err)
	}
	send := func(seq uint64, events ...replica.Event) {
		t.Helper()
		b := replica.Batch{Kind: replica.Events, Replica: "p", Incarnation: 1, Seq: seq, SentAt: time.Now().UnixNano(), BlockChars: r1.sched.BlockChars(), Events: events}
		if err := nc.Publish("kvroute.events.p", replica.Append(nil, &b)); err != nil {
			t.Fatal(err)
		}
	}
	subscribed(t, ns, "kvroute.events.p")
	ev := replica.Event{Kind: replica.Changed, Request: 1, Backend: "a:1", Load: fleet.Load{InFlight: 1}}
	send(1, ev)
	select {
	case m := <-asked:
		if m.Reply != "kvroute.inbox.r1" {
			t.Errorf("asked p with reply %q", m.Reply)
		}
	case <-time.After(time.Minute):
		t.Fatal("a new peer was not asked for its history")
	}
	waitUntil(t, "r1 to apply p's batch", func() bool { return r1.metric(t, "kvroute_sync_events_received_total") == 1 })
	if got := r1.metric(t, "kvroute_sync_peers"); got != 1 {
		t.Errorf("kvroute_sync_peers %v, want 1", got)
	}
	ev2 := ev
	ev2.Request, ev2.Load = 2, fleet.Load{InFlight: -1}
	send(3, ev2, ev2) // batch 2 was lost
	waitUntil(t, "r1 to apply p's third batch", func() bool { return r1.metric(t, "kvroute_sync_events_received_total") == 3 })
	if got := r1.metric(t, "kvroute_sync_gaps_total"); got != 1 {
		t.Errorf("kvroute_sync_gaps_total %v, want 1", got)
	}
	if got := r1.metric(t, "kvroute_sync_lag_seconds"); got != 2 {
		t.Errorf("kvroute_sync_lag_seconds observed %v batches, want 2", got)
	}
}
