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

// backendHealth is one backend's circuit breaker (see breaker) and what
// applies its transitions. Failures of proxied requests (connection
// errors, timeouts, 5xx, responses broken by the backend) and of active
// checks open it; while open the backend is out of the fleet's healthy
// set and the prefix index forgets it, so its sessions and prefixes move
// to other backends and nothing else moves; after the cool-down it goes
// half-open, where the next active check (or, without active checks, a
// few probe requests let back in) decides whether it closes or opens
// again with a longer cool-down.
type backendHealth struct {
	b *fleet.Backend
	// quiet is set while the breaker is closed with no failure counted,
	// and notClosed while it is not closed: they let the hot path's
	// success and allow cost one atomic load.
	quiet, notClosed atomic.Bool
	mu               sync.Mutex // guards br and timer; held while a transition is applied
	br               breaker
	timer            *time.Timer
}

// breakerConfig returns the breaker's settings from the health section.
func (s *Server) breakerConfig() breakerConfig {
	h := s.cfg.Health
	return breakerConfig{threshold: h.EjectAfter, cooldown: h.Cooldown, maxCooldown: h.MaxCooldown, probes: h.HalfOpenProbes}
}

// healthOf returns b's breaker, or nil for a backend this server does not
// track.
func (s *Server) healthOf(b *fleet.Backend) *backendHealth {
	hs := s.healthTable()
	if b == nil || b.ID < 0 || b.ID >= len(hs) {
		return nil
	}
	return hs[b.ID]
}

// succeeded records a successful proxied request (check false) or active
// check (check true).
func (s *Server) succeeded(b *fleet.Backend, check bool) {
	h := s.healthOf(b)
	if h == nil || h.quiet.Load() {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	s.apply(h, h.br.success(time.Now(), s.breakerConfig(), check), nil)
}

// failure records a failure of backend b: a connection error, a timeout, a
// 5xx, or a response broken by the backend. Client cancellations are not
// failures.
func (s *Server) failure(b *fleet.Backend, err error) {
	if errors.Is(err, context.Canceled) {
		return
	}
	s.metrics.upstreamErrors.WithLabelValues(b.Name).Inc()
	h := s.healthOf(b)
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	s.apply(h, h.br.failure(time.Now(), s.breakerConfig()), err)
}

// allow reports whether a request may be sent to b now: always while its
// breaker is closed, a few probes while half-open.
func (s *Server) allow(b *fleet.Backend) bool {
	h := s.healthOf(b)
	if h == nil || !h.notClosed.Load() {
		return true
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.br.allow(time.Now(), s.breakerConfig())
}

// expire ends an open breaker's cool-down; its timer calls it.
func (s *Server) expire(h *backendHealth) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s.apply(h, h.br.expire(time.Now()), nil)
}

// apply carries a breaker transition over to the fleet, the prefix index,
// metrics and logs. The caller holds h.mu, so that transitions reach the
// fleet in the order they happened.
func (s *Server) apply(h *backendHealth, t transition, err error) {
	b := h.b
	h.quiet.Store(h.br.state == breakerClosed && h.br.fails == 0)
	h.notClosed.Store(h.br.state != breakerClosed)
	switch t {
	case toOpen:
		s.fleet.SetHealthy(b, false)
		// An engine that fails this way has usually restarted or crashed,
		// and its prefix cache with it: forget what it held, so that its
		// conversations go where their prefix now is, and when it comes
		// back it is routed to by load until its cache is rebuilt.
		s.sched.Index().RemoveBackend(b.ID)
		s.metrics.ejections.WithLabelValues(b.Name).Inc()
		wait := max(time.Until(h.br.until), 0)
		if h.timer != nil {
			h.timer.Stop()
		}
		h.timer = time.AfterFunc(wait, func() { s.expire(h) })
		s.log.Warn("backend breaker open", "backend", b.Name, "cooldown", h.br.cooldown, "err", err)
	case toHalfOpen:
		if s.cfg.Health.Path != "" {
			// The active check is the probe: a backend whose health
			// endpoint still fails gets no request, and the next check
			// closes the breaker or opens it again.
			s.log.Info("backend breaker half-open, probing with the active check", "backend", b.Name)
			break
		}
		s.fleet.SetHealthy(b, true)
		s.log.Info("backend breaker half-open, probing with requests", "backend", b.Name)
	case toClosed:
		s.fleet.SetHealthy(b, true)
		s.log.Info("backend breaker closed", "backend", b.Name)
	}
}

// breakerStatus is a breaker's state for the admin API.
type breakerStatus struct {
	state breakerState
	fails int
	until time.Time
}

func (s *Server) breakerStatus(b *fleet.Backend) breakerStatus {
	h := s.healthOf(b)
	if h == nil {
		return breakerStatus{}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return breakerStatus{state: h.br.state, fails: h.br.fails, until: h.br.until}
}

// stopBreakers stops the cool-down timers (at shutdown).
func (s *Server) stopBreakers() {
	for _, h := range s.healthTable() {
		if h == nil {
			continue
		}
		h.mu.Lock()
		if h.timer != nil {
			h.timer.Stop()
		}
		h.mu.Unlock()
	}
}

// startHealthChecks starts one active checker per backend; they stop when
// ctx is done. A backend is checked at once, then every health.interval.
// A check's outcome feeds the backend's breaker like a request's.
func (s *Server) startHealthChecks(ctx context.Context) {
	for _, h := range s.healthTable() {
		if h == nil {
			continue
		}
		s.startCheck(ctx, h)
	}
}

// startCheck starts h's active checker; it stops when ctx is done or its
// backend is retired.
func (s *Server) startCheck(ctx context.Context, h *backendHealth) {
	if s.cfg.Health.Path == "" {
		return
	}
	s.checks.Add(1)
	go func() {
		defer s.checks.Done()
		t := time.NewTicker(s.cfg.Health.Interval)
		defer t.Stop()
		for !h.b.Retired() {
			if err := s.check(ctx, h.b); err != nil {
				if ctx.Err() != nil {
					return
				}
				s.log.Debug("health check failed", "backend", h.b.Name, "err", err)
				s.failure(h.b, err)
			} else {
				s.succeeded(h.b, true)
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
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
