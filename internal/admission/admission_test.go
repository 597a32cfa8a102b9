package admission

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvroute/kvroute/internal/clocktest"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/openai"
)

// switchable is a saturated function the test turns on and off.
type switchable struct{ on atomic.Bool }

func (s *switchable) saturated(string) bool { return s.on.Load() }

// newController returns a controller that holds requests while sat(model)
// reports true, whatever the time.
func newController(t *testing.T, cfg Config, sat func(string) bool) *Controller {
	t.Helper()
	c, err := New(cfg, func(model string, _ time.Time) bool { return sat(model) }, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// waitLen waits until c has n waiters, bounded by a second stretched by
// how far the process falls behind meanwhile.
func waitLen(t *testing.T, c *Controller, n int) {
	t.Helper()
	clock := clocktest.Start(t)
	defer clock.Stop()
	if !clock.Until(time.Second, func() bool { return c.Len() == n }) {
		t.Fatalf("queue length %d, want %d (%s)", c.Len(), n, clock)
	}
}

// result is how one queued Admit ended.
type result struct {
	name    string
	release func()
	err     error
}

// enqueue starts Admit in a goroutine, waits until it is queued, and
// returns the channel its result arrives on.
func enqueue(t *testing.T, c *Controller, ctx context.Context, name string, prio int, tenant string) <-chan result {
	t.Helper()
	before := c.Len()
	ch := make(chan result, 1)
	go func() {
		rel, err := c.Admit(ctx, "m", prio, tenant)
		ch <- result{name, rel, err}
	}()
	waitLen(t, c, before+1)
	return ch
}

// admitted waits up to wait for ch's request to be admitted, and releases
// it.
func admitted(t *testing.T, ch <-chan result, wait time.Duration, what string) {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("%s: %v", what, r.err)
		}
		r.release()
	case <-time.After(wait):
		t.Fatalf("%s: not admitted within %v", what, wait)
	}
}

// value reads a gauge or counter.
func value(t *testing.T, m prometheus.Metric) float64 {
	t.Helper()
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		t.Fatal(err)
	}
	if d.Gauge != nil {
		return d.Gauge.GetValue()
	}
	return d.Counter.GetValue()
}

func TestAdmitAtOnceWhenNotSaturated(t *testing.T) {
	var sat switchable
	c := newController(t, Config{}, sat.saturated)
	clock := clocktest.Start(t)
	for _, ctrl := range []*Controller{c, nil} {
		start := time.Now()
		rel, err := ctrl.Admit(context.Background(), "m", 0, "")
		if err != nil {
			t.Fatal(err)
		}
		rel()
		if d := time.Since(start); !clock.Within(t, d, 50*time.Millisecond, "admitting to an unsaturated fleet") {
			t.Errorf("admit took %v (%s)", d, clock)
		}
		if ctrl.Len() != 0 {
			t.Errorf("queue length %d", ctrl.Len())
		}
		ctrl.Wake() // no-op, must not block or panic
	}
}

// drain opens the gate and collects the order in which the channels'
// requests are admitted, each releasing its grant before the next may go.
func drain(t *testing.T, sat *switchable, c *Controller, chans []<-chan result) []string {
	t.Helper()
	sat.on.Store(false)
	c.Wake()
	var order []string
	merged := make(chan result, len(chans))
	for _, ch := range chans {
		go func() { merged <- <-ch }()
	}
	for range chans {
		select {
		case r := <-merged:
			if r.err != nil {
				t.Fatalf("%s: %v", r.name, r.err)
			}
			order = append(order, r.name)
			r.release()
		case <-time.After(2 * time.Second):
			t.Fatalf("stuck after %v", order)
		}
	}
	return order
}

func TestHigherPriorityFirst(t *testing.T) {
	var sat switchable
	sat.on.Store(true)
	c := newController(t, Config{}, sat.saturated)
	ctx := context.Background()
	var chans []<-chan result
	for _, p := range []int{0, 5, -3, 1, 5} {
		chans = append(chans, enqueue(t, c, ctx, fmt.Sprintf("p%d#%d", p, len(chans)), p, "t"))
	}
	got := strings.Join(drain(t, &sat, c, chans), " ")
	if want := "p5#1 p5#4 p1#3 p0#0 p-3#2"; got != want {
		t.Errorf("order %s, want %s", got, want)
	}
	waitLen(t, c, 0)
}

func TestFairAcrossTenants(t *testing.T) {
	var sat switchable
	sat.on.Store(true)
	c := newController(t, Config{}, sat.saturated)
	ctx := context.Background()
	var chans []<-chan result
	for i := range 10 {
		chans = append(chans, enqueue(t, c, ctx, fmt.Sprintf("A%d", i), 0, "A"))
	}
	chans = append(chans, enqueue(t, c, ctx, "B0", 0, "B"))
	chans = append(chans, enqueue(t, c, ctx, "C0", 0, "C"))
	order := drain(t, &sat, c, chans)
	if got, want := strings.Join(order[:4], " "), "A0 B0 C0 A1"; got != want {
		t.Errorf("first four admitted %s, want %s (whole order %v)", got, want, order)
	}
}

func TestNoBarging(t *testing.T) {
	var sat switchable
	sat.on.Store(true)
	c := newController(t, Config{}, sat.saturated)
	ctx := context.Background()
	old := enqueue(t, c, ctx, "old", 0, "A")
	sat.on.Store(false) // capacity frees, nobody has called Wake yet
	// A newcomer of the same priority queues behind the waiter and its
	// arrival lets the waiter in first.
	newer := make(chan result, 1)
	go func() {
		rel, err := c.Admit(ctx, "m", 0, "B")
		newer <- result{"new", rel, err}
	}()
	r := <-old
	if r.err != nil {
		t.Fatal(r.err)
	}
	select {
	case <-newer:
		t.Fatal("newcomer admitted while the earlier waiter's grant was in transit")
	case <-time.After(20 * time.Millisecond):
	}
	r.release()
	admitted(t, newer, time.Second, "newcomer after release")
	// A higher priority than anybody waiting goes straight in when there
	// is capacity.
	sat.on.Store(true)
	low := enqueue(t, c, ctx, "low", -1, "A")
	sat.on.Store(false)
	rel, err := c.Admit(ctx, "m", 0, "C")
	if err != nil {
		t.Fatal(err)
	}
	rel()
	c.Wake()
	if r := <-low; r.err != nil {
		t.Fatal(r.err)
	} else {
		r.release()
	}
}

func TestTimeoutIs429(t *testing.T) {
	var sat switchable
	sat.on.Store(true)
	reg := prometheus.NewRegistry()
	c, err := New(Config{MaxWait: 60 * time.Millisecond}, func(m string, _ time.Time) bool { return sat.saturated(m) }, reg)
	if err != nil {
		t.Fatal(err)
	}
	clock := clocktest.Start(t)
	start := time.Now()
	_, err = c.Admit(context.Background(), "m", 0, "")
	waited := time.Since(start)
	oe, ok := errors.AsType[*openai.Error](err)
	if !ok {
		t.Fatalf("error %v (%T), want *openai.Error", err, err)
	}
	if oe.Status != http.StatusTooManyRequests || oe.Type != openai.TypeRateLimit || oe.RetryAfter < 1 || oe.Code != "queue_timeout" {
		t.Errorf("error %+v", oe)
	}
	if waited < 60*time.Millisecond || !clock.Within(t, waited, time.Second, "a 60ms queue timeout") {
		t.Errorf("waited %v, want about 60ms (%s)", waited, clock)
	}
	if c.Len() != 0 {
		t.Errorf("queue length %d after timeout", c.Len())
	}
	if n := value(t, c.m.rejections.WithLabelValues("timeout")); n != 1 {
		t.Errorf("timeout rejections %v", n)
	}
	if n := value(t, c.m.length); n != 0 {
		t.Errorf("length gauge %v", n)
	}
}

func TestFullQueueIs429AtOnce(t *testing.T) {
	var sat switchable
	sat.on.Store(true)
	c := newController(t, Config{MaxQueue: 2, MaxWait: 5 * time.Second}, sat.saturated)
	clock := clocktest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	a := enqueue(t, c, ctx, "a", 0, "A")
	b := enqueue(t, c, ctx, "b", 0, "B")
	start := time.Now()
	_, err := c.Admit(context.Background(), "m", 9, "C")
	oe, ok := errors.AsType[*openai.Error](err)
	if !ok || oe.Status != http.StatusTooManyRequests || oe.Code != "queue_full" || oe.RetryAfter < 1 || oe.Type != openai.TypeRateLimit {
		t.Fatalf("error %v, want 429 queue_full with Retry-After", err)
	}
	if d := time.Since(start); !clock.Within(t, d, 100*time.Millisecond, "answering from a full queue") {
		t.Errorf("full queue answered after %v (%s)", d, clock)
	}
	if n := value(t, c.m.rejections.WithLabelValues("full")); n != 1 {
		t.Errorf("full rejections %v", n)
	}
	cancel()
	<-a
	<-b
}

func TestCancelRemovesAtOnce(t *testing.T) {
	var sat switchable
	sat.on.Store(true)
	c := newController(t, Config{MaxWait: time.Minute}, sat.saturated)
	clock := clocktest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	stay := enqueue(t, c, context.Background(), "stay", 0, "A")
	gone := enqueue(t, c, ctx, "gone", 0, "B")
	start := time.Now()
	cancel()
	select {
	case r := <-gone:
		if !errors.Is(r.err, context.Canceled) {
			t.Errorf("error %v, want context.Canceled", r.err)
		}
	case <-time.After(clock.Scale(time.Second)):
		t.Fatalf("cancelled waiter still waiting (%s)", clock)
	}
	if d := time.Since(start); !clock.Within(t, d, 100*time.Millisecond, "removing a cancelled waiter") {
		t.Errorf("removal took %v (%s)", d, clock)
	}
	waitLen(t, c, 1)
	sat.on.Store(false)
	c.Wake()
	r := <-stay
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.release()
	r.release() // a second release does nothing
	waitLen(t, c, 0)
}

// TestStorm runs many requests through a controller whose capacity is a
// fixed number of slots: every request ends admitted, timed out or
// cancelled, the queue ends empty, and no goroutine outlives the storm.
func TestStorm(t *testing.T) {
	const (
		requests = 400
		slots    = 4
	)
	clock := clocktest.Start(t) // before the baseline, which counts its goroutine
	baseline := runtime.NumGoroutine()
	var inflight, peak atomic.Int64
	c := newController(t, Config{MaxQueue: 300, MaxWait: 300 * time.Millisecond, Recheck: 5 * time.Millisecond},
		func(string) bool { return inflight.Load() >= slots })
	var admitted, rejected, cancelled atomic.Int64
	var wg sync.WaitGroup
	for i := range requests {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rng.IntN(400))*time.Millisecond)
			defer cancel()
			rel, err := c.Admit(ctx, "m", rng.IntN(3), fmt.Sprintf("t%d", rng.IntN(5)))
			if err != nil {
				if _, ok := errors.AsType[*openai.Error](err); ok {
					rejected.Add(1)
				} else if errors.Is(err, context.DeadlineExceeded) {
					cancelled.Add(1)
				} else {
					t.Errorf("unexpected error %v", err)
				}
				return
			}
			admitted.Add(1)
			n := inflight.Add(1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			rel()
			time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
			inflight.Add(-1)
			c.Wake()
		})
	}
	wg.Wait()
	if got := admitted.Load() + rejected.Load() + cancelled.Load(); got != requests {
		t.Errorf("accounted %d of %d", got, requests)
	}
	if c.Len() != 0 {
		t.Errorf("queue length %d after the storm", c.Len())
	}
	if n := value(t, c.m.length); n != 0 {
		t.Errorf("length gauge %v after the storm", n)
	}
	if !clock.Until(2*time.Second, func() bool { return runtime.NumGoroutine() <= baseline }) {
		t.Fatalf("%d goroutines after the storm, %d before (%s)", runtime.NumGoroutine(), baseline, clock)
	}
	t.Logf("peak in flight %d with %d slots; rejected %d, cancelled %d", peak.Load(), slots, rejected.Load(), cancelled.Load())
}

func TestParsePriority(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
		bad  bool
	}{
		{"", 0, false}, {"0", 0, false}, {"7", 7, false}, {" -2 ", -2, false}, {"1000000", 1000000, false},
		{"high", 0, true}, {"1.5", 0, true}, {"1000001", 0, true}, {"99999999999999999999", 0, true},
	} {
		h := http.Header{}
		if tc.in != "" {
			h.Set(PriorityHeader, tc.in)
		}
		got, err := ParsePriority(h)
		if tc.bad {
			if err == nil || err.Status != http.StatusBadRequest || !strings.Contains(err.Message, PriorityHeader) {
				t.Errorf("%q: error %v, want 400 naming the header", tc.in, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q: %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
}

func TestTenant(t *testing.T) {
	key := "sk-secret-123"
	bearer := http.Header{"Authorization": {"Bearer " + key}}
	other := http.Header{"Authorization": {"Bearer sk-other"}}
	withHeader := http.Header{"Authorization": {"Bearer " + key}, "X-Team": {"red"}}
	a := Tenant(bearer, "")
	if a == "" || strings.Contains(a, key) || strings.Contains(a, "secret") {
		t.Errorf("tenant %q must be a non-empty hash of the key", a)
	}
	if a != Tenant(bearer.Clone(), "X-Team") {
		t.Error("the bearer token is the fallback when the header is absent")
	}
	if a == Tenant(other, "") {
		t.Error("two keys, one tenant")
	}
	if Tenant(withHeader, "X-Team") == a {
		t.Error("the configured header must win over the API key")
	}
	if Tenant(http.Header{}, "X-Team") != "" {
		t.Error("anonymous requests share the empty tenant")
	}
}

func TestLimitsSaturated(t *testing.T) {
	now := time.Now()
	newFleet := func(t *testing.T) (*fleet.Fleet, *fleet.Backend, *fleet.Backend) {
		t.Helper()
		f := fleet.New()
		u, _ := url.Parse("http://a")
		return f, f.Add("a", u, []string{"m"}), f.Add("b", u, []string{"m", "x"})
	}
	for _, tc := range []struct {
		name  string
		lim   Limits
		setup func(f *fleet.Fleet, a, b *fleet.Backend)
		model string
		want  bool
	}{
		{"off", Limits{}, func(f *fleet.Fleet, a, b *fleet.Backend) { a.Start(10, 10, 1, now); b.Start(10, 10, 1, now) }, "m", false},
		{"one of two at in-flight limit", Limits{MaxInFlight: 1}, func(f *fleet.Fleet, a, b *fleet.Backend) { a.Start(10, 10, 1, now) }, "m", false},
		{"both at in-flight limit", Limits{MaxInFlight: 1}, func(f *fleet.Fleet, a, b *fleet.Backend) { a.Start(10, 10, 1, now); b.Start(10, 10, 1, now) }, "m", true},
		{"only b serves x", Limits{MaxInFlight: 1}, func(f *fleet.Fleet, a, b *fleet.Backend) { b.Start(10, 10, 1, now) }, "x", true},
		{"unhealthy free backend does not count", Limits{MaxInFlight: 1}, func(f *fleet.Fleet, a, b *fleet.Backend) {
			a.Start(10, 10, 1, now)
			f.SetHealthy(b, false)
		}, "m", true},
		{"pending prefill", Limits{MaxPendingPrefill: 1000}, func(f *fleet.Fleet, a, b *fleet.Backend) {
			a.Start(2000, 1500, 1, now)
			b.Start(2000, 600, 1, now)
			b.Start(2000, 400, 1, now)
		}, "m", true},
		{"peers' reported load counts", Limits{MaxInFlight: 2}, func(f *fleet.Fleet, a, b *fleet.Backend) {
			a.Start(10, 10, 1, now)
			a.AddPeerLoad(fleet.Load{InFlight: 1})
			b.AddPeerLoad(fleet.Load{InFlight: 2})
		}, "m", true},
		{"presumed load does not count", Limits{MaxInFlight: 1, MaxPendingPrefill: 1000}, func(f *fleet.Fleet, a, b *fleet.Backend) {
			a.AddPresumedLoad(fleet.Load{InFlight: 3, PendingPrefill: 6000})
			b.AddPresumedLoad(fleet.Load{InFlight: 3, PendingPrefill: 6000})
		}, "m", false},
		{"prefill done frees", Limits{MaxPendingPrefill: 1000}, func(f *fleet.Fleet, a, b *fleet.Backend) {
			a.Start(2000, 1500, 1, now)
			b.Start(2000, 1500, 1, now).FirstByte(now)
		}, "m", false},
		{"fresh engine queues", Limits{MaxEngineWaiting: 4}, func(f *fleet.Fleet, a, b *fleet.Backend) {
			a.SetEngine(&fleet.EngineState{At: now, Waiting: 4})
			b.SetEngine(&fleet.EngineState{At: now.Add(-time.Second), Waiting: 9})
		}, "m", true},
		{"stale engine report ignored", Limits{MaxEngineWaiting: 4}, func(f *fleet.Fleet, a, b *fleet.Backend) {
			a.SetEngine(&fleet.EngineState{At: now, Waiting: 4})
			b.SetEngine(&fleet.EngineState{At: now.Add(-time.Minute), Waiting: 9})
		}, "m", false},
		{"missing engine report ignored", Limits{MaxEngineWaiting: 4}, func(f *fleet.Fleet, a, b *fleet.Backend) {
			a.SetEngine(&fleet.EngineState{At: now, Waiting: 5})
		}, "m", false},
		{"model nobody serves", Limits{MaxInFlight: 1}, func(f *fleet.Fleet, a, b *fleet.Backend) {}, "nope", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, a, b := newFleet(t)
			tc.setup(f, a, b)
			if got := tc.lim.Saturated(f)(tc.model, now); got != tc.want {
				t.Errorf("saturated %v, want %v", got, tc.want)
			}
		})
	}
}

func BenchmarkAdmitNotSaturated(b *testing.B) {
	c, err := New(Config{}, func(string, time.Time) bool { return false }, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		rel, _ := c.Admit(ctx, "m", 0, "t")
		rel()
		c.Wake()
	}
}

func BenchmarkLimitsSaturated(b *testing.B) {
	f := fleet.New()
	u, _ := url.Parse("http://a")
	for i := range 16 {
		f.Add(fmt.Sprint(i), u, nil)
	}
	sat := Limits{MaxInFlight: 8, MaxPendingPrefill: 1 << 20, MaxEngineWaiting: 4}.Saturated(f)
	b.ReportAllocs()
	now := time.Now()
	for b.Loop() {
		sat("m", now)
	}
}

// BenchmarkAdmitLimits is the fast path as the router runs it: a request
// admitted at once over a fleet of 16 backends below every limit.
func BenchmarkAdmitLimits(b *testing.B) {
	f := fleet.New()
	u, _ := url.Parse("http://a")
	for i := range 16 {
		f.Add(fmt.Sprint(i), u, nil)
	}
	c, err := New(Config{}, Limits{MaxInFlight: 8, MaxPendingPrefill: 1 << 20, MaxEngineWaiting: 4}.Saturated(f), nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		rel, _ := c.Admit(ctx, "m", 0, "t")
		rel()
		c.Wake()
	}
}
