package members

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/internal/prefix"
)

// newFollower returns a follower over a new fleet and precise index, with
// one backend, and its registry.
func newFollower(t *testing.T) (*KVFollower, *fleet.Backend, *prometheus.Registry) {
	t.Helper()
	c := config.Default()
	f := fleet.New()
	u, _ := url.Parse("http://127.0.0.1:1")
	b := f.Add("b0", u, []string{"m"})
	reg := prometheus.NewRegistry()
	return NewKVFollower(f, prefix.NewPrecise(c.KVEvents.Precise()), c.KVEvents, reg, nil), b, reg
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
			k, b, _ := newFollower(t)
			h := k.handler(b)
			for i, s := range tt.steps {
				switch {
				case s.batch != nil:
					h.Batch(*s.batch, stored)
				case s.count != 0:
					h.Count(s.count)
				default:
					h.Reset(s.reset)
				}
				st := k.ix.Stats(b.ID, time.Now())
				if st.Blocks != s.blocks || st.Trusted != s.trust {
					t.Errorf("step %d: %d blocks, trusted %v; want %d, %v", i, st.Blocks, st.Trusted, s.blocks, s.trust)
				}
			}
		})
	}
}

// TestStreamCounters: the subscriber's reports are counted per backend,
// each in its own series.
func TestStreamCounters(t *testing.T) {
	k, b, _ := newFollower(t)
	h := k.handler(b)
	h.Count(kvevents.DecodeErrors)
	h.Count(kvevents.ReplayFailures)
	h.Reset(kvevents.ResetStale)
	h.Batch(0, kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.AllBlocksCleared}}})
	for _, c := range []struct {
		name string
		got  float64
	}{
		{"decode errors", value(k.m.decodeErrors.WithLabelValues(b.Name))},
		{"failed replays", value(k.m.replays.WithLabelValues(b.Name, "failed"))},
		{"stale", value(k.m.stale.WithLabelValues(b.Name))},
		{"received", value(k.m.received.WithLabelValues(b.Name, "AllBlocksCleared"))},
	} {
		if c.got != 1 {
			t.Errorf("%s counted %v, want 1", c.name, c.got)
		}
	}
	for _, other := range []float64{
		value(k.m.replays.WithLabelValues(b.Name, "ok")),
		value(k.m.gaps.WithLabelValues(b.Name)),
	} {
		if other != 0 {
			t.Errorf("a report was counted in another series: %v", other)
		}
	}
}

// TestPreciseCollector: the index's per-backend figures are exported at
// scrape time under the backend's name.
func TestPreciseCollector(t *testing.T) {
	k, b, reg := newFollower(t)
	h := k.handler(b)
	h.Batch(0, kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.BlockStored, BlockHashes: []uint64{1, 2}, TokenIDs: make([]uint32, 32), BlockSize: 16}}})
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == b.Name {
				got[f.GetName()] = fmt.Sprint(m.GetGauge().GetValue())
			}
		}
	}
	for name, want := range map[string]string{"kvroute_kv_blocks": "2", "kvroute_kv_stream_trusted": "1"} {
		if got[name] != want {
			t.Errorf("%s{backend=%q} = %q, want %s", name, b.Name, got[name], want)
		}
	}
}

// value reads one counter.
func value(c prometheus.Counter) float64 {
	var pb dto.Metric
	if err := c.Write(&pb); err != nil {
		return -1
	}
	return pb.GetCounter().GetValue()
}

// TestKVEventsRefused: a client of a bound KV event endpoint
// (kv_events_bind) that completes the ZMTP handshake and declares a frame
// of 2^62 bytes has its connection closed and counted; the process runs
// on. (zmq4 v0.17.0 allocated the declared size: panic: makeslice: len
// out of range, and the router exited.)
func TestKVEventsRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	c := config.Default()
	c.Health.Path = ""
	c.Backends = []config.Backend{{URL: "http://127.0.0.1:1", Name: "b0", Models: []string{"m"}, KVEvents: "tcp://" + addr, KVEventsBind: true}}
	es, err := c.Entries()
	if err != nil {
		t.Fatal(err)
	}
	f := fleet.New()
	k := NewKVFollower(f, prefix.NewPrecise(c.KVEvents.Precise()), c.KVEvents, prometheus.NewRegistry(), nil)
	s := New(Config{Fleet: f, Forget: func(int) {}, Transport: http.DefaultTransport, Health: c.Health, FleetSection: c.Fleet, KVStream: k.Follow}, es)
	ctx, cancel := context.WithCancel(context.Background())
	s.Start(ctx)
	defer s.Wait()
	defer cancel()
	// A ZMTP 3.0 greeting (NULL mechanism), a READY command saying PUB,
	// then a frame header with the long flag and a length of 2^62.
	attack := make([]byte, 64)
	attack[0], attack[9], attack[10] = 0xff, 0x7f, 3
	copy(attack[12:], "NULL")
	attack = append(attack, 0x04, 25, 5, 'R', 'E', 'A', 'D', 'Y', 11)
	attack = append(attack, "Socket-Type\x00\x00\x00\x03PUB"...)
	attack = append(attack, 0x02, 0x40, 0, 0, 0, 0, 0, 0, 0)
	var conn net.Conn
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if conn, err = net.Dial("tcp", addr); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the follower never bound %s: %v", addr, err)
		}
	}
	defer conn.Close()
	if _, err := conn.Write(attack); err != nil {
		t.Fatal(err)
	}
	refused := k.m.refused.WithLabelValues("b0")
	for deadline := time.Now().Add(10 * time.Second); value(refused) != 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("kvroute_kv_refused_total is %v, want 1", value(refused))
		}
	}
}
