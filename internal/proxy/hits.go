package proxy

import (
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
)

// The limits a client can hit, as the limit label of
// kvroute_client_limit_hits_total.
const (
	limitConnections = "max_connections"           // the listener was full
	limitIdleClosed  = "idle_closed"               // an idle keep-alive connection was closed to make room
	limitHeaderBytes = "max_header_bytes"          // 431 from the HTTP server
	limitBodyTimeout = "body_timeout"              // 408: the whole body took too long
	limitBodyRate    = "min_body_rate"             // 408: the body came too slowly
	limitClientShare = "buffered_bytes_per_client" // 429: the client's share of the body budget was full
	limitLoop        = "loop"                      // 508: the request had already passed this router
)

// limitLogEvery is how often, at most, each limit is logged.
const limitLogEvery = 10 * time.Second

// limitHits counts the client limits hit (kvroute_client_limit_hits_total)
// and logs them, each limit at most once every limitLogEvery with the
// number of hits since its last line, so that a flood of hits cannot
// flood the log.
type limitHits struct {
	log    *slog.Logger
	limits map[string]*limitLog
}

// limitLog is one limit's counter and log throttle.
type limitLog struct {
	hits   prometheus.Counter
	every  rate.Sometimes
	unseen atomic.Int64
}

func newLimitHits(reg prometheus.Registerer, log *slog.Logger) *limitHits {
	counter := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvroute_client_limit_hits_total",
		Help: "Times a client hit one of the router's limits on connections, headers and bodies, by limit.",
	}, []string{"limit"})
	reg.MustRegister(counter)
	h := &limitHits{log: log, limits: map[string]*limitLog{}}
	for _, l := range []string{limitConnections, limitIdleClosed, limitHeaderBytes, limitBodyTimeout, limitBodyRate, limitClientShare, limitLoop} {
		// The child exists from the start: shown at 0 before the first hit.
		h.limits[l] = &limitLog{hits: counter.WithLabelValues(l), every: rate.Sometimes{Interval: limitLogEvery}}
	}
	return h
}

// hit counts one hit of limit by the client at remote ("" when unknown).
func (h *limitHits) hit(limit, remote string) {
	l := h.limits[limit]
	l.hits.Inc()
	l.unseen.Add(1)
	l.every.Do(func() {
		h.log.Warn("client limit hit", "limit", limit, "client", remote, "hits", l.unseen.Swap(0), "log_every", limitLogEvery)
	})
}
