package proxy

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/internal/members"
	"github.com/kvroute/kvroute/internal/prefix"
)

// streamMetrics count what the backends' KV event subscribers saw.
type streamMetrics struct {
	received                 *prometheus.CounterVec // backend, type
	decodeErrors, gaps       *prometheus.CounterVec // backend
	replays                  *prometheus.CounterVec // backend, outcome
	stale, reconnects, fails *prometheus.CounterVec // backend
	refused                  *prometheus.CounterVec // backend
}

func newStreamMetrics(reg *prometheus.Registry) *streamMetrics {
	c := func(name, help string, labels ...string) *prometheus.CounterVec {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, append([]string{"backend"}, labels...))
		reg.MustRegister(v)
		return v
	}
	return &streamMetrics{
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

// kvStream follows one backend's KV event stream (members.Stream) into the
// precise index until ctx ends, then forgets the backend's entries.
func (s *Server) kvStream(ctx context.Context, m *members.Member, endpoint, replay string, bind bool) {
	ix := s.sched.Precise()
	defer ix.Forget(m.B.ID)
	h := &streamHandler{ix: ix, id: m.B.ID, name: m.B.Name, m: s.streamMetrics, first: true}
	logRefused := &rate.Sometimes{Interval: time.Second}
	cfg := kvevents.SubscriberConfig{Endpoint: endpoint, Bind: bind, ReplayEndpoint: replay, StaleAfter: s.cfg.KVEvents.StaleAfter,
		MaxMessageBytes: int(s.cfg.KVEvents.MaxMessageBytes),
		Refused: func(err error) {
			// Counted each time (kvroute_kv_refused_total), logged at most
			// once a second: a client of a bound endpoint can reconnect
			// as fast as it likes.
			logRefused.Do(func() {
				s.log.Warn("kv events: connection closed; more may follow unlogged (kvroute_kv_refused_total)", "backend", m.B.Name, "err", err)
			})
		}}
	s.log.Info("kv events: subscribing", "backend", m.B.Name, "endpoint", endpoint, "replay", replay, "bind", bind)
	if err := kvevents.Subscribe(ctx, cfg, h); err != nil {
		s.streamMetrics.fails.WithLabelValues(m.B.Name).Inc()
		s.log.Error("kv events: stream cannot run; the backend is routed approximately", "backend", m.B.Name, "err", err)
	}
}

// streamHandler applies one backend's stream to the precise index
// (kvevents.Handler; called from the subscriber's goroutine only).
type streamHandler struct {
	ix   *prefix.Precise
	id   int
	name string
	m    *streamMetrics
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
	h.first, h.restarted = false, false
	for i := range b.Events {
		h.m.received.WithLabelValues(h.name, b.Events[i].Kind.String()).Inc()
	}
	h.ix.Apply(h.id, b.Events, now)
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

var _ kvevents.Handler = (*streamHandler)(nil)
