package peerlink

import (
	"context"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/replica"
	"github.com/kvroute/kvroute/internal/scheduler"
)

// natsServer runs a NATS server in-process on a free loopback port.
func natsServer(tb testing.TB) *server.Server {
	tb.Helper()
	ns, err := LoopbackServer(0)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(ns.Shutdown)
	return ns
}

// replicaUnder is one replica's link over a fleet of the backend a:1,
// with sync settings of s (URL and ID set here; heartbeats every 50 ms,
// peers forgotten after peerTimeout), started.
func replicaUnder(tb testing.TB, url, id string, s config.Sync, capacity int, peerTimeout time.Duration) (*Link, *fleet.Backend, *scheduler.Scheduler) {
	tb.Helper()
	s.URL, s.ReplicaID = url, id
	s.Heartbeat, s.PeerTimeout = 50*time.Millisecond, peerTimeout
	f := fleet.New()
	b := f.Add("a:1", nil, nil)
	sched := scheduler.New(f, policy.NewKVRoute(policy.Options{}), scheduler.Config{Capacity: capacity})
	l, err := New(Config{Sync: s, Fleet: f, Scheduler: sched})
	if err != nil {
		tb.Fatal(err)
	}
	if err := l.Start(context.Background()); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(l.Close)
	return l, b, sched
}

// waitUntil polls cond every 5 ms for up to a minute (a loaded machine
// delays NATS delivery, never by that much).
func waitUntil(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	for start := time.Now(); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Since(start) > time.Minute {
			tb.Fatalf("waited a minute for %s", what)
		}
	}
}

// subscribed waits until the server has a subscriber for each subject: a
// link that has connected may not yet have its subscriptions registered
// with the server, and a message published before then is lost.
func subscribed(tb testing.TB, ns *server.Server, subjects ...string) {
	tb.Helper()
	for _, subj := range subjects {
		waitUntil(tb, "a subscriber of "+subj, func() bool { return ns.GlobalAccount().SubscriptionInterest(subj) })
	}
}

// rssBytes is the process's resident memory, from /proc (0 elsewhere).
func rssBytes() float64 {
	b, _ := os.ReadFile("/proc/self/status")
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			return kb * 1024
		}
	}
	return 0
}

// BenchmarkForgedFlood is finding 2's probe: a third party publishes b.N
// messages of 100 Routed events of 1,000 fresh block hashes each on the
// sync subject, through an in-process NATS server, to one replica whose
// backend's prefix index holds 28,181 blocks. It reports the replica's
// heap after a GC, the process's resident memory and the blocks the
// index holds (docs/reliability.md, "Finding 2").
func BenchmarkForgedFlood(b *testing.B) {
	const capacity = 28181
	ns := natsServer(b)
	// The forger stays live however slowly its messages are applied, as
	// it would by sending heartbeats.
	l, be, sched := replicaUnder(b, ns.ClientURL(), "victim", config.Default().Sync, capacity, time.Hour)
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	batch := replica.Batch{Kind: replica.Events, Replica: "forger", Incarnation: 1, BlockChars: sched.BlockChars()}
	hashes := make([]uint64, 100*1000)
	for i := range 100 {
		batch.Events = append(batch.Events, replica.Event{Kind: replica.Routed, Backend: "a:1", Hashes: hashes[i*1000 : (i+1)*1000]})
	}
	var buf []byte
	next := uint64(1)
	applied := func() uint64 { return l.Peers().Stats().Batches }
	base := applied()
	b.ResetTimer()
	for i := range b.N {
		for k := range hashes {
			next++
			hashes[k] = next
		}
		for k := range batch.Events {
			batch.Events[k].Request = next + uint64(k)
		}
		batch.Seq = uint64(i + 1)
		batch.SentAt = time.Now().UnixNano()
		buf = replica.Append(buf[:0], &batch)
		if err := nc.Publish("kvroute.events.forger", buf); err != nil {
			b.Fatal(err)
		}
		// Keep the replica's pending messages under nats.go's slow
		// consumer limit (64 MB), so that every message is applied.
		if i >= 16 {
			waitUntil(b, "the replica to apply the flood", func() bool { return applied()-base >= uint64(i-16) })
		}
	}
	_ = nc.Flush()
	waitUntil(b, "the replica to apply the flood", func() bool { return applied()-base >= uint64(b.N) })
	b.StopTimer()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b.ReportMetric(float64(ms.HeapInuse)/(1<<20), "heap-MiB")
	b.ReportMetric(rssBytes()/(1<<20), "rss-MiB")
	b.ReportMetric(float64(sched.Index().Len(be.ID)), "blocks")
}
