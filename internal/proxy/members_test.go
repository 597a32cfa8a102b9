package proxy

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/discovery"
	"github.com/kvroute/kvroute/internal/members"
)

// load runs clients streaming requests until stop is closed (or each has
// sent max) and counts answers that are not 200 or not byte-exact.
func (r *rig) load(clients, max int, stop chan struct{}) (sent, bad *atomic.Int64, wait func()) {
	sent, bad = new(atomic.Int64), new(atomic.Int64)
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			for i := 0; i < max; i++ {
				select {
				case <-stop:
					return
				default:
				}
				res := r.post("/v1/chat/completions", chat("shared", true, words(fmt.Sprint("c", c, "-", i), 200)))
				sent.Add(1)
				name := res.header.Get("X-Kvroute-Backend")
				if res.status != 200 || res.readErr != nil || string(res.body) != strings.Join(streamEvents(name, 4), "") {
					bad.Add(1)
					r.t.Errorf("request failed under membership change: status %d, backend %q, err %v", res.status, name, res.readErr)
				}
			}
		})
	}
	return sent, bad, wg.Wait
}

func TestDrainFinishesStream(t *testing.T) {
	r := newRig(t, "round-robin", 2, nil)
	r.backends[0].setMode(modeGated)
	r.backends[1].setMode(modeGated)
	done := make(chan result)
	go func() { done <- r.post("/v1/chat/completions", chat("shared", true, "hold")) }()
	var held *fake
	select {
	case <-r.backends[0].started:
		held = r.backends[0]
	case <-r.backends[1].started:
		held = r.backends[1]
	case <-time.After(5 * time.Second):
		t.Fatal("stream never started")
	}
	other := r.backends[0]
	if held == other {
		other = r.backends[1]
	}
	other.setMode(modeOK)
	var hb = r.srv.Fleet().Snapshot().All[0]
	if hb.Name != held.name {
		hb = r.srv.Fleet().Snapshot().All[1]
	}
	r.srv.Fleet().Drain(hb, time.Now())
	before := held.hits.Load()
	for range 10 {
		if res := r.post("/v1/chat/completions", chat("shared", true, "more")); res.status != 200 || res.header.Get("X-Kvroute-Backend") != other.name {
			t.Fatalf("while %s drains: status %d from %q", held.name, res.status, res.header.Get("X-Kvroute-Backend"))
		}
	}
	if held.hits.Load() != before {
		t.Fatal("a draining backend got new requests")
	}
	close(held.gate)
	res := <-done
	if res.status != 200 || string(res.body) != strings.Join(streamEvents(held.name, 4), "") {
		t.Fatalf("the drained backend's stream did not finish byte-exact: %d %q", res.status, res.body)
	}
}

// TestReloadUnderLoad removes b1 and adds b2 by Reload (what SIGHUP calls)
// while clients stream: nothing fails, b1 is retired, b2 gets traffic.
func TestReloadUnderLoad(t *testing.T) {
	r := newRig(t, "least-request", 2, func(c *config.Config) { c.Fleet.Warmup = 200 * time.Millisecond })
	b2 := newFake(t, "b2")
	stop := make(chan struct{})
	sent, bad, wait := r.load(4, 150, stop)
	time.Sleep(100 * time.Millisecond)
	next := *r.srv.cfg
	next.Backends = []config.Backend{{URL: r.backends[0].srv.URL, Name: "b0"}, {URL: b2.srv.URL, Name: "b2"}}
	next.Policy = "round-robin"
	if err := next.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := r.srv.ReloadWith(func() (*config.Config, error) { return &next, nil }); err != nil {
		t.Fatal(err)
	}
	b1Hits := r.backends[1].hits.Load()
	// The load goes on until the added backend has served a few of its
	// requests: on a loaded machine that takes longer; a router that never
	// sends it any ends at the cap and fails below.
	for end := time.Now().Add(30 * time.Second); b2.hits.Load() < 8 && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
	}
	close(stop)
	wait()
	if bad.Load() != 0 {
		t.Fatalf("%d of %d requests failed across the reload", bad.Load(), sent.Load())
	}
	if b2.hits.Load() == 0 {
		t.Error("the added backend got no traffic")
	}
	if got := r.backends[1].hits.Load(); got > b1Hits+4 { // at most one racing request per client
		t.Errorf("removed backend got %d requests after the reload", got-b1Hits)
	}
	for _, b := range r.srv.Fleet().Snapshot().All {
		if b.Name == "b1" {
			t.Error("b1 still a member after its requests ended")
		}
	}
	if r.srv.Scheduler().Policy().Name() != "round-robin" {
		t.Error("policy not changed by the reload")
	}
	t.Logf("%d requests, b2 got %d", sent.Load(), b2.hits.Load())
}

// TestReloadFromFile: a change of the config file is picked up by Watch and
// applied; an invalid file is ignored and the router keeps serving.
func TestReloadFromFile(t *testing.T) {
	r := newRig(t, "kvroute", 1, nil)
	b1 := newFake(t, "b1")
	path := filepath.Join(t.TempDir(), "kvroute.yaml")
	load := func() (*config.Config, error) {
		c, err := config.Load(path)
		if err != nil {
			return nil, err
		}
		c.Listen = r.srv.cfg.Listen
		return c, c.Validate()
	}
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("backends: [{url: " + r.backends[0].srv.URL + ", name: b0}]\n")
	ctx, cancel := context.WithCancel(context.Background())
	watched := make(chan struct{})
	// Each reload's outcome, so that the test waits for the watcher to
	// have read a change instead of sleeping and hoping it did.
	reloads := make(chan error, 64)
	go func() {
		defer close(watched)
		config.Watch(ctx, path, 10*time.Millisecond, func() { reloads <- r.srv.ReloadWith(load) })
	}()
	defer func() { cancel(); <-watched }()
	// until waits for a reload whose outcome is want (ok: nil error).
	until := func(what string, ok bool) {
		t.Helper()
		deadline := time.After(patience)
		for {
			select {
			case err := <-reloads:
				if (err == nil) == ok {
					return
				}
			case <-deadline:
				t.Fatalf("no reload %s within %v", what, patience)
			}
		}
	}
	// The watcher reads the file's first state when it starts: rewrite a
	// comment until it has seen a change, so that it is known to run.
	for i := 0; ; i++ {
		write("backends: [{url: " + r.backends[0].srv.URL + ", name: b0}]\n# " + strconv.Itoa(i) + "\n")
		select {
		case err := <-reloads:
			if err != nil {
				t.Fatalf("a valid file: %v", err)
			}
		case <-time.After(100 * time.Millisecond):
			if i*100 > int(patience/time.Millisecond) {
				t.Fatal("the watcher never saw a change")
			}
			continue
		}
		break
	}
	stop := make(chan struct{})
	sent, bad, wait := r.load(3, 100, stop)
	waitFor(t, "the first request", func() bool { return sent.Load() > 0 })
	write("backends: [{url: " + r.backends[0].srv.URL + ", name: b0}, {url: http://, name: b1}]\n") // invalid
	until("refusing the invalid file", false)
	if n := len(r.srv.Fleet().Snapshot().All); n != 1 {
		t.Fatalf("invalid config applied: %d backends", n)
	}
	write("fleet: {warmup: 0s}\nbackends: [{url: " + b1.srv.URL + ", name: b1}]\n")
	until("applying the new file", true)
	waitFor(t, "b1's first request", func() bool { return b1.hits.Load() > 0 })
	close(stop)
	wait()
	if bad.Load() != 0 {
		t.Fatalf("after the file change: %d of %d requests failed", bad.Load(), sent.Load())
	}
}

// TestDNSPool: a discovery: dns entry follows its SRV record as it gains
// and loses targets, with a stubbed members.Resolver.
func TestDNSPool(t *testing.T) {
	fakes := []*fake{newFake(t, "d0"), newFake(t, "d1")}
	var live atomic.Int64
	live.Store(1)
	old := members.Resolver
	members.Resolver = discovery.Funcs{SRV: func(_ context.Context, _, _, name string) (string, []*net.SRV, error) {
		var out []*net.SRV
		for _, f := range fakes[:live.Load()] {
			u, _ := url.Parse(f.srv.URL)
			p, _ := strconv.Atoi(u.Port())
			out = append(out, &net.SRV{Target: "127.0.0.1.", Port: uint16(p)})
		}
		return name, out, nil
	}}
	t.Cleanup(func() { members.Resolver = old })
	r := newRig(t, "least-request", 0, func(c *config.Config) {
		c.Backends = []config.Backend{{SRV: "_http._tcp.pool.test", Models: []string{"m"}, DNSInterval: 100 * time.Millisecond}}
		c.Fleet.Warmup = 0
	})
	waitMembers := func(n int) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for len(r.srv.Fleet().Snapshot().All) != n {
			if time.Now().After(deadline) {
				t.Fatalf("pool has %d members, want %d", len(r.srv.Fleet().Snapshot().All), n)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitMembers(1)
	live.Store(2)
	waitMembers(2)
	for range 6 {
		if res := r.post("/v1/chat/completions", chat("m", true, "x")); res.status != 200 {
			t.Fatalf("status %d", res.status)
		}
	}
	if fakes[1].hits.Load() == 0 {
		t.Error("discovered backend got no traffic")
	}
	live.Store(1)
	waitMembers(1)
	if n := fakes[1].hits.Load(); r.post("/v1/chat/completions", chat("m", true, "y")).status != 200 || fakes[1].hits.Load() != n {
		t.Error("a vanished address still gets requests")
	}
}

// TestPerModelPools: each model's requests spread over its own pool only.
func TestPerModelPools(t *testing.T) {
	r := newRig(t, "round-robin", 4, func(c *config.Config) {
		for i := range c.Backends {
			c.Backends[i].Models = []string{[]string{"llama", "qwen"}[i/2]}
		}
	})
	got := map[string]map[string]int{"llama": {}, "qwen": {}}
	for i := range 16 {
		m := []string{"llama", "qwen"}[i/8] // one model at a time: round-robin's counter is fleet-wide
		res := r.post("/v1/chat/completions", chat(m, false, words(fmt.Sprint(i), 100)))
		if res.status != 200 {
			t.Fatalf("%s: status %d", m, res.status)
		}
		got[m][res.header.Get("X-Kvroute-Backend")]++
	}
	want := map[string][]string{"llama": {"b0", "b1"}, "qwen": {"b2", "b3"}}
	for m, pool := range want {
		if len(got[m]) != 2 || got[m][pool[0]] == 0 || got[m][pool[1]] == 0 {
			t.Errorf("%s went to %v, want both of %v and nothing else", m, got[m], pool)
		}
	}
}
