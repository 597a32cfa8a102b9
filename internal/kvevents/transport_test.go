package kvevents

import (
	"context"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// recorder is a Handler that keeps what it is told.
type recorder struct {
	mu      sync.Mutex
	seqs    []uint64
	batches []Batch
	resets  []ResetReason
	counts  map[Counter]int
	changed chan struct{}
}

func newRecorder() *recorder {
	return &recorder{counts: map[Counter]int{}, changed: make(chan struct{}, 1)}
}

func (r *recorder) poke() {
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

func (r *recorder) Batch(seq uint64, b Batch) {
	r.mu.Lock()
	r.seqs = append(r.seqs, seq)
	r.batches = append(r.batches, b)
	r.mu.Unlock()
	r.poke()
}

func (r *recorder) Reset(reason ResetReason) {
	r.mu.Lock()
	r.resets = append(r.resets, reason)
	r.mu.Unlock()
	r.poke()
}

func (r *recorder) Count(c Counter) {
	r.mu.Lock()
	r.counts[c]++
	r.mu.Unlock()
	r.poke()
}

// wait waits up to 5 s for cond, evaluated under the recorder's lock.
func (r *recorder) wait(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		r.mu.Lock()
		ok := cond()
		r.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-r.changed:
		case <-time.After(20 * time.Millisecond):
		case <-deadline:
			r.mu.Lock()
			defer r.mu.Unlock()
			t.Fatalf("timed out waiting for %s: seqs %v resets %v counts %v", what, r.seqs, r.resets, r.counts)
		}
	}
}

// batchN is a small batch whose timestamp names it.
func batchN(n int) Batch {
	return Batch{TS: float64(n), DPRank: 0, Events: []Event{{Kind: BlockRemoved, BlockHashes: []uint64{uint64(n)}, Medium: "GPU"}}}
}

// subscribe runs Subscribe on its own goroutine; the returned func cancels
// it and waits for it to return.
func subscribe(t *testing.T, cfg SubscriberConfig, h Handler) func() {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- Subscribe(ctx, cfg, h) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-errc:
				if err != nil {
					t.Errorf("Subscribe: %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Errorf("Subscribe did not return after cancel")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// joined publishes probe batches until the subscriber has one (a SUB
// socket only receives what is published after its subscription reached
// the publisher), and returns how many batches the publisher has sent.
func joined(t *testing.T, p *Publisher, r *recorder) uint64 {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := p.Publish(batchN(-1)); err != nil {
			t.Fatal(err)
		}
		r.mu.Lock()
		n := len(r.seqs)
		r.mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the subscriber never received a probe")
		}
		time.Sleep(10 * time.Millisecond)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seq
}

func newPublisher(t *testing.T, cfg PublisherConfig) *Publisher {
	t.Helper()
	p, err := NewPublisher(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func TestPublishSubscribe(t *testing.T) {
	for _, enc := range []Encoding{Current, Legacy} {
		t.Run(enc.String(), func(t *testing.T) {
			p := newPublisher(t, PublisherConfig{Endpoint: "tcp://127.0.0.1:*", Topic: "kv@pod@model", Encoding: enc})
			r := newRecorder()
			subscribe(t, SubscriberConfig{Endpoint: "tcp://" + p.Addr().String(), Topic: "kv@"}, r)
			start := joined(t, p, r)
			for i := range 20 {
				if _, err := p.Publish(batchN(i)); err != nil {
					t.Fatal(err)
				}
			}
			r.wait(t, "20 batches", func() bool { return len(r.seqs) > 0 && r.seqs[len(r.seqs)-1] == start+19 })
			r.mu.Lock()
			defer r.mu.Unlock()
			tail := r.seqs[len(r.seqs)-20:]
			for i, seq := range tail {
				if seq != start+uint64(i) {
					t.Fatalf("sequence %v", r.seqs)
				}
				if b := r.batches[len(r.batches)-20+i]; !equalBatch(b, batchN(i)) {
					t.Errorf("batch %d: %+v", i, b)
				}
			}
			if len(r.resets) != 0 || r.counts[Gaps] != 0 {
				t.Errorf("resets %v counts %v", r.resets, r.counts)
			}
		})
	}
}

func TestSubscribeTopicFilter(t *testing.T) {
	p := newPublisher(t, PublisherConfig{Endpoint: "tcp://127.0.0.1:*", Topic: "kv@other"})
	r := newRecorder()
	subscribe(t, SubscriberConfig{Endpoint: "tcp://" + p.Addr().String(), Topic: "kv@mine"}, r)
	for range 20 {
		if _, err := p.Publish(batchN(1)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.seqs) != 0 {
		t.Errorf("received %d batches of another topic", len(r.seqs))
	}
}

// publishN publishes batchN(0..n-1).
func publishN(t *testing.T, p *Publisher, n int) {
	t.Helper()
	for i := range n {
		if _, err := p.Publish(batchN(i)); err != nil {
			t.Fatal(err)
		}
	}
}

// withGap starts a publisher (with a replay socket when cfg has a replay
// endpoint) and a subscriber, then publishes n batches of which those
// dropped(start, seq) says are not sent on the PUB socket, and waits for
// the subscriber to get the last one. start is the first batch's number.
func withGap(t *testing.T, cfg PublisherConfig, n int, dropped func(start, seq uint64) bool) (r *recorder, start uint64, stop func()) {
	t.Helper()
	p := newPublisher(t, cfg)
	r = newRecorder()
	sub := SubscriberConfig{Endpoint: "tcp://" + p.Addr().String()}
	if cfg.ReplayEndpoint != "" {
		sub.ReplayEndpoint = "tcp://" + p.ReplayAddr().String()
	}
	stopSub := subscribe(t, sub, r)
	start = joined(t, p, r)
	p.mu.Lock()
	p.drop = func(seq uint64) bool { return dropped(start, seq) }
	p.mu.Unlock()
	publishN(t, p, n)
	last := start + uint64(n) - 1
	r.wait(t, "the last batch", func() bool { return r.seqs[len(r.seqs)-1] == last })
	return r, start, func() { stopSub(); _ = p.Close() }
}

func TestGapReplayed(t *testing.T) {
	r, start, _ := withGap(t, PublisherConfig{Endpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "tcp://127.0.0.1:*"}, 8,
		func(start, seq uint64) bool { return seq == start+2 || seq == start+3 })
	r.mu.Lock()
	defer r.mu.Unlock()
	tail := r.seqs[len(r.seqs)-8:]
	want := []uint64{start, start + 1, start + 2, start + 3, start + 4, start + 5, start + 6, start + 7}
	if !slices.Equal(tail, want) {
		t.Errorf("delivered %v, want %v", tail, want)
	}
	for i := range 8 {
		if b := r.batches[len(r.batches)-8+i]; b.TS != float64(i) {
			t.Errorf("batch %d has ts %v", i, b.TS)
		}
	}
	if r.counts[Gaps] != 1 || r.counts[Replays] != 1 || len(r.resets) != 0 {
		t.Errorf("counts %v resets %v, want one gap filled by one replay", r.counts, r.resets)
	}
}

func TestGapBeyondBuffer(t *testing.T) {
	r, _, _ := withGap(t, PublisherConfig{Endpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "tcp://127.0.0.1:*", BufferSteps: 2}, 5,
		func(start, seq uint64) bool { return seq < start+4 })
	r.mu.Lock()
	defer r.mu.Unlock()
	if !slices.Equal(r.resets, []ResetReason{ResetGap}) || r.counts[ReplayFailures] != 1 {
		t.Errorf("resets %v counts %v, want one gap reset after a failed replay", r.resets, r.counts)
	}
}

func TestGapWithoutReplay(t *testing.T) {
	r, _, _ := withGap(t, PublisherConfig{Endpoint: "tcp://127.0.0.1:*"}, 2,
		func(start, seq uint64) bool { return seq == start })
	r.mu.Lock()
	defer r.mu.Unlock()
	if !slices.Equal(r.resets, []ResetReason{ResetGap}) || r.counts[Gaps] != 1 {
		t.Errorf("resets %v counts %v", r.resets, r.counts)
	}
}

func TestUndecodableSkipped(t *testing.T) {
	p := newPublisher(t, PublisherConfig{Endpoint: "tcp://127.0.0.1:*"})
	r := newRecorder()
	subscribe(t, SubscriberConfig{Endpoint: "tcp://" + p.Addr().String()}, r)
	start := joined(t, p, r)
	if _, err := p.PublishPayload([]byte("not msgpack at all")); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Publish(batchN(7)); err != nil {
		t.Fatal(err)
	}
	r.wait(t, "the batch after the garbage", func() bool { return r.seqs[len(r.seqs)-1] == start+1 })
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.counts[DecodeErrors] != 1 || len(r.resets) != 0 || r.counts[Gaps] != 0 {
		t.Errorf("counts %v resets %v, want one decode error and no gap", r.counts, r.resets)
	}
}

// TestRestartAndStale: a subscriber that binds sees its publisher go
// silent (stale), then a restarted publisher (sequence from 0 again).
func TestRestartAndStale(t *testing.T) {
	r := newRecorder()
	addr := freeAddr(t)
	subscribe(t, SubscriberConfig{Endpoint: "tcp://" + addr, Bind: true, StaleAfter: 300 * time.Millisecond}, r)
	p1 := newPublisher(t, PublisherConfig{Endpoint: "tcp://" + addr})
	joined(t, p1, r)
	for range 3 {
		if _, err := p1.Publish(batchN(1)); err != nil {
			t.Fatal(err)
		}
	}
	r.wait(t, "stale", func() bool { return slices.Contains(r.resets, ResetStale) })
	_ = p1.Close()
	p2 := newPublisher(t, PublisherConfig{Endpoint: "tcp://" + addr})
	r.mu.Lock()
	before := len(r.seqs)
	r.mu.Unlock()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := p2.Publish(batchN(2)); err != nil {
			t.Fatal(err)
		}
		r.mu.Lock()
		got := len(r.seqs) > before
		r.mu.Unlock()
		if got || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	r.wait(t, "restart", func() bool { return slices.Contains(r.resets, ResetRestart) })
	r.mu.Lock()
	defer r.mu.Unlock()
	if n := len(r.resets); r.resets[n-1] != ResetRestart || slices.Index(r.resets, ResetStale) > slices.Index(r.resets, ResetRestart) {
		t.Errorf("resets %v, want stale then restart", r.resets)
	}
	if stale := countOf(r.resets, ResetStale); stale != 1 {
		t.Errorf("%d stale resets in one silence", stale)
	}
}

func countOf[T comparable](s []T, v T) int {
	n := 0
	for _, x := range s {
		if x == v {
			n++
		}
	}
	return n
}

// TestReconnectAfterPublisherRestart: a connecting subscriber whose
// publisher restarts on the same port gets the new stream after StaleAfter
// and reports the restart.
func TestReconnectAfterPublisherRestart(t *testing.T) {
	addr := freeAddr(t)
	p1 := newPublisher(t, PublisherConfig{Endpoint: "tcp://" + addr, Bind: true})
	r := newRecorder()
	subscribe(t, SubscriberConfig{Endpoint: "tcp://" + addr, StaleAfter: 200 * time.Millisecond, RetryMin: 20 * time.Millisecond}, r)
	joined(t, p1, r)
	for range 5 {
		if _, err := p1.Publish(batchN(1)); err != nil {
			t.Fatal(err)
		}
	}
	r.wait(t, "5 more batches", func() bool { return len(r.seqs) >= 6 })
	_ = p1.Close()
	p2 := newPublisher(t, PublisherConfig{Endpoint: "tcp://" + addr, Bind: true})
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := p2.Publish(batchN(2)); err != nil {
			t.Fatal(err)
		}
		r.mu.Lock()
		ok := slices.Contains(r.resets, ResetRestart)
		r.mu.Unlock()
		if ok {
			break
		}
		if time.Now().After(deadline) {
			r.mu.Lock()
			t.Fatalf("no restart seen: resets %v counts %v", r.resets, r.counts)
		}
		time.Sleep(10 * time.Millisecond)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.counts[Reconnects] == 0 {
		t.Errorf("restart seen without a reconnect: %v", r.counts)
	}
}

// freeAddr returns a loopback address with a port nobody listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	p, err := NewPublisher(context.Background(), PublisherConfig{Endpoint: "tcp://127.0.0.1:*"})
	if err != nil {
		t.Fatal(err)
	}
	addr := p.Addr().String()
	_ = p.Close()
	return addr
}

func TestSubscribeConfigErrors(t *testing.T) {
	for _, cfg := range []SubscriberConfig{
		{},
		{Endpoint: "nonsense"},
		{Endpoint: "tcp://127.0.0.1"},
		{Endpoint: "tcp://127.0.0.1:1", ReplayEndpoint: "udp://x"},
		{Endpoint: "tcp://256.0.0.1:1", Bind: true},
	} {
		if err := Subscribe(context.Background(), cfg, newRecorder()); err == nil {
			t.Errorf("Subscribe(%+v) accepted", cfg)
		}
	}
}

// TestNoGoroutineLeak subscribes, replays and cancels, and checks that
// every goroutine started is gone, but for one: zmq4 v0.17.0's PUB socket
// leaves its writer goroutine parked after Close (its Close does not close
// the writer), one per closed Publisher. The subscriber side, which the
// router runs and reopens on every reconnect, leaves nothing.
func TestNoGoroutineLeak(t *testing.T) {
	before := goroutines()
	func() {
		r, _, stop := withGap(t, PublisherConfig{Endpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "tcp://127.0.0.1:*"}, 2,
			func(start, seq uint64) bool { return seq == start })
		r.mu.Lock()
		replays := r.counts[Replays]
		r.mu.Unlock()
		if replays != 1 {
			t.Errorf("%d replays", replays)
		}
		stop()
		// A subscriber dialling an endpoint nobody serves, cancelled.
		stop2 := subscribe(t, SubscriberConfig{Endpoint: "tcp://" + freeAddr(t), RetryMin: 10 * time.Millisecond}, newRecorder())
		time.Sleep(50 * time.Millisecond)
		stop2()
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		after := goroutines()
		if len(after) <= len(before) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines before, %d after:\n%s", len(before), len(after), strings.Join(after, "\n\n"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// goroutines returns the stacks of the running goroutines but for parked
// zmq4 PUB writers.
func goroutines() []string {
	buf := make([]byte, 1<<20)
	var out []string
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		if !strings.Contains(g, "zmq4.(*pubMWriter).run") {
			out = append(out, g)
		}
	}
	return out
}
