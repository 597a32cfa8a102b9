package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
)

// backendHealth counts one backend's consecutive failures. A backend is
// ejected (marked unhealthy in the fleet) after health.eject_after of them,
// whether they come from proxied requests (connection errors, 5xx) or from
// active checks, and only an active check brings it back.
type backendHealth struct {
	b     *fleet.Backend
	fails atomic.Int64
	mu    sync.Mutex // serialises ejection and recovery
}

// ok records a successful proxied request. It is on the hot path, so it
// writes only when there is something to reset.
func (h *backendHealth) ok() {
	if h.fails.Load() != 0 {
		h.fails.Store(0)
	}
}

// failure records a failure of backend b: a connection error, a 5xx, or a
// response broken by the backend. Client cancellations are not failures.
func (s *Server) failure(b *fleet.Backend, err error) {
	if errors.Is(err, context.Canceled) {
		return
	}
	s.metrics.upstreamErrors.WithLabelValues(b.Name).Inc()
	if s.cfg.Health.Path == "" {
		// Without active checks nothing could bring an ejected backend
		// back, so passive ejection is off too.
		return
	}
	h := s.health[b.ID]
	n := h.fails.Add(1)
	if n < int64(s.cfg.Health.EjectAfter) {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !b.Healthy() {
		return
	}
	s.fleet.SetHealthy(b, false)
	// An engine that fails this way has usually restarted or crashed, and
	// its prefix cache with it; when it comes back, route to it by load
	// until its cache is rebuilt rather than by a stale picture.
	s.sched.Index().RemoveBackend(b.ID)
	s.metrics.ejections.WithLabelValues(b.Name).Inc()
	s.log.Warn("backend ejected", "backend", b.Name, "consecutive_failures", n, "err", err)
}

// recovered records a successful active check.
func (s *Server) recovered(b *fleet.Backend) {
	h := s.health[b.ID]
	h.fails.Store(0)
	if b.Healthy() {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !b.Healthy() {
		s.fleet.SetHealthy(b, true)
		s.log.Info("backend healthy", "backend", b.Name)
	}
}

// startHealthChecks starts one active checker per backend; they stop when
// ctx is done. A backend is checked at once, then every health.interval.
func (s *Server) startHealthChecks(ctx context.Context) {
	if s.cfg.Health.Path == "" {
		return
	}
	for _, h := range s.health {
		s.checks.Add(1)
		go func() {
			defer s.checks.Done()
			t := time.NewTicker(s.cfg.Health.Interval)
			defer t.Stop()
			for {
				if err := s.check(ctx, h.b); err != nil {
					if ctx.Err() != nil {
						return
					}
					s.log.Debug("health check failed", "backend", h.b.Name, "err", err)
					s.failure(h.b, err)
				} else {
					s.recovered(h.b)
				}
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
			}
		}()
	}
}

// check does one active check of b.
func (s *Server) check(ctx context.Context, b *fleet.Backend) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Health.Timeout)
	defer cancel()
	u := *b.URL
	u.Path += s.cfg.Health.Path
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	resp, err := s.upstream.RoundTrip(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return errStatus(resp.StatusCode)
	}
	return nil
}
