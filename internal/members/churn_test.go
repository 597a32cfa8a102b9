package members

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/discovery"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/scheduler"
)

// churnSeries are the per-backend families, registered as the router
// registers them.
func churnSeries(reg *prometheus.Registry) Series {
	cv := func(name string, labels ...string) *prometheus.CounterVec {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: name}, labels)
		reg.MustRegister(v)
		return v
	}
	hv := func(name string) *prometheus.HistogramVec {
		v := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: name}, []string{"backend", "model"})
		reg.MustRegister(v)
		return v
	}
	return Series{
		Requests: cv("requests", "backend", "policy", "model", "status"),
		TTFT:     hv("ttft"), E2E: hv("e2e"), ITL: hv("itl"),
		InputTokens: cv("in", "backend", "model"), OutputTokens: cv("out", "backend", "model"),
		Ejections: cv("ejections", "backend"), UpstreamErrors: cv("errors", "backend"),
		Others: []Family{cv("kv_events", "backend", "type")},
	}
}

// backendSeries counts the registry's series that carry a backend label.
func backendSeries(t *testing.T, reg *prometheus.Registry) int {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "backend" {
					n++
				}
			}
		}
	}
	return n
}

// churnRig is a DNS pool over a stubbed resolver, its set, and a
// scheduler routing over the fleet with the set forgetting into its
// index, as the router wires them.
type churnRig struct {
	s     *Set
	f     *fleet.Fleet
	sched *scheduler.Scheduler
	reg   *prometheus.Registry
	pool  *pool
	addrs []string  // what the stub resolver answers
	now   time.Time // the set's clock
}

func newChurnRig(t *testing.T, grace time.Duration) *churnRig {
	t.Helper()
	r := &churnRig{f: fleet.New(), reg: prometheus.NewRegistry(), now: time.Unix(1e6, 0)}
	old := Resolver
	Resolver = discovery.Funcs{IPAddr: func(context.Context, string) ([]net.IPAddr, error) {
		out := make([]net.IPAddr, len(r.addrs))
		for i, a := range r.addrs {
			out[i] = net.IPAddr{IP: net.ParseIP(a)}
		}
		return out, nil
	}}
	t.Cleanup(func() { Resolver = old })
	c := config.Default()
	c.Backends = []config.Backend{{URL: "http://pool.test:8000", Name: "pool", Discovery: config.DiscoveryDNS, Models: []string{"m"}}}
	// The pool is re-resolved by the test alone, and the release loop's
	// sweeps change nothing the test's own do not.
	c.Fleet.DNSInterval = time.Hour
	c.Fleet.RejoinGrace = grace
	c.Health.Timeout, c.Health.Path = time.Second, "" // no active checks
	es, err := c.Entries()
	if err != nil {
		t.Fatal(err)
	}
	r.sched = scheduler.New(r.f, policy.NewKVRoute(policy.Options{}), scheduler.Config{})
	r.s = New(Config{Fleet: r.f, Forget: r.sched.Index().RemoveBackend, Series: churnSeries(r.reg), FleetSection: c.Fleet, Health: c.Health,
		Now: func() time.Time { return r.now }}, es)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); r.s.Wait() })
	r.s.Start(ctx)
	for _, p := range r.s.pools {
		r.pool = p
	}
	return r
}

// resolve answers addrs to the next lookup and re-resolves the pool, 2s
// of the set's clock after the last.
func (r *churnRig) resolve(addrs []string) {
	r.addrs = addrs
	r.s.mu.Lock()
	r.now = r.now.Add(2 * time.Second)
	r.s.mu.Unlock()
	r.s.resolvePool(r.pool, true)
}

// serve routes a request to every backend with a prompt of its own (it
// fills the backend's index and metric series), ends it, and counts it.
func (r *churnRig) serve(t *testing.T, now time.Time) {
	t.Helper()
	for _, b := range r.f.Snapshot().Healthy {
		v := &request.View{Model: "m", Prompt: strings.Repeat(b.Name+" ", 400), PromptTokens: 800, Stream: true}
		a, err := r.sched.Route(v, nil, now)
		if err != nil {
			t.Fatal(err)
		}
		a.FirstByte(now)
		a.Done(now)
		if m := r.s.Of(a.Backend); m != nil {
			m.Count("kvroute", "m", 200)
			m.ObserveTTFT("m", time.Millisecond)
		}
	}
}

// pickTime is the median time of a Route of a prompt the fleet shares a
// prefix of, over n routes.
func (r *churnRig) pickTime(t *testing.T, now time.Time, n int) time.Duration {
	t.Helper()
	v := &request.View{Model: "m", Prompt: strings.Repeat("a shared system prompt ", 200), PromptTokens: 1000, Stream: true}
	ds := make([]time.Duration, n)
	for i := range ds {
		start := time.Now()
		a, err := r.sched.Route(v, nil, now)
		ds[i] = time.Since(start)
		if err != nil {
			t.Fatal(err)
		}
		a.Done(now)
	}
	slices.Sort(ds)
	return ds[n/2]
}

// heap is the live heap after a collection.
func heap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestChurnStaysFlat flaps a DNS pool of 8 backends 200 times, in the two
// ways Kubernetes churns pods, and checks that what the router keeps per
// backend stays flat: slots (the size of every per-ID slice), member
// records, metric series, the heap, and the pick's time.
//
//   - blip: half the pool is missing from every other answer, and returns
//     at the same addresses within the rejoin grace;
//   - replace: every answer is 8 new addresses (pods rescheduled), with
//     the shortest grace, so that each leaver's slot is released at the
//     next answer (2s later on the set's clock).
//
// The pick's time is compared as a ratio of medians taken in this one
// run, before and after, not against a wall-clock bound.
func TestChurnStaysFlat(t *testing.T) {
	for _, tt := range []struct {
		name  string
		grace time.Duration
		addrs func(round int) []string
		// slots bounds the slots in use: the pool, and the leavers
		// kept in their grace.
		slots int
	}{
		{"blip", time.Hour, func(round int) []string {
			n := 8
			if round%2 == 1 {
				n = 4
			}
			out := make([]string, n)
			for i := range out {
				out[i] = fmt.Sprintf("10.0.0.%d", i+1)
			}
			return out
		}, 8},
		{"replace", fleet.MinGrace, func(round int) []string {
			out := make([]string, 8)
			for i := range out {
				out[i] = fmt.Sprintf("10.%d.%d.%d", round/250, round%250, i+1)
			}
			return out
		}, 16},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := newChurnRig(t, tt.grace)
			now := r.now
			flap := func(round int) {
				r.resolve(tt.addrs(round))
				r.serve(t, now)
			}
			// Two rounds first: the pool full and flapped once, its
			// series and index filled.
			flap(0)
			flap(1)
			flap(2)
			series0, heap0 := backendSeries(t, r.reg), heap()
			pick0 := r.pickTime(t, now, 301)
			slots, records := 0, 0
			for round := 3; round < 203; round++ {
				flap(round)
				slots, records = max(slots, r.f.Snapshot().IDs), max(records, len(r.s.All()))
			}
			if slots > tt.slots || records > tt.slots {
				t.Errorf("up to %d slots (Snapshot.IDs) and %d member records, want at most %d", slots, records, tt.slots)
			}
			flap(203) // the pool full again, as after round 2
			if n := backendSeries(t, r.reg); n > series0 {
				t.Errorf("metric series with a backend label: %d after 200 flaps, %d before", n, series0)
			}
			// A backend's record, series and index cost several
			// kilobytes: 200 rounds that each leaked 4 of them would grow
			// the heap by megabytes. A quarter of a megabyte is noise.
			if grown := int64(heap()) - int64(heap0); grown > 256<<10 {
				t.Errorf("heap grew by %d KiB over 200 flaps", grown>>10)
			}
			pick := r.pickTime(t, now, 301)
			if ratio := float64(pick) / float64(pick0); ratio > 3 {
				t.Errorf("pick takes %v after 200 flaps, %v before: %.1fx", pick, pick0, ratio)
			}
			t.Logf("slots %d, records %d, series %d (%d before), pick %v (%v before)",
				r.f.Snapshot().IDs, len(r.s.All()), backendSeries(t, r.reg), series0, pick, pick0)
		})
	}
}
