package proxy

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/lifecycle"
	"github.com/kvroute/kvroute/internal/migrate"
)

// A stream whose engine fails after its first byte is moved to another
// engine rather than ended with the error event of streamerr.go, when the
// request can be continued exactly (migrate.Check) and migration is on:
// the relay reads the engine's stream through a migrate.Stream, and on a
// break (a connection reset, a broken body, an error event, the stream
// idle timeout) the mover builds the continuation (migrate.Continuation),
// has the lifecycle route and send it (lifecycle.Plane.Continue) and
// swaps the new engine's stream in. Only when it cannot (the request or
// the answer cannot be continued, no backend, every attempt failed) does
// the stream end with the error event, as before.

// mover moves one relayed stream between engines.
type mover struct {
	ex *exchange
	s  *migrate.Stream
	// spent are the attempts at moving the stream counted against
	// migration.max_attempts; trail what the access log says of its
	// moves ("a->b (broken)").
	spent int
	trail []string
	// broke is the last token before the last move, zero when no move
	// is under way; chunks the token chunks relayed then. The move's gap
	// ends at the new stream's first token.
	broke  time.Time
	chunks int
	// grace is fleet.drain_grace.
	grace time.Duration
}

// drained reports whether the stream's engine has been draining for
// fleet.drain_grace (counted from the drain's start, the clock the
// requests re-sent from it read too): the stream is moved rather than
// read on. One atomic load a read while the engine is not draining.
func (m *mover) drained() bool {
	since, ok := m.ex.Leg().Target.B.DrainingSince()
	return ok && time.Since(since) >= m.grace
}

// moverFor arms resp's body for moving when the request allows it: a
// completion's 2xx event stream of one leg, migration on, a body
// migrate.Check accepts. nil otherwise.
func (ex *exchange) moverFor(resp *http.Response) *mover {
	c := ex.s.cfg.Migration
	if c.MaxAttempts <= 0 || ex.Passthrough || ex.View == nil || len(ex.Legs) != 1 ||
		resp.StatusCode != http.StatusOK || !isSSE(resp.Header.Get("Content-Type")) ||
		migrate.Check(ex.View, ex.Body) != nil {
		return nil
	}
	return &mover{ex: ex, grace: ex.s.cfg.Fleet.DrainGrace}
}

// stream reads body (head and headErr already read) through the mover's
// migrate.Stream.
func (m *mover) stream(head []byte, headErr error, body io.ReadCloser) io.ReadCloser {
	m.s = migrate.NewStream(head, headErr, body)
	return m.s
}

// move continues the relayed stream, which broke with cause, on another
// engine. It returns nil when the stream goes on (the next read is the
// new engine's, or the end of an answer that was whole), else the error
// the stream ends with.
func (t *relay) move(cause error) error {
	m := t.mover
	ex := m.ex
	metrics := &ex.s.metrics.mig
	reason := moveReason(cause)
	if m.s.Finished() {
		// The answer is whole; only its end is missing.
		m.s.End()
		metrics.moves.WithLabelValues(reason, "finished").Inc()
		return nil
	}
	if err := m.s.Refused(); err != nil {
		metrics.moves.WithLabelValues(reason, "refused").Inc()
		return cause
	}
	cfg := ex.s.cfg.Migration
	// A drain's move is planned (a rolling restart may move a stream once
	// for each engine it restarts): its first attempt is not counted.
	free := reason == "drain"
	for free || m.spent < cfg.MaxAttempts {
		if !free {
			m.spent++
		}
		free = false
		body, v, err := migrate.Continuation(ex.View, ex.Body, m.s.Text(), m.s.Tokens(), ex.s.parse)
		if err == nil && cfg.MaxContextTokens > 0 && v.PromptTokens > cfg.MaxContextTokens {
			err = errTooLong
		}
		if err != nil {
			ex.s.log.Warn("stream not moved", "request_id", ex.ID, "err", err, "cause", cause)
			metrics.moves.WithLabelValues(reason, "refused").Inc()
			return cause
		}
		// The attempt whose stream broke ends in the trace with its
		// cause; the continuation's is an attempt of its own.
		ex.AttemptFailed(cause)
		judged := cause
		if reason == "drain" {
			judged = nil // the router cut it: nothing to hold against the engine
		}
		c, err := ex.s.plane.Continue(&ex.Request, body, v, judged)
		ex.moved(c, err)
		if err != nil {
			metrics.moves.WithLabelValues(reason, "failed").Inc()
			if errors.Is(err, lifecycle.ErrNotMoved) || t.ctx.Err() != nil {
				return cause // nowhere to go, or nobody to go for
			}
			continue
		}
		metrics.moves.WithLabelValues(reason, "moved").Inc()
		metrics.prefill.Add(float64(c.Uncached))
		m.trail = append(m.trail, c.From+"->"+c.To+" ("+reason+")")
		// The client's wait runs from the last token it had; the gap is
		// not an inter-token latency of either engine.
		m.broke, m.chunks = t.tally.Resume(ex.Leg().Target.ITL(ex.Model)), t.tally.Chunks()
		if m.broke.IsZero() {
			m.broke = time.Now()
		}
		m.s.Swap(c.Head, c.HeadErr, c.Resp.Body)
		return nil
	}
	return cause
}

// moveReason is the label of why a stream broke.
func moveReason(cause error) string {
	switch {
	case errors.Is(cause, errStreamIdle):
		return "idle"
	case errors.Is(cause, migrate.ErrEngineError):
		return "engine_error"
	case errors.Is(cause, errDrained):
		return "drain"
	}
	return "broken"
}

var (
	errTooLong = errors.New("the continuation is longer than migration.max_context_tokens")
	// errDrained is a stream cut because its engine was drained past
	// its grace.
	errDrained = errors.New("the engine was drained")
)

// migrationMetrics are the moves' families.
type migrationMetrics struct {
	moves   *prometheus.CounterVec
	prefill prometheus.Counter
	gap     prometheus.Histogram
}

func newMigrationMetrics(reg *prometheus.Registry) migrationMetrics {
	m := migrationMetrics{
		moves: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_migrations_total",
			Help: "Streams whose engine failed after their first byte, by why (broken, idle, engine_error, drain) and what became of them: moved to another engine, failed (the continuation's attempt failed), refused (not continuable, or over migration.max_context_tokens), finished (the answer was whole; only its end was added).",
		}, []string{"reason", "outcome"}),
		prefill: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvroute_migration_prefill_tokens_total",
			Help: "Prompt tokens the moved streams' new engines were predicted to compute again (the continuation's prompt less what the engine held).",
		}),
		gap: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvroute_migration_gap_seconds",
			Help:    "Time a moved stream's client waited between its last token from the failed engine's stream and the first from the new one.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}),
	}
	// Every reason and outcome shows from the start, at 0.
	for _, reason := range []string{"broken", "idle", "engine_error", "drain"} {
		for _, outcome := range []string{"moved", "failed", "refused", "finished"} {
			m.moves.WithLabelValues(reason, outcome)
		}
	}
	reg.MustRegister(m.moves, m.prefill, m.gap)
	return m
}

// moved notes a move (or a failed attempt at one) in the exchange's
// trace.
func (ex *exchange) moved(c *lifecycle.Continued, err error) {
	if ex.span == nil {
		return
	}
	desc := "moved"
	if c != nil {
		desc = c.From + "->" + c.To
	}
	if err != nil {
		desc += ": " + err.Error()
	}
	ex.span.AddEvent("kvroute.stream_moved " + desc)
}

// trailOf is what the access log says of the stream's moves, "" for none.
func (m *mover) trailOf() string {
	if m == nil {
		return ""
	}
	return strings.Join(m.trail, ", ")
}

// noted observes the gap of a move under way once the new stream's first
// token was relayed (chunks token chunks so far, at now).
func (m *mover) noted(chunks int, now time.Time) {
	if m.broke.IsZero() || chunks <= m.chunks {
		return
	}
	m.ex.s.metrics.mig.gap.Observe(now.Sub(m.broke).Seconds())
	m.broke = time.Time{}
}
