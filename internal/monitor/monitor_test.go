package monitor

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/adapter"
	"github.com/kvroute/kvroute/internal/clocktest"
	"github.com/kvroute/kvroute/internal/fleet"
)

// engineServer is an in-process engine's metrics surface whose answers a
// test changes while the monitor scrapes it.
type engineServer struct {
	*httptest.Server
	metrics atomic.Pointer[string] // nil: 404
	slots   atomic.Pointer[string] // nil: 404
	status  atomic.Int32           // non-zero: every response has this status
	hang    atomic.Bool            // answer nothing until the request is cancelled
	delay   atomic.Int64           // nanoseconds to wait before answering
	hits    atomic.Int64
}

func newEngine(t *testing.T, metrics string) *engineServer {
	t.Helper()
	s := &engineServer{}
	if metrics != "" {
		s.setMetrics(metrics)
	}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.hits.Add(1)
		if s.hang.Load() {
			<-r.Context().Done()
			return
		}
		if d := s.delay.Load(); d > 0 {
			time.Sleep(time.Duration(d))
		}
		if c := s.status.Load(); c != 0 {
			http.Error(w, "failing", int(c))
			return
		}
		var body *string
		switch r.URL.Path {
		case "/metrics":
			body = s.metrics.Load()
		case "/slots":
			body = s.slots.Load()
		}
		if body == nil {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, *body)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *engineServer) setMetrics(m string) { s.metrics.Store(&m) }
func (s *engineServer) setSlots(m string)   { s.slots.Store(&m) }

func fixture(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "adapter", "testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// vllmMetrics is a minimal vLLM v1 exposition.
func vllmMetrics(running, waiting int, usage float64, blockSize, gpuBlocks int) string {
	return fmt.Sprintf(`# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} %d
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} %d
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} %g
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="%d",engine="0",num_gpu_blocks="%d"} 1
`, running, waiting, usage, blockSize, gpuBlocks)
}

// logBuffer collects log lines safely from concurrent loops.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.b.String(), s)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// fastConfig scrapes every few milliseconds so that tests run quickly.
func fastConfig() Config {
	return Config{Interval: 5 * time.Millisecond, Timeout: 200 * time.Millisecond, StaleAfter: 4}
}

// start runs a monitor over backends at urls and stops it at cleanup,
// failing the test if Run does not return promptly.
func start(t *testing.T, cfg Config, urls ...string) (*fleet.Fleet, *Monitor, *logBuffer) {
	t.Helper()
	f := fleet.New()
	for _, s := range urls {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		f.Add(u.Host, u, nil)
	}
	logs := &logBuffer{}
	m := New(f, cfg, nil, slog.New(slog.NewTextHandler(logs, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { m.Run(ctx); close(done) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Error("Run did not return within 5s of cancel")
		}
	})
	return f, m, logs
}

// startOne runs a monitor of srv alone and waits for its first reading.
func startOne(t *testing.T, cfg Config, srv *engineServer) (*fleet.Backend, *Monitor, *logBuffer) {
	t.Helper()
	f, m, logs := start(t, cfg, srv.URL)
	b := f.Snapshot().All[0]
	waitFor(t, "engine state", func() bool { return b.Engine() != nil })
	return b, m, logs
}

// waitFor polls cond until it holds or 5 s pass, stretched by how far
// the process falls behind meanwhile.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	clock := clocktest.Start(t)
	defer clock.Stop()
	if !clock.Until(5*time.Second, cond) {
		t.Fatalf("timed out waiting for %s (%s)", what, clock)
	}
}

func TestScrapeFixtures(t *testing.T) {
	slots := fixture(t, "slots.json") // 2 of 3 slots processing
	tests := []struct {
		name    string
		metrics string // fixture file, or "" for no /metrics
		inline  string // inline exposition instead of a fixture
		slots   bool
		kind    adapter.Kind
		want    fleet.EngineState // At ignored
	}{
		{name: "vllm auto", metrics: "vllm.prom", want: fleet.EngineState{Running: 12, Waiting: 5, KVUsage: 0.42, KVBlocks: 27000, BlockSize: 16}},
		{name: "vllm explicit", metrics: "vllm.prom", kind: adapter.VLLM, want: fleet.EngineState{Running: 12, Waiting: 5, KVUsage: 0.42, KVBlocks: 27000, BlockSize: 16}},
		{name: "vllm v0 names", metrics: "vllm_v0.prom", want: fleet.EngineState{Running: 3, Waiting: 0, KVUsage: 0.9}},
		{name: "sglang auto", metrics: "sglang.prom", want: fleet.EngineState{Running: 7, Waiting: 2, KVUsage: 0.28}},
		{name: "sglang explicit", metrics: "sglang.prom", kind: adapter.SGLang, want: fleet.EngineState{Running: 7, Waiting: 2, KVUsage: 0.28}},
		{name: "llamacpp metrics", metrics: "llamacpp.prom", slots: true, want: fleet.EngineState{Running: 4, Waiting: 9, Missing: fleet.EngineKVUsage}},
		{name: "llamacpp deferred only plus slots", inline: "llamacpp:requests_deferred 9\n", slots: true, want: fleet.EngineState{Running: 2, Waiting: 9, Missing: fleet.EngineKVUsage}},
		{name: "llamacpp slots only auto", slots: true, want: fleet.EngineState{Running: 2, Missing: fleet.EngineWaiting | fleet.EngineKVUsage}},
		{name: "llamacpp slots only explicit", slots: true, kind: adapter.LlamaCpp, want: fleet.EngineState{Running: 2, Missing: fleet.EngineWaiting | fleet.EngineKVUsage}},
		{name: "tgi auto", metrics: "tgi.prom", want: fleet.EngineState{Running: 32, Waiting: 6, Missing: fleet.EngineKVUsage}},
		{name: "tgi explicit", metrics: "tgi.prom", kind: adapter.TGI, want: fleet.EngineState{Running: 32, Waiting: 6, Missing: fleet.EngineKVUsage}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			text := tt.inline
			if tt.metrics != "" {
				text = fixture(t, tt.metrics)
			}
			srv := newEngine(t, text)
			if tt.slots {
				srv.setSlots(slots)
			}
			cfg := fastConfig()
			cfg.KindOf = func(*fleet.Backend) adapter.Kind { return tt.kind }
			before := time.Now()
			f, _, logs := start(t, cfg, srv.URL)
			b := f.Snapshot().All[0]
			waitFor(t, "engine state", func() bool { return b.Engine() != nil })
			got := *b.Engine()
			if got.At.Before(before) || got.At.After(time.Now()) {
				t.Errorf("At = %v, not within the test", got.At)
			}
			got.At = time.Time{}
			if got != tt.want {
				t.Fatalf("engine state %+v, want %+v", got, tt.want)
			}
			if tt.kind == adapter.Unknown {
				if n := logs.count("engine kind detected"); n != 1 {
					t.Errorf("%d detection log lines, want 1:\n%s", n, logs)
				}
			} else if n := logs.count("engine kind configured"); n != 1 {
				t.Errorf("%d configured-kind log lines, want 1:\n%s", n, logs)
			}
		})
	}
}

func TestWrongKindOrNoEngine(t *testing.T) {
	tests := []struct {
		name    string
		metrics string
		kind    adapter.Kind
	}{
		{"configured sglang serves vllm", fixture(t, "vllm.prom"), adapter.SGLang},
		{"configured vllm serves tgi", fixture(t, "tgi.prom"), adapter.VLLM},
		{"configured llamacpp without metrics or slots", "", adapter.LlamaCpp},
		{"no engine metrics", "# TYPE go_goroutines gauge\ngo_goroutines 5\n", adapter.Unknown},
		{"garbage", "this is { not prometheus", adapter.Unknown},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := newEngine(t, tt.metrics)
			cfg := fastConfig()
			cfg.KindOf = func(*fleet.Backend) adapter.Kind { return tt.kind }
			f, m, logs := start(t, cfg, srv.URL)
			waitFor(t, "several scrapes", func() bool { return scrapeErrors(t, m)[f.Snapshot().All[0].Name] >= 3 })
			if e := f.Snapshot().All[0].Engine(); e != nil {
				t.Fatalf("engine state %+v published from a wrong exposition", e)
			}
			if n := logs.count("engine scrape failing"); n != 1 {
				t.Errorf("%d failing log lines over several failures, want 1:\n%s", n, logs)
			}
		})
	}
}

// scrapeErrors gathers kvroute_engine_scrape_errors_total by backend.
func scrapeErrors(t *testing.T, m *Monitor) map[string]float64 {
	t.Helper()
	return gather(t, m)["kvroute_engine_scrape_errors_total"]
}

// gather collects m's metrics through a registry: family -> backend -> value.
func gather(t *testing.T, m *Monitor) map[string]map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := m.Register(reg); err != nil {
		t.Error(err) // not Fatal: gather also runs on other goroutines
		return nil
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Error(err)
		return nil
	}
	out := map[string]map[string]float64{}
	for _, f := range fams {
		out[f.GetName()] = map[string]float64{}
		for _, mt := range f.Metric {
			v := mt.GetGauge().GetValue()
			if mt.Counter != nil {
				v = mt.Counter.GetValue()
			}
			out[f.GetName()][mt.Label[0].GetValue()] = v
		}
	}
	return out
}

func TestStaleAndRecovery(t *testing.T) {
	srv := newEngine(t, vllmMetrics(1, 7, 0.5, 16, 1000))
	cfg := fastConfig()
	// A stale age of 500 ms, not fastConfig's 20: the checks below read
	// the reading between failed scrapes, and a loaded machine can hold
	// the test's goroutine longer than 20 ms between two of them, when
	// the reading is rightly withdrawn already.
	cfg.StaleAfter = 100
	f, m, logs := start(t, cfg, srv.URL)
	b := f.Snapshot().All[0]
	waitFor(t, "engine state", func() bool { return b.Engine() != nil })
	if g := gather(t, m); g["kvroute_engine_waiting"][b.Name] != 7 || g["kvroute_engine_kv_usage"][b.Name] != 0.5 {
		t.Fatalf("gauges %v, want waiting 7 and kv usage 0.5", g)
	}

	srv.status.Store(http.StatusInternalServerError)
	waitFor(t, "a failed scrape", func() bool { return scrapeErrors(t, m)[b.Name] > 0 })
	// A failed scrape must not refresh the reading. (A scrape the engine
	// answered just before it started failing may still land after the
	// change: the reading to hold is the one seen once a scrape failed.)
	last := b.Engine()
	failures := scrapeErrors(t, m)[b.Name]
	waitFor(t, "more failed scrapes", func() bool { return scrapeErrors(t, m)[b.Name] >= failures+2 })
	if e := b.Engine(); e != nil && e != last {
		t.Fatalf("reading taken at %v replaced the one of %v while every scrape failed", e.At, last.At)
	}
	if last == nil {
		t.Fatal("the reading was withdrawn at the first failed scrape")
	}
	waitFor(t, "stale reading withdrawn", func() bool { return b.Engine() == nil })
	if age := time.Since(last.At); age < cfg.StaleAge() {
		t.Fatalf("reading withdrawn %v after it was taken, before the stale age %v", age, cfg.StaleAge())
	}
	if g := gather(t, m); len(g["kvroute_engine_waiting"]) != 0 {
		t.Fatalf("stale gauges still exported: %v", g["kvroute_engine_waiting"])
	}
	// Many failures, one log line.
	waitFor(t, "more failures", func() bool { return scrapeErrors(t, m)[b.Name] >= 10 })
	if n := logs.count("engine scrape failing"); n != 1 {
		t.Fatalf("%d failing log lines, want 1:\n%s", n, logs)
	}

	srv.status.Store(0)
	waitFor(t, "recovered reading", func() bool { return b.Engine() != nil })
	time.Sleep(10 * cfg.Interval)
	if n := logs.count("engine scrape recovered"); n != 1 {
		t.Fatalf("%d recovered log lines, want 1:\n%s", n, logs)
	}
	if n := logs.count("engine kind detected"); n != 1 {
		t.Fatalf("kind detected %d times across an outage, want once:\n%s", n, logs)
	}
}

func TestTimeoutGoesStale(t *testing.T) {
	srv := newEngine(t, vllmMetrics(0, 3, 0.1, 16, 1000))
	cfg := fastConfig()
	cfg.Timeout = 20 * time.Millisecond
	b, m, _ := startOne(t, cfg, srv)
	srv.hang.Store(true)
	waitFor(t, "stale reading withdrawn", func() bool { return b.Engine() == nil })
	if scrapeErrors(t, m)[b.Name] == 0 {
		t.Fatal("timed-out scrapes not counted as errors")
	}
}

func TestBodyLimit(t *testing.T) {
	big := fixture(t, "vllm.prom") + "# " + strings.Repeat("x", 4096) + "\n"
	srv := newEngine(t, big)
	cfg := fastConfig()
	cfg.MaxBodyBytes = 2048
	f, m, logs := start(t, cfg, srv.URL)
	b := f.Snapshot().All[0]
	waitFor(t, "failed scrapes", func() bool { return scrapeErrors(t, m)[b.Name] >= 2 })
	if b.Engine() != nil {
		t.Fatal("reading published from an oversized body")
	}
	if !strings.Contains(logs.String(), "larger than 2048 bytes") {
		t.Fatalf("log does not name the limit:\n%s", logs)
	}
}

func TestCapacityFromCacheConfig(t *testing.T) {
	srv := newEngine(t, vllmMetrics(0, 0, 0, 16, 27000))
	var mu sync.Mutex
	var calls [][2]int64
	cfg := fastConfig()
	cfg.SetCapacity = func(id int, kvTokens int64) {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, [2]int64{int64(id), kvTokens})
	}
	got := func() [][2]int64 {
		mu.Lock()
		defer mu.Unlock()
		return append([][2]int64(nil), calls...)
	}
	f, m, _ := start(t, cfg, srv.URL)
	b := f.Snapshot().All[0]
	waitFor(t, "capacity", func() bool { return len(got()) > 0 })
	// 27000 engine blocks of 16 tokens.
	want := int64(27000 * 16)
	hits := srv.hits.Load()
	waitFor(t, "more scrapes", func() bool { return srv.hits.Load() >= hits+5 })
	if c := got(); len(c) != 1 || c[0] != [2]int64{int64(b.ID), want} {
		t.Fatalf("SetCapacity calls %v, want one call (%d, %d)", c, b.ID, want)
	}
	if e := b.Engine(); e == nil || e.KVBlocks != 27000 {
		t.Fatalf("engine state %+v, want KVBlocks 27000", e)
	}
	// An engine restarted with a different cache size updates it once.
	srv.setMetrics(vllmMetrics(0, 0, 0, 32, 1000))
	waitFor(t, "new capacity", func() bool { return len(got()) == 2 })
	if c := got(); c[1] != [2]int64{int64(b.ID), 1000 * 32} {
		t.Fatalf("second SetCapacity call %v", c[1])
	}
	_ = m
}

func TestBackendsAddedLaterAndShutdown(t *testing.T) {
	a := newEngine(t, vllmMetrics(1, 0, 0, 16, 100))
	bsrv := newEngine(t, fixture(t, "sglang.prom"))
	f := fleet.New()
	ua, _ := url.Parse(a.URL)
	f.Add("a", ua, nil)
	f.Add("sim", nil, nil) // no URL: never scraped
	m := New(f, fastConfig(), nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { m.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	snap := f.Snapshot()
	waitFor(t, "first backend", func() bool { return snap.All[0].Engine() != nil })
	ub, _ := url.Parse(bsrv.URL)
	late := f.Add("b", ub, nil)
	waitFor(t, "backend added later", func() bool { return late.Engine() != nil })
	if e := late.Engine(); e.Running != 7 || e.Waiting != 2 {
		t.Fatalf("late backend state %+v, want SGLang fixture's 7 running 2 waiting", e)
	}
	if snap.All[1].Engine() != nil {
		t.Fatal("a backend without URL got engine state")
	}

	clock := clocktest.Start(t)
	cancel()
	start := time.Now()
	select {
	case <-done:
	case <-time.After(clock.Scale(5 * time.Second)):
		t.Fatalf("Run did not return after cancel (%s)", clock)
	}
	if d := time.Since(start); !clock.Within(t, d, time.Second, "stopping the monitor") {
		t.Errorf("Run took %v to stop (%s)", d, clock)
	}
	for _, b := range f.Snapshot().All {
		if b.Engine() != nil {
			t.Errorf("backend %s keeps engine state after the monitor stopped", b.Name)
		}
	}
}

// TestConcurrent runs many fast loops while readers read engine states and
// collect metrics; it is meant for -race.
func TestConcurrent(t *testing.T) {
	var urls []string
	for i := range 8 {
		srv := newEngine(t, vllmMetrics(i, i, float64(i)/10, 16, 1000+i))
		urls = append(urls, srv.URL)
		if i%3 == 0 {
			srv.status.Store(http.StatusServiceUnavailable)
		}
	}
	cfg := fastConfig()
	cfg.Interval = time.Millisecond
	var capCalls atomic.Int64
	cfg.SetCapacity = func(int, int64) { capCalls.Add(1) }
	f, m, _ := start(t, cfg, urls...)
	stop := time.Now().Add(300 * time.Millisecond)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for time.Now().Before(stop) {
				for _, b := range f.Snapshot().All {
					if e := b.Engine(); e != nil && (e.Waiting != b.ID || e.KVBlocks != 1000+b.ID) {
						t.Errorf("backend %d: state %+v of another backend", b.ID, e)
						return
					}
				}
				gather(t, m)
			}
		})
	}
	wg.Wait()
	// On a loaded machine a scrape may time out now and then, so wait for
	// the serving backends' reports rather than expect them at this instant.
	waitFor(t, "reports of the serving backends", func() bool {
		for _, b := range f.Snapshot().All {
			if up := b.ID%3 != 0; up != (b.Engine() != nil) {
				return false
			}
		}
		return true
	})
	if n := capCalls.Load(); n != 5 {
		t.Errorf("%d capacity calls, want one per serving backend (5)", n)
	}
}

func TestConfigDefaults(t *testing.T) {
	c := Config{}.withDefaults()
	if c.Interval != DefaultInterval || c.Timeout != DefaultTimeout || c.StaleAfter != DefaultStaleAfter ||
		c.MaxBodyBytes != DefaultMaxBodyBytes {
		t.Fatalf("defaults %+v", c)
	}
	if got := (Config{}).StaleAge(); got != DefaultStaleAfter*DefaultInterval {
		t.Fatalf("StaleAge %v", got)
	}
	if got := (Config{Interval: time.Second, StaleAfter: 2}).StaleAge(); got != 2*time.Second {
		t.Fatalf("StaleAge %v", got)
	}
}

// BenchmarkScrape is one scrape of the vLLM fixture over loopback: GET,
// parse, publish.
func BenchmarkScrape(b *testing.B) {
	for _, name := range []string{"vllm.prom", "sglang.prom"} {
		b.Run(name, func(b *testing.B) {
			text, err := os.ReadFile(filepath.Join("..", "adapter", "testdata", name))
			if err != nil {
				b.Fatal(err)
			}
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(text) }))
			defer srv.Close()
			u, _ := url.Parse(srv.URL)
			f := fleet.New()
			be := f.Add("e", u, nil)
			m := New(f, Config{}, nil, nil)
			w := &watcher{b: be}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				m.scrapeOnce(ctx, w)
			}
			if be.Engine() == nil || w.errors.Load() != 0 {
				b.Fatalf("scrapes failed: %d errors", w.errors.Load())
			}
		})
	}
}

// TestMissingFieldsHaveNoSeries: llama.cpp reports no KV usage, so its
// backend has no kvroute_engine_kv_usage series (a 0 would read as an
// empty cache), while the fields it does report are exported.
func TestMissingFieldsHaveNoSeries(t *testing.T) {
	srv := newEngine(t, fixture(t, "llamacpp.prom"))
	b, m, _ := startOne(t, fastConfig(), srv)
	if e := b.Engine(); e.Has(fleet.EngineKVUsage) || !e.Has(fleet.EngineRunning|fleet.EngineWaiting) {
		t.Fatalf("Missing = %b, want only the KV usage", e.Missing)
	}
	g := gather(t, m)
	if _, ok := g["kvroute_engine_kv_usage"][b.Name]; ok {
		t.Errorf("kvroute_engine_kv_usage exported for an engine that does not report it: %v", g["kvroute_engine_kv_usage"])
	}
	if g["kvroute_engine_waiting"][b.Name] != 9 || g["kvroute_engine_running"][b.Name] != 4 {
		t.Errorf("waiting %v running %v, want 9 and 4", g["kvroute_engine_waiting"], g["kvroute_engine_running"])
	}
}

// TestLateScrapesDropped: an engine that answers later than LateAfter
// (as llama.cpp does between prefill batches under load) has its readings
// dropped, not stored as fresh: the last good one ages and is withdrawn,
// the late scrapes are counted, and they are logged once.
func TestLateScrapesDropped(t *testing.T) {
	srv := newEngine(t, vllmMetrics(1, 7, 0.5, 16, 1000))
	cfg := fastConfig()
	cfg.LateAfter = 20 * time.Millisecond
	b, m, logs := startOne(t, cfg, srv)
	srv.delay.Store(int64(40 * time.Millisecond))
	srv.setMetrics(vllmMetrics(0, 0, 0.5, 16, 1000)) // the idle moment it answers at
	slowAt := time.Now()
	waitFor(t, "stale reading withdrawn", func() bool { return b.Engine() == nil })
	late := func() float64 { return gather(t, m)["kvroute_engine_scrape_late_total"][b.Name] }
	waitFor(t, "several late scrapes", func() bool { return late() >= 5 })
	if e := b.Engine(); e != nil && e.At.After(slowAt) {
		t.Fatalf("a late reading was stored: %+v", e)
	}
	if n := scrapeErrors(t, m)[b.Name]; n != 0 {
		t.Errorf("late scrapes counted as %v errors, want 0", n)
	}
	if n := logs.count("engine scrape failing"); n != 1 {
		t.Errorf("%d log lines for %v late scrapes, want 1:\n%s", n, late(), logs)
	}
	srv.delay.Store(0)
	waitFor(t, "fresh reading", func() bool { e := b.Engine(); return e != nil && e.Waiting == 0 })
}

// TestFlappingLogsOnce: scrapes that fail and succeed in turn (an engine
// that times out now and then) log one warning, not one per failure.
func TestFlappingLogsOnce(t *testing.T) {
	srv := newEngine(t, vllmMetrics(1, 7, 0.5, 16, 1000))
	b, m, logs := startOne(t, fastConfig(), srv)
	for i := range 5 {
		srv.status.Store(http.StatusInternalServerError)
		waitFor(t, "a failed scrape", func() bool { return scrapeErrors(t, m)[b.Name] > float64(i) })
		srv.status.Store(0)
		at := time.Now()
		waitFor(t, "a good scrape", func() bool { e := b.Engine(); return e != nil && e.At.After(at) })
	}
	if n := logs.count("engine scrape failing"); n != 1 {
		t.Errorf("%d failing log lines over 5 short failures, want 1:\n%s", n, logs)
	}
}

// TestContextFromSlots: a llama.cpp server's /slots n_ctx reaches
// SetContext once, however many scrapes report it.
func TestContextFromSlots(t *testing.T) {
	srv := newEngine(t, "")
	srv.setSlots(fixture(t, "slots.json")) // n_ctx 8192
	var mu sync.Mutex
	var got []int
	cfg := fastConfig()
	cfg.SetContext = func(_ *fleet.Backend, n int) { mu.Lock(); got = append(got, n); mu.Unlock() }
	startOne(t, cfg, srv)
	hits := srv.hits.Load()
	waitFor(t, "more scrapes", func() bool { return srv.hits.Load() > hits+6 })
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 || got[0] != 8192 {
		t.Errorf("SetContext calls %v, want one of 8192", got)
	}
}

// TestEnginePrefillRate: the growth of llama.cpp's prompt counters between
// scrapes teaches the backend its engine-reported prefill rate; growth
// below fleet.MinRateWork accumulates, and a counter that went back (a
// restart) teaches nothing.
func TestEnginePrefillRate(t *testing.T) {
	counters := func(tokens, seconds float64) string {
		return fmt.Sprintf("llamacpp:requests_processing 1\nllamacpp:prompt_tokens_total %g\nllamacpp:prompt_seconds_total %g\n", tokens, seconds)
	}
	srv := newEngine(t, counters(4096, 2))
	b, _, _ := startOne(t, fastConfig(), srv)
	scraped := func() {
		t.Helper()
		n := srv.hits.Load()
		waitFor(t, "two more scrapes", func() bool { return srv.hits.Load() >= n+2 })
	}
	scraped()
	if r := b.EnginePrefillRate(); r != 0 {
		t.Fatalf("rate %v from one reading, want none yet", r)
	}
	srv.setMetrics(counters(4096+100, 2.1)) // below MinRateWork: not yet
	scraped()
	if r := b.EnginePrefillRate(); r != 0 {
		t.Fatalf("rate %v from 100 tokens, want none yet", r)
	}
	srv.setMetrics(counters(4096+2000, 2.5)) // 2,000 tokens in 0.5 s
	waitFor(t, "engine rate", func() bool { return b.EnginePrefillRate() != 0 })
	if r := b.EnginePrefillRate(); math.Abs(r-4000) > 1e-6 {
		t.Fatalf("rate %v, want 4000", r)
	}
	srv.setMetrics(counters(10, 0.001)) // restarted
	scraped()
	srv.setMetrics(counters(10+1000, 0.001+10)) // 100 tokens/s since the restart
	waitFor(t, "a second sample", func() bool { return b.EnginePrefillRate() != 4000 })
	if r, want := b.EnginePrefillRate(), 4000+fleet.RateAlpha*(100-4000); math.Abs(r-want) > 1e-6 {
		t.Fatalf("rate %v after a restart, want %v", r, want)
	}
}

// TestEngineDecodeAndCap: the growth of vLLM's inter-token latency
// histogram between scrapes teaches the backend its time per output
// token, and a running count held at its maximum while requests wait (KV
// cache mostly free) teaches its cap; llama.cpp's /slots count is its cap.
func TestEngineDecodeAndCap(t *testing.T) {
	itl := func(count int, sum float64) string {
		return vllmMetrics(8, 3, 0.2, 16, 1000) + fmt.Sprintf("# TYPE vllm:inter_token_latency_seconds histogram\n"+
			"vllm:inter_token_latency_seconds_bucket{le=\"+Inf\"} %[1]d\nvllm:inter_token_latency_seconds_sum %[2]g\nvllm:inter_token_latency_seconds_count %[1]d\n", count, sum)
	}
	srv := newEngine(t, itl(100, 1))
	b, _, _ := startOne(t, fastConfig(), srv)
	n := srv.hits.Load()
	waitFor(t, "two scrapes", func() bool { return srv.hits.Load() >= n+2 })
	srv.setMetrics(itl(300, 5)) // 200 tokens in 4 s
	waitFor(t, "decode time", func() bool { return b.EngineDecodeTime() != 0 })
	if d := b.EngineDecodeTime(); math.Abs(d-0.02) > 1e-12 {
		t.Fatalf("decode time %v, want 0.02", d)
	}
	waitFor(t, "learned cap", func() bool { return b.Limits().MaxNumSeqs == 8 })

	slots := newEngine(t, "")
	slots.setSlots(fixture(t, "slots.json")) // 3 slots
	sb, _, _ := startOne(t, fastConfig(), slots)
	waitFor(t, "cap from /slots", func() bool { return sb.Limits().MaxNumSeqs == 3 })
}

// An engine's numbers that no engine could report are unknown: NaN and
// infinities were read as the minimum int (shown in /admin/backends),
// 1e17 waiting as a queue that overflowed the policy's sums, and
// num_gpu_blocks of 6e17 as a KV capacity that overflowed negative.
func TestHostileNumbersUnknown(t *testing.T) {
	for _, tt := range []struct{ running, waiting, usage, blocks string }{
		{"NaN", "+Inf", "-Inf", "600000000000000000"},
		{"1e17", "1e17", "NaN", "576460752303423488"},
	} {
		t.Run(tt.running+"/"+tt.waiting, func(t *testing.T) {
			srv := newEngine(t, `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} `+tt.running+`
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} `+tt.waiting+`
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} `+tt.usage+`
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="`+tt.blocks+`"} 1
`)
			var capacity atomic.Int64
			cfg := fastConfig()
			cfg.SetCapacity = func(_ int, kvTokens int64) { capacity.Store(kvTokens) }
			b, _, _ := startOne(t, cfg, srv)
			e := b.Engine()
			if e.Has(fleet.EngineRunning) || e.Has(fleet.EngineWaiting) || e.Has(fleet.EngineKVUsage) {
				t.Errorf("engine state %+v: running, waiting and KV usage should be unknown", e)
			}
			if e.Running < 0 || e.Waiting < 0 || e.KVBlocks < 0 {
				t.Errorf("engine state %+v holds a negative count", e)
			}
			if c := capacity.Load(); c != 0 {
				t.Errorf("KV capacity set to %d tokens from num_gpu_blocks %s", c, tt.blocks)
			}
			if _, ok := e.FreeKVTokens(); ok {
				t.Errorf("free KV tokens known from an impossible cache")
			}
		})
	}
}

// TestReadingComputedTokens: a reading that teaches a time per output
// token carries the prompt tokens the engine computed over the same span
// (the growth of its count since the decode counters' last lesson,
// including scrapes that taught none), so that the prefill chunks run in
// those steps are not read as decode time; unknown (-1) when the engine
// counts none and after a restart.
func TestReadingComputedTokens(t *testing.T) {
	w := &watcher{b: fleet.New().Add("b", nil, nil), computed: -1}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	read := func(decTokens, decSeconds, computed float64) fleet.Reading {
		t.Helper()
		now = now.Add(time.Second)
		st := adapter.State{Running: 1, Waiting: 0, KVUsage: 0.1, PrefillTokens: -1, PrefillSeconds: -1,
			DecodeTokens: decTokens, DecodeSeconds: decSeconds, ComputedTokens: computed}
		return w.reading(st, now)
	}
	read(100, 1, 5000) // the first reading starts the counters
	if r := read(100, 1, 5600); r.DecodeTokens != 0 {
		t.Fatalf("no token came, reading taught %v", r.DecodeTokens)
	}
	r := read(300, 3, 7000) // 200 tokens in 2 s, 2,000 prompt tokens computed since the lesson
	if r.DecodeTokens != 200 || r.ComputedTokens != 2000 {
		t.Fatalf("reading %v tokens with %v computed, want 200 with 2000", r.DecodeTokens, r.ComputedTokens)
	}
	if r := read(400, 4, 7000); r.DecodeTokens != 100 || r.ComputedTokens != 0 {
		t.Fatalf("reading %v tokens with %v computed, want 100 with 0", r.DecodeTokens, r.ComputedTokens)
	}
	if r := read(500, 5, 10); r.DecodeTokens != 100 || r.ComputedTokens != -1 {
		t.Fatalf("count went back: reading %v tokens with %v computed, want 100 with -1", r.DecodeTokens, r.ComputedTokens)
	}
	if r := read(600, 6, -1); r.DecodeTokens != 100 || r.ComputedTokens != -1 {
		t.Fatalf("no count: reading %v tokens with %v computed, want 100 with -1", r.DecodeTokens, r.ComputedTokens)
	}
}
