package peerlink

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
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

// TestAuthenticatedPeers: with a key, replicas hear each other, and a
// third party on the same NATS server is refused and counted whatever it
// sends: events without a tag, with another key's, a replay of a tagged
// batch older than the peer timeout, a snapshot request without a tag. A
// replica without the key joins neither way.
func TestAuthenticatedPeers(t *testing.T) {
	ns := natsServer(t)
	secret := strings.Repeat("0123456789abcdef", 4)
	keyFile := filepath.Join(t.TempDir(), "sync.key")
	if err := os.WriteFile(keyFile, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	keyed := config.Default().Sync
	keyed.KeyFile = keyFile
	// Peers are forgotten, and messages refused as replays, after 30 s: a
	// busy machine that stalls r1 for a second neither expires r2 nor
	// turns its heartbeats into refused ones; the replay below is older.
	const peerTimeout = 30 * time.Second
	r1, a1, _ := replicaUnder(t, ns.ClientURL(), "r1", keyed, 0, peerTimeout)
	r2, _, _ := replicaUnder(t, ns.ClientURL(), "r2", keyed, 0, peerTimeout)
	waitUntil(t, "the keyed replicas to hear each other", func() bool { return r1.Peers().Live() == 1 && r2.Peers().Live() == 1 })
	reg := prometheus.NewRegistry()
	if err := r1.register(reg); err != nil {
		t.Fatal(err)
	}

	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	claim := func(sentAt time.Time) []byte {
		return replica.Append(nil, &replica.Batch{Kind: replica.Events, Replica: "forger", Incarnation: 1, Seq: 1, SentAt: sentAt.UnixNano(), BlockChars: 64,
			Events: []replica.Event{{Kind: replica.Routed, Request: 1, Backend: "a:1", Load: fleet.Load{InFlight: 1000}, Hashes: []uint64{1, 2, 3}}}})
	}
	right, _ := replica.NewKey([]byte(secret))
	wrong, _ := replica.NewKey([]byte(strings.Repeat("x", 64)))
	subj := "kvroute.events.forger"
	before := r1.Peers().Stats().Unauthenticated
	sends := []func() error{
		func() error { return nc.Publish(subj, claim(time.Now())) },
		func() error { return nc.Publish(subj, wrong.Seal(claim(time.Now()), subj, "")) },
		func() error { return nc.Publish(subj, right.Seal(claim(time.Now().Add(-time.Minute)), subj, "")) },
		func() error { return nc.PublishRequest("kvroute.snapshot", "kvroute.inbox.forger", nil) },
	}
	for _, send := range sends {
		if err := send(); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	want := before + uint64(len(sends))
	waitUntil(t, "r1 to refuse the forged messages", func() bool { return r1.Peers().Stats().Unauthenticated >= want })
	if got := metricValue(t, reg, "kvroute_sync_unauthenticated_total"); got < float64(len(sends)) {
		t.Errorf("kvroute_sync_unauthenticated_total %v, want at least %d", got, len(sends))
	}
	if n := r1.Peers().Live(); n != 1 {
		t.Errorf("r1 has %d live peers, want 1 (r2)", n)
	}
	if l := a1.PeerLoad(); l.InFlight != 0 {
		t.Errorf("a forged claim was applied: peer load %+v", l)
	}
	r1.askMu.Lock()
	_, asked := r1.asked["forger"]
	r1.askMu.Unlock()
	if asked {
		t.Error("r1 asked the forger for a snapshot")
	}

	// A replica without the key is no peer of the keyed ones, nor they of it.
	r3, _, _ := replicaUnder(t, ns.ClientURL(), "r3", config.Default().Sync, 0, peerTimeout)
	waitUntil(t, "r3 to drop the keyed replicas' heartbeats", func() bool { return r3.Peers().Stats().Malformed >= 2 })
	waitUntil(t, "r1 to drop r3's heartbeats", func() bool { return r1.Peers().Stats().Unauthenticated > want })
	if r1.Peers().Live() != 1 || r3.Peers().Live() != 0 {
		t.Errorf("live peers: r1 %d (want 1), r3 %d (want 0)", r1.Peers().Live(), r3.Peers().Live())
	}
}

// metricValue is the value of reg's counter name.
func metricValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no counter %s", name)
	return 0
}

// TestLimitsLogged: a limit hit is logged at the next heartbeat, then at
// most once every limitLogEvery, and nothing is logged while none is hit.
func TestLimitsLogged(t *testing.T) {
	var out strings.Builder
	s := config.Default().Sync
	s.MaxPeers = 1
	f := fleet.New()
	f.Add("a:1", nil, nil)
	l, err := New(Config{Sync: s, Fleet: f, Scheduler: scheduler.New(f, policy.NewKVRoute(policy.Options{}), scheduler.Config{}),
		Log: slog.New(slog.NewTextHandler(&out, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1_700_000_000, 0)
	hb := func(id string, at time.Time) {
		l.peers.Apply(&replica.Batch{Kind: replica.Heartbeat, Replica: id, Incarnation: 1, Seq: 1}, at)
	}
	lines := func() int { return strings.Count(out.String(), "peers' messages limited") }
	hb("p", t0)
	l.logLimits(t0)
	if lines() != 0 {
		t.Fatalf("logged with no limit hit: %s", out.String())
	}
	for k, want := range []int{1, 1, 1, 2} {
		at := t0.Add(time.Duration(k) * 4 * time.Second)
		hb("q", at) // refused: one peer at most
		hb("p", at)
		l.logLimits(at)
		if lines() != want {
			t.Fatalf("at %v: %d lines, want %d:\n%s", at.Sub(t0), lines(), want, out.String())
		}
	}
	if !strings.Contains(out.String(), "peers_refused=1") {
		t.Errorf("the first line does not count the refused peer: %s", out.String())
	}
}
