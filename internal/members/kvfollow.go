package members

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/internal/prefix"
)

// KVFollower follows the backends' KV event streams into the precise
// index: its Follow is the Set's Stream (Config.KVStream), run on the
// member's own goroutine, one per backend with kv_events. It also exports
// the precise index's per-backend counters at scrape time.
type KVFollower struct {
	ix  *prefix.Precise
	cfg config.KVEvents
	log *slog.Logger
	m   *streamMetrics
}

// NewKVFollower returns the follower of f's backends' streams into ix,
// registering the streams' metrics and the index's in reg.
func NewKVFollower(f *fleet.Fleet, ix *prefix.Precise, c config.KVEvents, reg prometheus.Registerer, log *slog.Logger) *KVFollower {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	reg.MustRegister(&preciseCollector{f: f, ix: ix})
	return &KVFollower{ix: ix, cfg: c, log: log, m: newStreamMetrics(reg)}
}

// Families are the follower's per-backend families, whose series of a
// released backend go with its record (Series.Others).
func (k *KVFollower) Families() []Family {
	m := k.m
	return []Family{m.received, m.decodeErrors, m.gaps, m.replays, m.stale, m.reconnects, m.fails, m.refused, m.parity}
}

// streamMetrics count what the backends' KV event subscribers saw.
type streamMetrics struct {
	received                 *prometheus.CounterVec // backend, type
	decodeErrors, gaps       *prometheus.CounterVec // backend
	replays                  *prometheus.CounterVec // backend, outcome
	stale, reconnects, fails *prometheus.CounterVec // backend
	refused                  *prometheus.CounterVec // backend
	parity                   *prometheus.GaugeVec   // backend
}

func newStreamMetrics(reg prometheus.Registerer) *streamMetrics {
	c := func(name, help string, labels ...string) *prometheus.CounterVec {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, append([]string{"backend"}, labels...))
		reg.MustRegister(v)
		return v
	}
	parity := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kvroute_kv_hash_parity",
		Help: "1 when the hash-parity check found the router's block keys equal to the engine's for a known prompt, 0 when they differ (the log names the likely cause: block size, tokenizer, salt); absent until checked."},
		[]string{"backend"})
	reg.MustRegister(parity)
	return &streamMetrics{
		parity:       parity,
		received:     c("kvroute_kv_events_received_total", "KV cache events received from the backend's stream, by type.", "type"),
		decodeErrors: c("kvroute_kv_decode_errors_total", "Messages of the backend's KV event stream that were not well-formed batches (skipped)."),
		gaps:         c("kvroute_kv_gaps_total", "Jumps forward in the backend's KV event sequence numbers."),
		replays:      c("kvroute_kv_replays_total", "Replays of a gap from the backend's replay endpoint, by outcome: ok (filled), failed (the precise entries were dropped).", "outcome"),
		stale:        c("kvroute_kv_stale_total", "Times the backend's KV event stream was silent for kv_events.stale_after (routed approximately until its next event)."),
		reconnects:   c("kvroute_kv_reconnects_total", "Times the subscriber reopened its socket to the backend's KV event stream."),
		fails:        c("kvroute_kv_stream_errors_total", "KV event streams that could not run (an endpoint that cannot be bound)."),
		refused:      c("kvroute_kv_refused_total", "Connections to the backend's KV event endpoint closed for breaking its limits: a frame or message over kv_events.max_message_bytes, malformed ZMTP, a handshake not done in 10s."),
	}
}

// Follow follows m's KV event stream (a Stream) into the precise index
// until ctx ends, then forgets the backend's entries.
func (k *KVFollower) Follow(ctx context.Context, m *Member, endpoint, replay string, bind bool) {
	defer k.ix.Forget(m.B.ID)
	// The stream's trouble counters start at 0, so that a dashboard's
	// rate over them reads 0 on a healthy stream rather than no data.
	for _, v := range []*prometheus.CounterVec{k.m.decodeErrors, k.m.gaps, k.m.stale, k.m.reconnects, k.m.fails, k.m.refused} {
		v.WithLabelValues(m.B.Name)
	}
	h := k.handler(m.B)
	h.start = func() { k.startParity(ctx, h, m) }
	logRefused := &rate.Sometimes{Interval: time.Second}
	cfg := kvevents.SubscriberConfig{Endpoint: endpoint, Bind: bind, ReplayEndpoint: replay, StaleAfter: k.cfg.StaleAfter,
		MaxMessageBytes: int(k.cfg.MaxMessageBytes),
		Refused: func(err error) {
			// Counted each time (kvroute_kv_refused_total), logged at most
			// once a second: a client of a bound endpoint can reconnect
			// as fast as it likes.
			logRefused.Do(func() {
				k.log.Warn("kv events: connection closed; more may follow unlogged (kvroute_kv_refused_total)", "backend", m.B.Name, "err", err)
			})
		}}
	k.log.Info("kv events: subscribing", "backend", m.B.Name, "endpoint", endpoint, "replay", replay, "bind", bind)
	if err := kvevents.Subscribe(ctx, cfg, h); err != nil {
		k.m.fails.WithLabelValues(m.B.Name).Inc()
		k.log.Error("kv events: stream cannot run; the backend is routed approximately", "backend", m.B.Name, "err", err)
	}
}

// handler returns a new stream's handler for b.
func (k *KVFollower) handler(b *fleet.Backend) *streamHandler {
	return &streamHandler{ix: k.ix, k: k, id: b.ID, name: b.Name, models: b.Models, m: k.m, first: true}
}

// streamHandler applies one backend's stream to the precise index
// (kvevents.Handler; called from the subscriber's goroutine only).
type streamHandler struct {
	ix     *prefix.Precise
	k      *KVFollower
	id     int
	name   string
	models []string
	m      *streamMetrics
	// start begins a hash-parity check (parity.go), on the stream's first
	// batch and on the first after a restart; parity is the check.
	start  func()
	parity *parity
	// first: no batch since the stream began or was reset; restarted:
	// the reset was a restart (the engine's cache is empty).
	first, restarted bool
}

// Batch applies b. A stream's first batch with sequence 0 is the engine's
// first since it started, with an empty cache: trusted at once. Any other
// first batch joins a running engine (the index is then trusted after
// kv_events.retrust).
func (h *streamHandler) Batch(seq uint64, b kvevents.Batch) {
	now := time.Now()
	if h.first && (seq == 0 || h.restarted) {
		h.ix.Reset(h.id, true, now)
	}
	if h.first && h.start != nil {
		h.start()
	}
	h.first, h.restarted = false, false
	for i := range b.Events {
		h.m.received.WithLabelValues(h.name, b.Events[i].Kind.String()).Inc()
	}
	h.ix.Apply(h.id, b.Events, now)
	if h.parity != nil {
		h.k.observe(h, b.Events)
	}
}

// Reset drops the backend's entries after a gap replay could not fill
// (trusted again after kv_events.retrust) or a restart (trusted from the
// next batch), and marks a silent stream approximate until its next batch.
func (h *streamHandler) Reset(r kvevents.ResetReason) {
	now := time.Now()
	switch r {
	case kvevents.ResetGap:
		h.ix.Reset(h.id, false, now)
	case kvevents.ResetRestart:
		h.ix.Reset(h.id, true, now)
		h.first, h.restarted = true, true
	case kvevents.ResetStale:
		h.m.stale.WithLabelValues(h.name).Inc()
		h.ix.Silent(h.id)
	}
}

// Count counts the subscriber's occurrences.
func (h *streamHandler) Count(c kvevents.Counter) {
	switch c {
	case kvevents.DecodeErrors:
		h.m.decodeErrors.WithLabelValues(h.name).Inc()
	case kvevents.Gaps:
		h.m.gaps.WithLabelValues(h.name).Inc()
	case kvevents.Replays:
		h.m.replays.WithLabelValues(h.name, "ok").Inc()
	case kvevents.ReplayFailures:
		h.m.replays.WithLabelValues(h.name, "failed").Inc()
	case kvevents.Reconnects:
		h.m.reconnects.WithLabelValues(h.name).Inc()
	case kvevents.Refused:
		h.m.refused.WithLabelValues(h.name).Inc()
	}
}

// preciseCollector reads the precise index's per-backend counters at
// scrape time.
type preciseCollector struct {
	f  *fleet.Fleet
	ix *prefix.Precise
}

var (
	descKVBlocks = prometheus.NewDesc("kvroute_kv_blocks",
		"Blocks the backend's KV events say it holds, as the router's precise index keeps them.", []string{"backend"}, nil)
	descKVTrusted = prometheus.NewDesc("kvroute_kv_stream_trusted",
		"1 while the backend is routed on its KV events, 0 while it is routed approximately (no stream yet, a gap, a restart being re-learned, or stale).", []string{"backend"}, nil)
	descKVEvents = prometheus.NewDesc("kvroute_kv_events_applied_total",
		"KV cache events applied to the precise index, by type (BlockStored, BlockRemoved, AllBlocksCleared).", []string{"backend", "type"}, nil)
	descKVSkipped = prometheus.NewDesc("kvroute_kv_blocks_skipped_total",
		"Blocks or events the precise index skipped: orphan (parent unknown), block_size (another block size), unknown_removed (never seen stored).", []string{"backend", "reason"}, nil)
	descKVEvicted = prometheus.NewDesc("kvroute_kv_blocks_evicted_total",
		"Blocks dropped from the precise index for kv_events.max_blocks_per_backend.", []string{"backend"}, nil)
	descKVResets = prometheus.NewDesc("kvroute_kv_resets_total",
		"Times the backend's precise entries were dropped (a gap replay could not fill, an engine restart).", []string{"backend"}, nil)
)

func (c *preciseCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descKVBlocks, descKVTrusted, descKVEvents, descKVSkipped, descKVEvicted, descKVResets} {
		ch <- d
	}
}

func (c *preciseCollector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	for _, b := range fleet.Named(c.f.Snapshot().All) {
		st := c.ix.Stats(b.ID, now)
		trusted := 0.0
		if st.Trusted {
			trusted = 1
		}
		gauge(descKVBlocks, float64(st.Blocks), b.Name)
		gauge(descKVTrusted, trusted, b.Name)
		counter(descKVEvents, st.Stored, b.Name, "BlockStored")
		counter(descKVEvents, st.Removed, b.Name, "BlockRemoved")
		counter(descKVEvents, st.Cleared, b.Name, "AllBlocksCleared")
		counter(descKVSkipped, st.Orphans, b.Name, "orphan")
		counter(descKVSkipped, st.Mismatched, b.Name, "block_size")
		counter(descKVSkipped, st.UnknownRemoved, b.Name, "unknown_removed")
		counter(descKVEvicted, st.Evicted, b.Name)
		counter(descKVResets, st.Resets, b.Name)
	}
}

var (
	_ kvevents.Handler     = (*streamHandler)(nil)
	_ Stream               = (*KVFollower)(nil).Follow
	_ prometheus.Collector = (*preciseCollector)(nil)
)
