package members

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/fleet"
)

// TestPoolHealthProbe times a pool of KVROUTE_POOL_PROBE endpoints applied
// and then replaced by as many others on a running set with health checks
// on (docs/reliability.md, "Kubernetes endpoints"): every endpoint is a
// loopback address where nothing listens, so every check fails at once
// and ejects its backend. Skipped unless set.
func TestPoolHealthProbe(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("KVROUTE_POOL_PROBE"))
	if n <= 0 {
		t.Skip("set KVROUTE_POOL_PROBE to the number of endpoints")
	}
	c := config.Default()
	c.Health.Interval, c.Health.Timeout = time.Second, time.Second
	f := fleet.New()
	s := New(Config{Fleet: f, Forget: func(int) {}, Transport: http.DefaultTransport, Health: c.Health, FleetSection: c.Fleet}, nil)
	ctx, stop := context.WithCancel(context.Background())
	s.Start(ctx)
	defer func() { stop(); s.Wait() }()
	p := &pool{entry: config.Entry{Backend: config.Backend{Name: "llm", Models: []string{"m"}}}, members: map[string]*Member{}}
	targets := func(gen int) []target {
		ts := make([]target, n)
		for i := range ts {
			host := fmt.Sprintf("127.%d.%d.%d:9", 1+gen, i/250, 1+i%250) // the discard port: refused
			ts[i] = target{name: fmt.Sprintf("llm/pod-%d-%d", gen, i), url: &url.URL{Scheme: "http", Host: host}}
		}
		return ts
	}
	apply := func(gen int) time.Duration {
		start := time.Now()
		s.mu.Lock()
		s.begin(p)
		s.applyPool(p, targets(gen), false, "probe", nil)
		s.mu.Unlock()
		return time.Since(start)
	}
	first := apply(0)
	ejected := time.Now()
	for len(f.Snapshot().Healthy) > 0 {
		if time.Since(ejected) > time.Minute {
			t.Fatalf("%d of %d still healthy after a minute", len(f.Snapshot().Healthy), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	eject := time.Since(ejected)
	replace := apply(1)
	t.Logf("%d endpoints with health checks: first apply %v, all ejected %v later, replacement %v",
		n, first.Round(time.Millisecond), eject.Round(time.Millisecond), replace.Round(time.Millisecond))
}
