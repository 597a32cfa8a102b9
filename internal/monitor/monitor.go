// Package monitor keeps the fleet's picture of each engine's own load fresh:
// it scrapes every backend's /metrics (and llama.cpp's /slots) on an
// interval, parses the exposition with package adapter, and teaches the
// reading to the backend with fleet.Backend.Learn (which the simulator
// calls with its engine model's readings too). From vLLM's
// cache_config_info it also derives the backend's prefix index capacity and
// hands it to a callback.
//
// It owns the scrape loops, their timing, timeouts and body limits, the
// staleness rule and the scrape logs and metrics. It must not parse
// expositions itself (that is package adapter), route, or touch the prefix
// index directly (it knows the scheduler only through the capacity
// callback).
//
// Staleness: a reading carries the time it was taken (EngineState.At). A
// failed scrape leaves the last reading and its At untouched, so it ages;
// once it is older than StaleAfter intervals the monitor withdraws it
// (SetEngine(nil)), so that every consumer, including those that only test
// Engine() for nil, stops trusting it. The kvroute policy additionally
// ignores readings older than policy.EngineStateMaxAge, whichever is sooner.
// A scrape answered later than Config.LateAfter counts as a failure of that
// kind: its reading is dropped, not stored as fresh. A field the engine does
// not expose is marked missing in EngineState, never stored as 0.
package monitor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/adapter"
	"github.com/kvroute/kvroute/internal/fleet"
)

// Defaults of Config.
const (
	// DefaultInterval is the time between two scrapes of one backend: a
	// queue of engine steps of tens of milliseconds moves visibly in a
	// quarter second, and four small GETs a second cost an engine nothing.
	DefaultInterval = 250 * time.Millisecond
	// DefaultTimeout bounds one scrape (connection, headers and body).
	DefaultTimeout = time.Second
	// DefaultStaleAfter is how many intervals a reading stays trusted
	// without a successful scrape: one or two lost scrapes are noise, four
	// (a second at the default interval) mean the engine is not answering.
	DefaultStaleAfter = 4
	// DefaultMaxBodyBytes bounds a /metrics or /slots body. vLLM's
	// exposition with its histograms is tens of kilobytes per model.
	DefaultMaxBodyBytes = 8 << 20
	// LogEvery bounds the scrape warnings of one backend to one per
	// LogEvery: a llama.cpp server answers /metrics and /slots only
	// between prefill batches, so under load its scrapes miss the timeout
	// every few seconds (30-61 times in a 3-minute run, each once a
	// warning), alternating with good ones.
	LogEvery = time.Minute
)

// Config tunes a Monitor. The zero value of each field means its default.
type Config struct {
	// Interval between two scrapes of one backend. Default DefaultInterval.
	Interval time.Duration
	// Timeout of one scrape. Default DefaultTimeout.
	Timeout time.Duration
	// StaleAfter is how many intervals a reading is kept without a
	// successful scrape before it is withdrawn. Default DefaultStaleAfter.
	StaleAfter int
	// KindOf returns the configured engine kind of a backend, or Unknown
	// to detect it from what /metrics exposes; nil detects every kind. It
	// is asked once, when the backend's scraping starts, so backends added
	// while serving (reload, DNS) get their configured kind too.
	KindOf func(b *fleet.Backend) adapter.Kind
	// SetCapacity, when set, receives a backend's KV cache capacity in
	// tokens (num_gpu_blocks x block_size) whenever the engine reports a
	// new value. The proxy passes scheduler.SetKVCapacity.
	SetCapacity func(backendID int, kvTokens int64)
	// MaxBodyBytes bounds a response body; a larger one is a failed
	// scrape. Default DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// LateAfter is how long a scrape may take and its reading still
	// count. A later one is dropped (counted in
	// kvroute_engine_scrape_late_total, the last reading ages as on a
	// failure): an engine that answers only between batches of work
	// answers late exactly when it is busy, and its reading, taken at the
	// idle moment it found, would paint a busy engine idle. Default half
	// the Timeout.
	LateAfter time.Duration
	// SetContext, when set, receives a backend's context length per
	// request in tokens as the engine reports it (llama.cpp's /slots
	// n_ctx) whenever it changes. The proxy hands it to the backend's
	// members record.
	SetContext func(b *fleet.Backend, tokens int)
}

func (c Config) withDefaults() Config {
	if c.Interval <= 0 {
		c.Interval = DefaultInterval
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.StaleAfter <= 0 {
		c.StaleAfter = DefaultStaleAfter
	}
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.LateAfter <= 0 {
		c.LateAfter = c.Timeout / 2
	}
	return c
}

// StaleAge is how old a reading may grow without a successful scrape before
// the monitor withdraws it.
func (c Config) StaleAge() time.Duration {
	c = c.withDefaults()
	return time.Duration(c.StaleAfter) * c.Interval
}

// Monitor scrapes the engines of a fleet. Create it with New and start it
// with Run; it is also a prometheus.Collector of its scrape metrics.
type Monitor struct {
	fleet  *fleet.Fleet
	cfg    Config
	client *http.Client
	log    *slog.Logger

	mu       sync.Mutex
	watchers map[*fleet.Backend]*watcher
}

// watcher is one backend's scrape loop state. Only its loop goroutine
// touches the unexported fields except errors, which Collect reads.
type watcher struct {
	b      *fleet.Backend
	kind   adapter.Kind // configured, or Unknown to detect
	cancel context.CancelFunc
	done   chan struct{}
	errors atomic.Uint64
	late   atomic.Uint64

	detected  adapter.Kind // latched after the first good scrape
	failures  int          // consecutive failed or late scrapes
	withdrawn bool         // the current outage withdrew the reading
	lastOK    time.Time
	capTokens int64 // last KV capacity passed to SetCapacity
	ctxTokens int   // last context length passed to SetContext
	seqCap    int   // last running-sequence cap logged
	// prefill and decode are the engine's prefill counters and its
	// inter-token latency counters at the start of the interval not yet
	// taught to the fleet.
	prefill, decode fleet.Counters
	// load is the engine's counters of its CPU tier's loads, likewise.
	load fleet.Counters
	// computed is the engine's count of prompt tokens computed at the
	// decode counters' last lesson, -1 for none (reading).
	computed float64
	// lastWarn is when a scrape warning was last logged, unlogged how
	// many failed or late scrapes went unlogged since (see LogEvery).
	lastWarn time.Time
	unlogged int
}

// New returns a monitor of f's backends. client may be nil (a client of
// its own is used); logger may be nil (logs are discarded).
func New(f *fleet.Fleet, cfg Config, client *http.Client, logger *slog.Logger) *Monitor {
	if client == nil {
		client = &http.Client{}
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Monitor{
		fleet:    f,
		cfg:      cfg.withDefaults(),
		client:   client,
		log:      logger,
		watchers: map[*fleet.Backend]*watcher{},
	}
}

// Run scrapes until ctx is done, then returns once every scrape loop has
// stopped. Every interval it re-reads the fleet's snapshot, starting a loop
// for each backend that appeared and stopping the loop of each that left.
// A backend without a URL (the simulator's) is not scraped. When a loop
// stops, its backend's engine state is withdrawn, since nothing will
// refresh it any more.
func (m *Monitor) Run(ctx context.Context) {
	t := time.NewTicker(m.cfg.Interval)
	defer t.Stop()
	for {
		m.sync(ctx)
		select {
		case <-ctx.Done():
			m.stopAll()
			return
		case <-t.C:
		}
	}
}

// sync starts and stops scrape loops to match the fleet's membership.
func (m *Monitor) sync(ctx context.Context) {
	snap := m.fleet.Snapshot()
	present := make(map[*fleet.Backend]bool, len(snap.All))
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, b := range snap.All {
		if b == nil || b.URL == nil {
			continue
		}
		present[b] = true
		if _, ok := m.watchers[b]; ok {
			continue
		}
		wctx, cancel := context.WithCancel(ctx)
		var kind adapter.Kind
		if m.cfg.KindOf != nil {
			kind = m.cfg.KindOf(b)
		}
		w := &watcher{b: b, kind: kind, cancel: cancel, done: make(chan struct{}), computed: -1}
		m.watchers[b] = w
		go m.loop(wctx, w)
	}
	for b, w := range m.watchers {
		if !present[b] {
			w.cancel()
			<-w.done
			delete(m.watchers, b)
		}
	}
}

func (m *Monitor) stopAll() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, w := range m.watchers {
		w.cancel()
	}
	for b, w := range m.watchers {
		<-w.done
		delete(m.watchers, b)
	}
}

// jitter is the random delay before a loop's first scrape, so that the
// scrapes of a large fleet spread over the interval instead of arriving
// together. Stubbed in tests.
var jitter = func(d time.Duration) time.Duration { return rand.N(d) }

// loop scrapes one backend every interval until ctx is done.
func (m *Monitor) loop(ctx context.Context, w *watcher) {
	defer close(w.done)
	defer w.b.SetEngine(nil)
	if w.kind != adapter.Unknown {
		m.log.Info("engine kind configured", "backend", w.b.Name, "kind", string(w.kind))
	}
	select {
	case <-ctx.Done():
		return
	case <-time.After(jitter(m.cfg.Interval)):
	}
	t := time.NewTicker(m.cfg.Interval)
	defer t.Stop()
	for {
		m.scrapeOnce(ctx, w)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// scrapeOnce takes one reading of w's backend and publishes it, or, on
// failure, ages the last one and withdraws it once stale.
func (m *Monitor) scrapeOnce(ctx context.Context, w *watcher) {
	sctx, cancel := context.WithTimeout(ctx, m.cfg.Timeout)
	sent := time.Now()
	st, err := m.read(sctx, w)
	cancel()
	if ctx.Err() != nil {
		return // shutting down: not the engine's failure
	}
	now := time.Now()
	if err == nil && now.Sub(sent) > m.cfg.LateAfter {
		w.late.Add(1)
		err = fmt.Errorf("scrape %s: answered after %v, later than %v: reading dropped",
			w.b.Name, now.Sub(sent).Round(time.Millisecond), m.cfg.LateAfter)
	} else if err != nil {
		w.errors.Add(1)
	}
	if err != nil {
		w.failures++
		m.warn(w, now, err)
		if e := w.b.Engine(); e != nil && now.Sub(e.At) > m.cfg.StaleAge() {
			w.b.SetEngine(nil)
			w.withdrawn = true
		}
		return
	}
	if w.withdrawn || w.failures >= m.cfg.StaleAfter {
		// An outage long enough to withdraw the reading (by its age: on a
		// loaded machine fewer scrapes than StaleAfter may fail in that
		// time); a scrape or two missed now and then is not news.
		m.log.Info("engine scrape recovered", "backend", w.b.Name, "failures", w.failures,
			"last_ok", w.lastOK)
	}
	w.failures, w.withdrawn, w.lastOK = 0, false, now
	if st.ContextLen > 0 && st.ContextLen != w.ctxTokens && m.cfg.SetContext != nil {
		w.ctxTokens = st.ContextLen
		m.cfg.SetContext(w.b, st.ContextLen)
		m.log.Info("context length from engine", "backend", w.b.Name, "tokens", st.ContextLen)
	}

	if w.detected != st.Kind {
		if w.kind == adapter.Unknown {
			m.log.Info("engine kind detected", "backend", w.b.Name, "kind", string(st.Kind))
		}
		w.detected = st.Kind
	}
	// The capacity goes first, so that whoever sees this report also sees
	// the index sized by it; Learn publishes the report last.
	if st.BlockSize > 0 && st.NumGPUBlocks > 0 && m.cfg.SetCapacity != nil {
		tokens := int64(st.NumGPUBlocks) * int64(st.BlockSize)
		if tokens != w.capTokens {
			w.capTokens = tokens
			m.cfg.SetCapacity(w.b.ID, tokens)
			m.log.Info("prefix index capacity from engine", "backend", w.b.Name,
				"num_gpu_blocks", st.NumGPUBlocks, "block_size", st.BlockSize, "kv_tokens", tokens)
		}
	}
	w.b.Learn(w.reading(st, now))
	// The running-sequence cap: the engine's word (llama.cpp's slots),
	// else what its running and waiting counts taught (fleet.CapConfirmations).
	if c := w.b.Limits().MaxNumSeqs; c != w.seqCap {
		w.seqCap = c
		_, src := w.b.SeqCap()
		m.log.Info("running-sequence cap", "backend", w.b.Name, "max_num_seqs", c, "source", src)
	}
}

// reading is what reading st taken at now teaches w's backend
// (fleet.Backend.Learn): the report, the cap the engine reports, the
// prefill throughput its counters show (the tokens it computed over the
// time it spent prefilling since the last lesson, once that is at least
// fleet.MinRateWork tokens) and its time per output token (the growth of
// its inter-token latency's sum over that of its count since the last
// lesson, once at least one token came).
func (w *watcher) reading(st adapter.State, now time.Time) fleet.Reading {
	r := fleet.Reading{State: engineState(st, now), MaxNumSeqs: st.MaxNumSeqs}
	if dt, ds, ok := w.prefill.Take(st.PrefillTokens, st.PrefillSeconds, fleet.MinRateWork); ok {
		r.PrefillTokens, r.PrefillSeconds = dt, ds
	}
	if dt, ds, ok := w.load.Take(st.HostLoadTokens, st.HostLoadSeconds, fleet.MinLoadTokens); ok {
		r.HostLoadTokens, r.HostLoadSeconds = dt, ds
	}
	before := w.decode
	dt, ds, ok := w.decode.Take(st.DecodeTokens, st.DecodeSeconds, 1)
	if ok {
		r.DecodeTokens, r.DecodeSeconds = dt, ds
	}
	if w.decode != before {
		r.ComputedTokens = w.computedSince(st.ComputedTokens)
	}
	return r
}

// computedSince is the growth of the engine's count of prompt tokens
// computed, now total, since the decode counters' last lesson (or fresh
// start), which it marks: the prefill that ran in the steps the lesson's
// inter-token latency timed. -1 when the engine does not count them, on a
// first count and on a count that went back (a restart).
func (w *watcher) computedSince(total float64) float64 {
	last := w.computed
	w.computed = total
	if total < 0 || last < 0 || total < last {
		return -1
	}
	return total - last
}

// warn logs a failed or late scrape of w's backend: the first, then at
// most one per LogEvery with the count of those not logged since.
func (m *Monitor) warn(w *watcher, now time.Time, err error) {
	if !w.lastWarn.IsZero() && now.Sub(w.lastWarn) < LogEvery {
		w.unlogged++
		return
	}
	m.log.Warn("engine scrape failing", "backend", w.b.Name, "err", err, "unlogged", w.unlogged)
	w.lastWarn, w.unlogged = now, 0
}

// engineState is the fleet's form of reading st taken at now, with the KV
// capacity vLLM's cache_config_info gives (0 when unknown). A field the
// engine does not expose (-1) is marked missing, never read as 0: a
// llama.cpp server reports no KV usage, and 0 would read as an empty cache.
func engineState(st adapter.State, now time.Time) *fleet.EngineState {
	e := &fleet.EngineState{At: now, KVBlocks: max(st.NumGPUBlocks, 0), BlockSize: max(st.BlockSize, 0)}
	if st.Running < 0 {
		e.Missing |= fleet.EngineRunning
	}
	if st.Waiting < 0 {
		e.Missing |= fleet.EngineWaiting
	}
	if st.KVUsage < 0 {
		e.Missing |= fleet.EngineKVUsage
	}
	e.Running = int(max(st.Running, 0))
	e.Waiting = int(max(st.Waiting, 0))
	e.KVUsage = min(max(st.KVUsage, 0), 1)
	e.LoRA = st.LoRA
	return e
}

// read fetches and parses one reading. The kind parsed is the configured
// one, else the one detected before, else detection runs again.
//
// llama.cpp: /metrics exists only with --metrics and gives processing and
// deferred requests; /slots gives the busy slots. /slots is read when the
// metrics give no running count, or when /metrics fails on a backend that
// is, or may be, a llama.cpp server (a llama.cpp server without --metrics
// is detected by its /slots).
func (m *Monitor) read(ctx context.Context, w *watcher) (adapter.State, error) {
	kind := w.kind
	if kind == adapter.Unknown {
		kind = w.detected
	}
	body, err := m.get(ctx, w.b.URL, "/metrics")
	var st adapter.State
	if err == nil {
		st, err = adapter.ParseMetrics(bytes.NewReader(body), kind)
		if err != nil && w.kind == adapter.Unknown && kind != adapter.Unknown {
			// The engine behind the URL may have been replaced by another
			// kind: detect afresh.
			st, err = adapter.ParseMetrics(bytes.NewReader(body), adapter.Unknown)
		}
	}
	if err == nil && (st.Kind != adapter.LlamaCpp || st.Running >= 0) {
		return st, nil
	}
	if kind != adapter.Unknown && kind != adapter.LlamaCpp {
		return adapter.State{}, err
	}
	sbody, serr := m.get(ctx, w.b.URL, "/slots")
	if serr != nil {
		if err == nil {
			return st, nil // metrics without a running count still count
		}
		return adapter.State{}, errors.Join(err, serr)
	}
	slots, serr := adapter.ParseSlots(bytes.NewReader(sbody))
	if serr != nil {
		if err == nil {
			return st, nil
		}
		return adapter.State{}, errors.Join(err, serr)
	}
	if err != nil { // no usable metrics: the slots alone
		st = adapter.State{Kind: adapter.LlamaCpp, Waiting: -1, KVUsage: -1, PrefixHitRate: -1, BlockSize: -1, NumGPUBlocks: -1,
			PrefillTokens: -1, PrefillSeconds: -1, DecodeTokens: -1, DecodeSeconds: -1}
	}
	st.Running = float64(slots.Processing)
	st.ContextLen = slots.NCtx
	st.MaxNumSeqs = slots.Total
	return st, nil
}

// get fetches base+path and returns its body, refusing a non-200 status
// and a body over the limit.
func (m *Monitor) get(ctx context.Context, base *url.URL, path string) ([]byte, error) {
	u := base.JoinPath(path).String()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", u, err)
	}
	resp, err := m.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", u, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10)) // let the connection be reused
		return nil, fmt.Errorf("scrape %s: status %s", u, resp.Status)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, m.cfg.MaxBodyBytes+1))
	if err != nil {
		return nil, fmt.Errorf("scrape %s: read body: %w", u, err)
	}
	if int64(len(b)) > m.cfg.MaxBodyBytes {
		return nil, fmt.Errorf("scrape %s: body larger than %d bytes", u, m.cfg.MaxBodyBytes)
	}
	return b, nil
}

// The metrics the monitor exports.
var (
	descErrors = prometheus.NewDesc("kvroute_engine_scrape_errors_total",
		"Failed scrapes of a backend's engine metrics.", []string{"backend"}, nil)
	descLate = prometheus.NewDesc("kvroute_engine_scrape_late_total",
		"Scrapes of a backend's engine metrics answered too late to count (later than half the timeout by default), whose reading was dropped.", []string{"backend"}, nil)
	descWaiting = prometheus.NewDesc("kvroute_engine_waiting",
		"Requests waiting in the engine's queue, as it last reported (absent when stale or not reported).", []string{"backend"}, nil)
	descRunning = prometheus.NewDesc("kvroute_engine_running",
		"Requests running in the engine's batch, as it last reported (absent when stale or not reported).", []string{"backend"}, nil)
	descKVUsage = prometheus.NewDesc("kvroute_engine_kv_usage",
		"Engine KV cache usage 0..1, as it last reported (absent when stale or not reported).", []string{"backend"}, nil)
)

// Register registers the monitor's metrics on r.
func (m *Monitor) Register(r prometheus.Registerer) error {
	if err := r.Register(m); err != nil {
		return fmt.Errorf("register engine monitor metrics: %w", err)
	}
	return nil
}

// Describe implements prometheus.Collector.
func (m *Monitor) Describe(ch chan<- *prometheus.Desc) {
	ch <- descErrors
	ch <- descLate
	ch <- descWaiting
	ch <- descRunning
	ch <- descKVUsage
}

// Collect implements prometheus.Collector. The gauges are read off the
// fleet at collection time, so they show exactly what the policies see.
func (m *Monitor) Collect(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	defer m.mu.Unlock()
	bs := make([]*fleet.Backend, 0, len(m.watchers))
	for b := range m.watchers {
		bs = append(bs, b)
	}
	for _, b := range fleet.Named(bs) {
		w := m.watchers[b]
		ch <- prometheus.MustNewConstMetric(descErrors, prometheus.CounterValue, float64(w.errors.Load()), b.Name)
		ch <- prometheus.MustNewConstMetric(descLate, prometheus.CounterValue, float64(w.late.Load()), b.Name)
		e := b.Engine()
		if e == nil {
			continue
		}
		// A field the engine does not report has no series.
		if e.Has(fleet.EngineWaiting) {
			ch <- prometheus.MustNewConstMetric(descWaiting, prometheus.GaugeValue, float64(e.Waiting), b.Name)
		}
		if e.Has(fleet.EngineRunning) {
			ch <- prometheus.MustNewConstMetric(descRunning, prometheus.GaugeValue, float64(e.Running), b.Name)
		}
		if e.Has(fleet.EngineKVUsage) {
			ch <- prometheus.MustNewConstMetric(descKVUsage, prometheus.GaugeValue, e.KVUsage, b.Name)
		}
	}
}

var _ prometheus.Collector = (*Monitor)(nil)
