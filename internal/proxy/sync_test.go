package proxy

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/kvroute/kvroute/internal/clocktest"
	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/peerlink"
)

// natsServer runs a NATS server in-process on a loopback port (port 0:
// a free one), stopped when the test ends.
func natsServer(t *testing.T, port int) *server.Server {
	t.Helper()
	ns, err := peerlink.LoopbackServer(port)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	return ns
}

// replicas is n routers sharing state through one NATS server, over the
// same fake backends.
type replicas struct {
	t     *testing.T
	ns    *server.Server
	fakes []*fake
	rigs  []*rig
	// held is how many requests a test keeps in flight on purpose: settle
	// waits for the rest to be done.
	held int64
}

// newReplicas starts nb fakes, a NATS server and n routers with sync on
// (short heartbeat and peer timeout). serves(i) lists the fakes router i
// has in its config, nil for all.
func newReplicas(t *testing.T, n, nb int, serves func(i int) []int) *replicas {
	t.Helper()
	rs := &replicas{t: t, ns: natsServer(t, 0)}
	for i := range nb {
		rs.fakes = append(rs.fakes, newFake(t, fmt.Sprintf("b%d", i)))
	}
	for i := range n {
		rs.rigs = append(rs.rigs, rs.router(i, serves))
	}
	rs.waitPeers(n - 1)
	return rs
}

func (rs *replicas) router(i int, serves func(int) []int) *rig {
	r := &rig{t: rs.t, client: &http.Client{Timeout: 10 * time.Second}}
	idx := []int{}
	if serves != nil {
		idx = serves(i)
	}
	if len(idx) == 0 {
		for j := range rs.fakes {
			idx = append(idx, j)
		}
	}
	cfg := config.Default()
	cfg.Listen = "127.0.0.1:0"
	cfg.Health.Interval = 20 * time.Millisecond
	cfg.Engines.Enabled = false
	for _, j := range idx {
		cfg.Backends = append(cfg.Backends, config.Backend{URL: rs.fakes[j].srv.URL, Name: rs.fakes[j].name})
	}
	cfg.Sync.URL = rs.ns.ClientURL()
	cfg.Sync.ReplicaID = fmt.Sprintf("r%d", i)
	cfg.Sync.Heartbeat = 100 * time.Millisecond
	cfg.Sync.PeerTimeout = 500 * time.Millisecond
	if err := cfg.Validate(); err != nil {
		rs.t.Fatal(err)
	}
	srv, err := newRouter(cfg, nil)
	if err != nil {
		rs.t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		rs.t.Fatal(err)
	}
	r.srv, r.base = srv, "http://"+srv.Addr()
	rs.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	return r
}

func (rs *replicas) link(i int) *peerlink.Link { return rs.rigs[i].srv.Peers() }

// waitFor polls cond until it holds, failing the test after 30 s
// stretched by how far the process falls behind meanwhile: a bound on a
// hang, not on speed (a loaded 2-core machine under -race has taken over
// 5 s for three replicas to see five long prompts).
func (rs *replicas) waitFor(what string, cond func() bool) {
	rs.t.Helper()
	start := time.Now()
	clock := clocktest.Start(rs.t)
	defer clock.Stop()
	defer func() { rs.t.Logf("waited %v for %s", time.Since(start), what) }()
	if !clock.Until(30*time.Second, cond) {
		rs.t.Fatalf("timed out waiting for %s (%s)", what, clock)
	}
}

// waitPeers waits until every replica has want live peers.
func (rs *replicas) waitPeers(want int) {
	rs.t.Helper()
	rs.waitFor(fmt.Sprintf("%d live peers each", want), func() bool {
		for i := range rs.rigs {
			if rs.link(i) != nil && rs.link(i).Peers().Live() != want {
				return false
			}
		}
		return true
	})
}

// settle waits until every event the replicas have queued is sent, and
// every replica has applied what the others sent.
func (rs *replicas) settle() {
	rs.t.Helper()
	// A client has its answer before the exchange settles (the ticket's
	// Done, and with it the event that tells the peers, follows the last
	// byte): wait for every replica's own requests to be done first, or
	// the outbox may look drained before their Done is queued.
	rs.waitFor("every replica's requests to settle", func() bool {
		var own int64
		for _, r := range rs.rigs {
			for _, b := range r.srv.Fleet().Snapshot().All {
				own += b.OwnLoad().InFlight
			}
		}
		return own == rs.held
	})
	sent := make([]uint64, len(rs.rigs))
	for i := range rs.rigs {
		l := rs.link(i)
		rs.waitFor("the outbox to drain", func() bool { c := l.Counts(); return c.Taken == c.Queued })
		sent[i] = l.Counts().Streamed
	}
	for i := range rs.rigs {
		var want uint64
		for j := range rs.rigs {
			if j != i {
				want += sent[j]
			}
		}
		rs.waitFor(fmt.Sprintf("replica %d to apply its peers' events", i), func() bool { return rs.link(i).Peers().Stats().Streamed >= want })
	}
}

// backendOf posts body (with the session key, if any) to replica i and
// returns the backend that answered.
func (rs *replicas) backendOf(i int, body, session string) string {
	rs.t.Helper()
	var hdr []string
	if session != "" {
		hdr = []string{"X-Session-ID", session}
	}
	res := rs.rigs[i].post("/v1/chat/completions", body, hdr...)
	if res.status != 200 {
		rs.t.Fatalf("replica %d: status %d: %s", i, res.status, res.body)
	}
	return res.header.Get("X-Kvroute-Backend")
}

func TestSyncConversationAcrossReplicas(t *testing.T) {
	rs := newReplicas(t, 3, 4, nil)
	for s := range 6 {
		key := fmt.Sprintf("conv-%d", s)
		home := ""
		for turn := range 4 {
			// Turns share no text: only the session table, learned from
			// whichever replica routed the last turn, keeps them together.
			got := rs.backendOf((s+turn)%3, chat("shared", false, words(fmt.Sprintf("%s-t%d", key, turn), 300)), key)
			if home == "" {
				home = got
			} else if got != home {
				t.Errorf("%s turn %d (replica %d) went to %s, earlier turns to %s", key, turn, (s+turn)%3, got, home)
			}
			rs.settle()
		}
	}
}

// onlyLast makes replica 0 know only the last backend, so that where it
// routes is no accident that another replica's own choice could repeat.
func onlyLast(nb int) func(int) []int {
	return func(i int) []int {
		if i == 0 {
			return []int{nb - 1}
		}
		return nil
	}
}

func TestSyncFollowsPrefixRoutedElsewhere(t *testing.T) {
	rs := newReplicas(t, 3, 4, onlyLast(4))
	for d := range 4 {
		doc := words(fmt.Sprintf("doc%d", d), 16000)
		home := rs.backendOf(0, chat("shared", true, doc+" Q0"), "")
		rs.settle()
		for q := 1; q < 4; q++ {
			i := 1 + q%2
			if got := rs.backendOf(i, chat("shared", true, doc+" Q"+words(fmt.Sprint(q), 40)), ""); got != home {
				t.Errorf("doc %d question %d (replica %d) went to %s; another replica routed the document to %s", d, q, i, got, home)
			}
			rs.settle()
		}
	}
}

// TestSyncPeerLoad: replica 0, which knows only b0, holds streams open
// there; replica 1 sees them and sends its requests to b1. When replica 0
// goes silent, replica 1 forgets its load after the peer timeout.
func TestSyncPeerLoad(t *testing.T) {
	rs := newReplicas(t, 2, 2, func(i int) []int {
		if i == 0 {
			return []int{0}
		}
		return nil
	})
	b0 := rs.fakes[0]
	b0.setMode(modeGated)
	const held = 3
	var wg sync.WaitGroup
	for range held {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rs.rigs[0].post("/v1/chat/completions", chat("shared", true, words("held", 200)))
		}()
	}
	defer func() { close(b0.gate); wg.Wait() }()
	r1 := rs.rigs[1].srv
	peerB0 := func() int64 { return r1.Fleet().Snapshot().All[0].PeerLoad().InFlight }
	rs.waitFor("replica 1 to see replica 0's streams on b0", func() bool { return peerB0() == held })
	if own := r1.Fleet().Snapshot().All[0].OwnLoad().InFlight; own != 0 {
		t.Errorf("replica 1's own in-flight on b0 = %d, want 0", own)
	}
	for k := range 4 {
		if got := rs.backendOf(1, chat("shared", true, words(fmt.Sprintf("fresh-%d", k), 200)), ""); got != "b1" {
			t.Errorf("request %d went to %s, which replica 0 has loaded with %d streams", k, got, held)
		}
	}
	metrics := rs.rigs[1].get("/metrics").body
	for _, want := range []string{`kvroute_fleet_inflight_requests{backend="b0"} 3`, `kvroute_inflight_requests{backend="b0"} 0`, "kvroute_sync_peers 1"} {
		if !slices.Contains(strings.Split(string(metrics), "\n"), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	// The blind window is the peer batches' lag on loopback: above 0 (a
	// batch takes some time to arrive), far below the 100 ms bound.
	var window float64
	for _, line := range strings.Split(string(metrics), "\n") {
		if v, ok := strings.CutPrefix(line, "kvroute_sync_blind_window_seconds "); ok {
			window, _ = strconv.ParseFloat(v, 64)
		}
	}
	if window <= 0 || window >= 0.1 {
		t.Errorf("kvroute_sync_blind_window_seconds = %v, want in (0, 0.1)", window)
	}
	// Replica 0 dies (its link closes, its streams never end as far as its
	// peers know): within the peer timeout and a heartbeat, its load is gone.
	start := time.Now()
	rs.link(0).Close()
	rs.waitFor("replica 1 to forget replica 0's load", func() bool { return peerB0() == 0 })
	if d := time.Since(start); d < 400*time.Millisecond {
		t.Errorf("forgot the peer after %v, before its timeout", d)
	}
	if n := rs.link(1).Peers().Live(); n != 0 {
		t.Errorf("%d live peers after the only one died", n)
	}
}

// TestSyncSurvivesNATSOutage: with NATS down the replicas keep routing on
// their own state; when it returns, they reconnect and catch up on what
// was routed meanwhile (a snapshot of each other's decisions).
func TestSyncSurvivesNATSOutage(t *testing.T) {
	rs := newReplicas(t, 2, 3, onlyLast(3))
	p := rs.ns.Addr().(*net.TCPAddr).Port
	snaps := rs.link(1).Peers().Stats().Snapshots
	rs.ns.Shutdown()
	rs.waitFor("both replicas to notice", func() bool { return !rs.link(0).Connected() && !rs.link(1).Connected() })
	// Down: each replica still serves, on its own state.
	const convs = 4
	for c := range convs {
		key := fmt.Sprintf("outage-%d", c)
		rs.backendOf(0, chat("shared", false, words(key+"-t0", 300)), key)
		rs.backendOf(1, chat("shared", false, words(key+"-x", 300)), "")
	}
	rs.ns = natsServer(t, p)
	rs.waitFor("both replicas to reconnect", func() bool { return rs.link(0).Connected() && rs.link(1).Connected() })
	rs.waitFor("replica 1 to receive replica 0's snapshot", func() bool { return rs.link(1).Peers().Stats().Snapshots > snaps })
	rs.waitPeers(1)
	for c := range convs {
		key := fmt.Sprintf("outage-%d", c)
		if got := rs.backendOf(1, chat("shared", false, words(key+"-t1", 300)), key); got != "b2" {
			t.Errorf("after NATS returned, replica 1 sent %s to %s; replica 0 had it on b2 while NATS was down", key, got)
		}
	}
}
