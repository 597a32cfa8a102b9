package members

import (
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/fleet"
)

// poolTargets are n endpoints of a pool, the gen-th generation of pods
// (each generation at other addresses and under other names).
func poolTargets(n, gen int) []target {
	ts := make([]target, n)
	for i := range ts {
		host := fmt.Sprintf("10.%d.%d.%d:8000", gen%200, i/250, i%250)
		ts[i] = target{name: fmt.Sprintf("llm/pod-%d-%d", gen, i), url: &url.URL{Scheme: "http", Host: host}}
	}
	return ts
}

// BenchmarkPoolReplace applies a pool of n endpoints, then replaces them
// all with n others (docs/reliability.md, "Kubernetes endpoints"): the
// time of one replacement, and per endpoint (flat in n: linear).
func BenchmarkPoolReplace(b *testing.B) {
	for _, n := range []int{1000, 5000} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			c := config.Default()
			s := New(Config{Fleet: fleet.New(), Forget: func(int) {}, Transport: http.DefaultTransport, Health: c.Health, FleetSection: c.Fleet}, nil)
			p := &pool{entry: config.Entry{Backend: config.Backend{Name: "llm", Models: []string{"m"}}}, members: map[string]*Member{}}
			s.mu.Lock()
			defer s.mu.Unlock()
			s.applyPool(p, poolTargets(n, 0), false, "bench", nil)
			gen := 0
			for b.Loop() {
				gen++
				s.applyPool(p, poolTargets(n, gen), false, "bench", nil)
				s.release(time.Now().Add(time.Hour)) // the leavers' grace over
			}
			if len(p.members) != n {
				b.Fatalf("%d members, want %d", len(p.members), n)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/endpoint")
		})
	}
}
