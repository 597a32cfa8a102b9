package proxy

import (
	"fmt"
	"net"
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
	if n := counterValue(r.srv.streamMetrics.received.WithLabelValues(first, "AllBlocksCleared")); n != 1 {
		t.Errorf("%v AllBlocksCleared received from %s, want 1", n, first)
	}
}

// TestStreamHandler drives one stream's handler through the subscriber's
// reports: what the backend's picture is after each.
func TestStreamHandler(t *testing.T) {
	stored := kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.BlockStored, BlockHashes: []uint64{1}, TokenIDs: make([]uint32, 16), BlockSize: 16}}}
	type step struct {
		batch  *uint64 // a batch with this sequence number, else the reset
		reset  kvevents.ResetReason
		count  kvevents.Counter
		blocks int
		trust  bool
	}
	seq := func(n uint64) *uint64 { return &n }
	tests := []struct {
		name  string
		steps []step
	}{
		{"engine start", []step{{batch: seq(0), blocks: 1, trust: true}}},
		{"joined a running engine", []step{{batch: seq(42), blocks: 1, trust: false}}},
		{"gap without replay", []step{{batch: seq(0), blocks: 1, trust: true}, {reset: kvevents.ResetGap, blocks: 0, trust: false}, {batch: seq(9), blocks: 1, trust: false}}},
		{"restart", []step{{batch: seq(42), blocks: 1, trust: false}, {reset: kvevents.ResetRestart, blocks: 0, trust: false}, {batch: seq(0), blocks: 1, trust: true}}},
		{"stale, then the stream goes on", []step{{batch: seq(0), blocks: 1, trust: true}, {reset: kvevents.ResetStale, blocks: 1, trust: false}, {batch: seq(1), blocks: 1, trust: true}}},
		{"counters", []step{{batch: seq(0), blocks: 1, trust: true}, {count: kvevents.DecodeErrors, blocks: 1, trust: true}, {count: kvevents.Replays, blocks: 1, trust: true}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, "prefix", 1, func(c *config.Config) { c.Backends[0].KVEvents = "tcp://127.0.0.1:1" })
			ix := r.srv.Scheduler().Precise()
			b := r.srv.Fleet().Snapshot().All[0]
			h := &streamHandler{ix: ix, id: b.ID, name: b.Name, m: r.srv.streamMetrics, first: true}
			for i, s := range tt.steps {
				switch {
				case s.batch != nil:
					h.Batch(*s.batch, stored)
				case s.count != 0:
					h.Count(s.count)
				default:
					h.Reset(s.reset)
				}
				st := ix.Stats(b.ID, time.Now())
				if st.Blocks != s.blocks || st.Trusted != s.trust {
					t.Errorf("step %d: %d blocks, trusted %v; want %d, %v", i, st.Blocks, st.Trusted, s.blocks, s.trust)
				}
			}
		})
	}
	r := newRig(t, "prefix", 1, func(c *config.Config) { c.Backends[0].KVEvents = "tcp://127.0.0.1:1" })
	b := r.srv.Fleet().Snapshot().All[0]
	h := &streamHandler{ix: r.srv.Scheduler().Precise(), id: b.ID, name: b.Name, m: r.srv.streamMetrics, first: true}
	h.Count(kvevents.DecodeErrors)
	h.Count(kvevents.ReplayFailures)
	h.Reset(kvevents.ResetStale)
	for _, c := range []struct {
		name string
		got  float64
	}{
		{"decode errors", counterValue(r.srv.streamMetrics.decodeErrors.WithLabelValues(b.Name))},
		{"failed replays", counterValue(r.srv.streamMetrics.replays.WithLabelValues(b.Name, "failed"))},
		{"stale", counterValue(r.srv.streamMetrics.stale.WithLabelValues(b.Name))},
	} {
		if c.got != 1 {
			t.Errorf("%s counted %v, want 1", c.name, c.got)
		}
	}
}

// TestKVEventsRefused: a client of a bound KV event endpoint
// (kv_events_bind) that completes the ZMTP handshake and declares a frame
// of 2^62 bytes has its connection closed and counted; the router runs on.
// (zmq4 v0.17.0 allocated the declared size: panic: makeslice: len out of
// range, and the router exited.)
func TestKVEventsRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	r := newRig(t, "prefix", 1, func(c *config.Config) {
		c.Backends[0].KVEvents = "tcp://" + addr
		c.Backends[0].KVEventsBind = true
	})
	// A ZMTP 3.0 greeting (NULL mechanism), a READY command saying PUB,
	// then a frame header with the long flag and a length of 2^62.
	attack := make([]byte, 64)
	attack[0], attack[9], attack[10] = 0xff, 0x7f, 3
	copy(attack[12:], "NULL")
	attack = append(attack, 0x04, 25, 5, 'R', 'E', 'A', 'D', 'Y', 11)
	attack = append(attack, "Socket-Type\x00\x00\x00\x03PUB"...)
	attack = append(attack, 0x02, 0x40, 0, 0, 0, 0, 0, 0, 0)
	var c net.Conn
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if c, err = net.Dial("tcp", addr); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the router never bound %s: %v", addr, err)
		}
	}
	defer c.Close()
	if _, err := c.Write(attack); err != nil {
		t.Fatal(err)
	}
	refused := r.srv.streamMetrics.refused.WithLabelValues(r.srv.Fleet().Snapshot().All[0].Name)
	for deadline := time.Now().Add(10 * time.Second); counterValue(refused) != 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("kvroute_kv_refused_total is %v, want 1", counterValue(refused))
		}
	}
	if res := r.get("/healthz"); res.status != http.StatusOK {
		t.Errorf("/healthz answered %d after the attack", res.status)
	}
}
