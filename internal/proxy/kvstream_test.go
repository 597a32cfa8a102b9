package proxy

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/clocktest"
	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/kvevents"
)

// kvEngine is an emulated engine publishing its KV events over ZMQ on
// loopback.
type kvEngine struct {
	name string
	em   *emulator.Server
	srv  *httptest.Server
}

func newKVEngine(t *testing.T, name string) *kvEngine {
	t.Helper()
	p, err := engine.LookupPreset("h100-llama3-8b")
	if err != nil {
		t.Fatal(err)
	}
	em, err := emulator.New(emulator.Config{Preset: p, TimeScale: 10, Model: "shared",
		KVEvents: &kvevents.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Bind: true, Topic: "kv@" + name + "@shared"}})
	if err != nil {
		t.Fatal(err)
	}
	e := &kvEngine{name: name, em: em, srv: httptest.NewServer(em.Handler())}
	t.Cleanup(func() {
		e.srv.Close()
		_ = em.Close()
	})
	return e
}

// TestKVEventsLoopback: three emulated engines publish their KV events
// over ZMQ, the router subscribes and tokenizes on the backends' /tokenize.
// A prompt the router sent to one engine is then computed on a second
// engine behind the router's back, and wiped from the first
// (/reset_prefix_cache): its next request goes to the second engine,
// matched precisely, where the approximate index still points at the
// first.
func TestKVEventsLoopback(t *testing.T) {
	var engines []*kvEngine
	for i := range 3 {
		engines = append(engines, newKVEngine(t, fmt.Sprintf("e%d", i)))
	}
	r := newRig(t, "prefix", 0, func(c *config.Config) {
		for _, e := range engines {
			c.Backends = append(c.Backends, config.Backend{URL: e.srv.URL, Name: e.name, KVEvents: "tcp://" + e.em.KVEventsAddr().String()})
		}
		c.KVEvents.SpeculativeTTL = 200 * time.Millisecond
		// A subscriber that connects after an engine's first batch (ZMQ
		// PUB drops what it sends before a subscriber joins) trusts the
		// stream after this much flow instead of the default 30 s.
		c.KVEvents.Retrust = 100 * time.Millisecond
	})
	byName := map[string]int{}
	for _, b := range r.srv.Fleet().Snapshot().All {
		byName[b.Name] = b.ID
	}
	ix := r.srv.Scheduler().Precise()
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		clock := clocktest.Start(t)
		defer clock.Stop()
		if !clock.Until(5*time.Second, ok) {
			t.Fatalf("timed out waiting for %s (%s)", what, clock)
		}
	}
	// Every engine's stream starts flowing and is trusted: its first
	// batch (seq 0) if the subscriber was connected in time, else after
	// Retrust of flow. Warm each one directly with prompts of its own
	// until then.
	for _, e := range engines {
		n := 0
		warm := func() {
			n++
			resp, err := http.Post(e.srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(chat("shared", false, words(fmt.Sprintf("warm-%s-%d", e.name, n), 2048))))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		}
		warm()
		last := time.Now()
		waitFor(e.name+"'s stream", func() bool {
			if time.Since(last) > 50*time.Millisecond {
				warm()
				last = time.Now()
			}
			return ix.Stats(byName[e.name], time.Now()).Trusted
		})
	}

	prompt := chat("shared", false, words("the-prompt", 4096))
	res := r.post("/v1/chat/completions", prompt)
	if res.status != 200 {
		t.Fatalf("status %d: %s", res.status, res.body)
	}
	first := res.header.Get("X-Kvroute-Backend")
	var other *kvEngine
	for _, e := range engines {
		if e.name != first && other == nil {
			other = e
		}
	}
	// Behind the router's back: the other engine computes the prompt, the
	// first forgets it.
	resp, err := http.Post(other.srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(prompt))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for _, e := range engines {
		if e.name == first {
			resp, err := http.Post(e.srv.URL+"/reset_prefix_cache", "application/json", nil)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		}
	}
	waitFor("the reset and the other engine's blocks", func() bool {
		return ix.Stats(byName[first], time.Now()).Cleared > 0 && ix.Stats(byName[other.name], time.Now()).Blocks > 0
	})
	// Let the first request's speculative entry expire.
	time.Sleep(r.srv.cfg.KVEvents.SpeculativeTTL)
	res = r.post("/v1/chat/completions", prompt)
	if res.status != 200 {
		t.Fatalf("status %d: %s", res.status, res.body)
	}
	if got, reason := res.header.Get("X-Kvroute-Backend"), res.header.Get("X-Kvroute-Reason"); got != other.name || !strings.Contains(reason, "match=precise") {
		t.Errorf("routed to %s (%q), want %s, which holds the prompt by its events (%s's cache was reset)", got, reason, other.name, first)
	}
	if n := r.srv.metricValue("kvroute_kv_events_received_total", "backend", first, "type", "AllBlocksCleared"); n != 1 {
		t.Errorf("%v AllBlocksCleared received from %s, want 1", n, first)
	}
}
