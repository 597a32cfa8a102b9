package replica

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/prefix"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/scheduler"
)

// benchFleet is 8 backends under the kvroute policy, with the replica's
// outbox (drained by nobody: it drops when full, as a stalled sender's
// would) and its peer state.
func benchFleet(b *testing.B) (*scheduler.Scheduler, *Peers, []string) {
	b.Helper()
	f := fleet.New()
	var names []string
	for i := range 8 {
		names = append(names, fmt.Sprintf("b%d:8000", i))
		f.Add(names[i], nil, nil)
	}
	s := scheduler.New(f, policy.NewKVRoute(policy.Options{}), scheduler.Config{})
	s.SetEvents(NewOutbox(0))
	return s, NewPeers("self", f, s, time.Minute), names
}

// benchPrompt is a prompt of n characters that no other seed shares.
func benchPrompt(seed, n int) string {
	var sb strings.Builder
	for i := 0; sb.Len() < n; i++ {
		fmt.Fprintf(&sb, "p%d-%d lorem ipsum dolor sit amet. ", seed, i)
	}
	return sb.String()[:n]
}

// peerBatches returns batches of a peer routing and ending requests of
// 8,000-character prompts (125 blocks) over names: per batch, 50 requests
// routed and 50 ended, 100 events.
func peerBatches(names []string, n int) []Batch {
	out := make([]Batch, n)
	req := uint64(0)
	for k := range out {
		bt := Batch{Kind: Events, Replica: "peer", Incarnation: 1, Seq: uint64(k + 1), BlockChars: prefix.DefaultBlockChars}
		for j := range 50 {
			req++
			be := names[int(req)%len(names)]
			hashes := prefix.Hash(nil, benchPrompt(int(req), 8000), prefix.DefaultBlockChars)
			bt.Events = append(bt.Events,
				Event{Kind: Routed, Request: req, Backend: be, Load: fleet.Load{InFlight: 1, PendingPrefill: 2000}, Claim: policy.Claim{Session: uint64(j + 1), Epoch: 1, At: int64(j), By: 3}, Hashes: hashes})
			if req > 25 {
				// End the request routed 25 before, so that about 25 are in flight.
				bt.Events = append(bt.Events, Event{Kind: Changed, Request: req - 25, Backend: names[int(req-25)%len(names)], Load: fleet.Load{InFlight: -1, PendingPrefill: -2000}})
			}
		}
		out[k] = bt
	}
	return out
}

// BenchmarkPickWithPeers is one routing decision (route, first byte,
// done) of an 8,000-character prompt while the replica applies 0 or
// 10,000 peer events a second on another goroutine, as peerlink's receiver
// does.
//
// The control, elsewhere=true, applies the same events at the same rate to
// another replica's state (its own fleet, index and session table): the
// same CPU taken from the picker on this 2-core machine, but no lock or
// memory shared with it. What the pick loses beside its own replica's
// applier beyond what it loses beside the control is the cost of sharing
// state; the rest is the applier's share of the machine. Every case
// starts from a full index (see below): a pick over an empty one, as the
// benchmark once measured the no-events case, is 3 to 5 us faster than
// over a full one, whatever fills it.
func BenchmarkPickWithPeers(b *testing.B) {
	for _, bc := range []struct {
		rate      int
		elsewhere bool
	}{{0, false}, {10_000, false}, {10_000, true}} {
		name := fmt.Sprintf("peer_events_per_s=%d", bc.rate)
		switch {
		case bc.elsewhere:
			name += "/elsewhere"
		case bc.rate > 0:
			name += "/same"
		}
		rate := bc.rate
		b.Run(name, func(b *testing.B) {
			s, peers, names := benchFleet(b)
			batches := peerBatches(names, 200)
			now := time.Unix(0, 0)
			apply := func(k int) {
				bt := batches[k%len(batches)]
				bt.Seq = uint64(k + 1)
				// Each round of the batches is a restarted peer (the
				// same request numbers again), whose old pins go at once.
				bt.Incarnation = uint64(1 + k/len(batches))
				peers.Apply(&bt, now)
			}
			// A replica that has run a while holds a full index: one round
			// of the batches (156,000 blocks a backend, beyond its 100,000)
			// before timing, in every case, so that each pick searches an
			// index of the same size (a full one is slower to search than
			// an empty one: more of it misses the processor's caches) and
			// none is measured beside the index's one-off growth. The
			// control's other replica is filled alike.
			for k := range batches {
				apply(k)
			}
			if bc.elsewhere {
				_, peers, _ = benchFleet(b)
				for k := range batches {
					apply(k)
				}
			}
			// The fill's garbage, and an earlier case's, is collected
			// before timing rather than during it.
			runtime.GC()
			stop := make(chan struct{})
			done := make(chan struct{})
			go func() {
				defer close(done)
				if rate == 0 {
					return
				}
				// 100 events a batch: one batch every 100/rate seconds.
				tick := time.NewTicker(time.Second * 100 / time.Duration(rate))
				defer tick.Stop()
				for k := len(batches); ; k++ {
					select {
					case <-stop:
						return
					case <-tick.C:
						apply(k)
					}
				}
			}()
			v := &request.View{Model: "m", Prompt: benchPrompt(-1, 8000), PromptTokens: 2000, Stream: true}
			b.ReportAllocs()
			for b.Loop() {
				a, err := s.Route(v, nil, time.Unix(0, 0))
				if err != nil {
					b.Fatal(err)
				}
				a.FirstByte(time.Unix(0, 0))
				a.Done(time.Unix(0, 0))
			}
			b.StopTimer()
			close(stop)
			<-done
		})
	}
}

// BenchmarkApply is the rate at which one core applies a peer's events:
// decoding its batches (100 events: 50 routings of 125-block prompts, 50
// ends) and applying them to the fleet, prefix index and session table.
func BenchmarkApply(b *testing.B) {
	_, peers, names := benchFleet(b)
	batches := peerBatches(names, 200)
	wire := make([][]byte, len(batches))
	for k := range batches {
		wire[k] = Append(nil, &batches[k])
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(wire[0])))
	events := 0
	k := 0
	var bt Batch
	start := time.Now()
	for b.Loop() {
		if err := Decode(wire[k%len(wire)], &bt); err != nil {
			b.Fatal(err)
		}
		bt.Incarnation = uint64(k / len(wire)) // a new run of the peer each round: its pins go
		bt.Seq = uint64(k + 1)
		peers.Apply(&bt, time.Unix(0, 0))
		events += len(bt.Events)
		k++
	}
	b.ReportMetric(float64(events)/time.Since(start).Seconds(), "events/s")
}

// BenchmarkKeyOpen is what authenticating a peer's message costs its
// receiver: checking the tag of a full batch (256 KiB, peerlink's
// largest).
func BenchmarkKeyOpen(b *testing.B) {
	k, err := NewKey([]byte("0123456789abcdef0123456789abcdef"))
	if err != nil {
		b.Fatal(err)
	}
	msg := k.Seal(make([]byte, 256<<10), "kvroute.events.r1", "")
	b.ReportAllocs()
	b.SetBytes(int64(len(msg)))
	for b.Loop() {
		if _, err := k.Open("kvroute.events.r1", "", msg); err != nil {
			b.Fatal(err)
		}
	}
}
