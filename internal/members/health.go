package members

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"
)

// A backend's circuit breaker (see breaker) is fed by failures of proxied
// requests (connection errors, timeouts, 5xx, responses broken by the
// backend) and of active checks; while open the backend is out of the
// fleet's healthy set and the prefix index forgets it, so its sessions and
// prefixes move to other backends and nothing else moves; after the
// cool-down it goes half-open, where the next active check (or, without
// active checks, a few probe requests let back in) decides whether it
// closes or opens again with a longer cool-down.

// breakerConfig returns the breaker's settings from the health section.
func (s *Set) breakerConfig() breakerConfig {
	h := s.c.Health
	return breakerConfig{threshold: h.EjectAfter, cooldown: h.Cooldown, maxCooldown: h.MaxCooldown, probes: h.HalfOpenProbes}
}

// Succeeded records a successful proxied request (check false) or active
// check (check true).
func (s *Set) Succeeded(m *Member, check bool) {
	if m == nil || m.quiet.Load() {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	s.apply(m, m.br.success(time.Now(), s.breakerConfig(), check), nil)
}

// Failed records a failure of m's backend: a connection error, a timeout,
// a 5xx, or a response broken by the backend. Client cancellations are not
// failures.
func (s *Set) Failed(m *Member, err error) {
	if m == nil || errors.Is(err, context.Canceled) {
		return
	}
	if m.upstreamErrors != nil {
		m.upstreamErrors.Inc()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	s.apply(m, m.br.failure(time.Now(), s.breakerConfig(), silent(err)), err)
}

// Allow reports whether a request may be sent to m now: always while its
// breaker is closed, a few probes while half-open.
func (s *Set) Allow(m *Member) bool {
	if m == nil || !m.notClosed.Load() {
		return true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.br.allow(time.Now(), s.breakerConfig())
}

// expire ends an open breaker's cool-down; its timer calls it.
func (s *Set) expire(m *Member) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s.apply(m, m.br.expire(time.Now()), nil)
}

// apply carries a breaker transition over to the fleet, the prefix index,
// metrics and logs. The caller holds m.mu, so that transitions reach the
// fleet in the order they happened.
func (s *Set) apply(m *Member, t transition, err error) {
	b := m.B
	m.quiet.Store(m.br.state == breakerClosed && m.br.fails == 0)
	m.notClosed.Store(m.br.state != breakerClosed)
	switch t {
	case toOpen:
		s.c.Fleet.SetHealthy(b, false)
		if m.br.silent {
			// Stuck: what waits there for a first byte goes elsewhere.
			s.c.Fleet.Hung(b)
		}
		// An engine that fails this way has usually restarted or crashed,
		// and its prefix cache with it: forget what it held, so that its
		// conversations go where their prefix now is, and when it comes
		// back it is routed to by load until its cache is rebuilt.
		s.c.Forget(b.ID)
		if m.ejections != nil {
			m.ejections.Inc()
		}
		wait := max(time.Until(m.br.until), 0)
		if m.timer != nil {
			m.timer.Stop()
		}
		m.timer = time.AfterFunc(wait, func() { s.expire(m) })
		s.c.Log.Warn("backend breaker open", "backend", b.Name, "cooldown", m.br.cooldown, "err", err)
	case toHalfOpen:
		if s.c.Health.Path != "" {
			// The active check is the probe: a backend whose health
			// endpoint still fails gets no request, and the next check
			// closes the breaker or opens it again. After timeouts the
			// check is a one-token completion (generate).
			s.c.Log.Info("backend breaker half-open, probing with the active check", "backend", b.Name)
			break
		}
		s.c.Fleet.SetHealthy(b, true)
		s.c.Log.Info("backend breaker half-open, probing with requests", "backend", b.Name)
	case toClosed:
		s.c.Fleet.SetHealthy(b, true)
		s.c.Log.Info("backend breaker closed", "backend", b.Name)
	}
}

// BreakerStatus is a breaker's state, for the admin API.
type BreakerStatus struct {
	// State is closed, open or half-open.
	State string
	// Open is true while the breaker is open, until OpenUntil.
	Open      bool
	Fails     int
	OpenUntil time.Time
}

// Breaker returns m's breaker state.
func (m *Member) Breaker() BreakerStatus {
	m.mu.Lock()
	defer m.mu.Unlock()
	return BreakerStatus{State: m.br.state.String(), Open: m.br.state == breakerOpen, Fails: m.br.fails, OpenUntil: m.br.until}
}

// startCheck starts m's active checker, if health.path is set; it stops
// when the set's context is done or its backend is retired. A backend is
// checked at once, then every health.interval. The caller holds mu.
func (s *Set) startCheck(m *Member) {
	if s.c.Health.Path == "" {
		return
	}
	ctx := s.ctx
	s.checks.Go(func() {
		t := time.NewTicker(s.c.Health.Interval)
		defer t.Stop()
		for !m.B.Retired() && s.Of(m.B) == m {
			generated, err := s.checkOnce(ctx, m)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				s.c.Log.Debug("health check failed", "backend", m.B.Name, "err", err)
				s.Failed(m, err)
			} else {
				// A completion that came back is a request's success:
				// it closes a breaker that timeouts opened.
				s.Succeeded(m, !generated)
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	})
}

// check does one active check of m.
func (s *Set) check(ctx context.Context, m *Member) error {
	ctx, cancel := context.WithTimeout(ctx, s.c.Health.Timeout)
	defer cancel()
	u := *m.B.URL
	u.Path += s.c.Health.Path
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	resp, err := s.c.Transport.RoundTrip(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return StatusError(resp.StatusCode)
	}
	return nil
}

// checkOnce does one active check of m: a one-token completion while
// timeouts hold its breaker open (generated), else, or when no completion
// can probe it, GET health.path.
func (s *Set) checkOnce(ctx context.Context, m *Member) (generated bool, err error) {
	if m.silenced() {
		if err := s.generate(ctx, m); !errors.Is(err, errNoModel) {
			return true, err
		}
	}
	return false, s.check(ctx, m)
}

// silenced reports whether m's breaker was opened by timeouts and is not
// closed: its active check must generate (a passing /health says nothing
// of an engine that keeps its connections and sends nothing).
func (m *Member) silenced() bool {
	if !m.notClosed.Load() {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.br.silent && m.br.state != breakerClosed
}

// errNoModel is a backend for which generate found no model to ask for.
var errNoModel = errors.New("no model to probe the backend with")

// generate checks m by a completion of one token, non-streamed, bounded by
// health.timeout: the check of a backend whose breaker timeouts opened.
// The model is the backend's first configured one, else the first its
// /v1/models lists; errNoModel when there is none, or when the backend
// refuses the request (a 4xx other than 429: the probe cannot be made
// there), and the caller checks /health instead.
func (s *Set) generate(ctx context.Context, m *Member) error {
	model := ""
	if len(m.B.Models) > 0 {
		model = m.B.Models[0]
	} else if l, err := s.FetchModels(ctx, m.B.URL); err != nil {
		return err
	} else if len(l.IDs) > 0 {
		model = l.IDs[0]
	}
	if model == "" {
		return errNoModel
	}
	body, err := json.Marshal(map[string]any{"model": model, "prompt": "ping", "max_tokens": 1, "stream": false})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, s.c.Health.Timeout)
	defer cancel()
	u := *m.B.URL
	u.Path += "/v1/completions"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.c.Transport.RoundTrip(req)
	if err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	switch {
	case resp.StatusCode/100 == 4 && resp.StatusCode != http.StatusTooManyRequests:
		s.c.Log.Warn("a one-token completion cannot probe the backend; its health endpoint does", "backend", m.B.Name, "model", model, "status", resp.StatusCode)
		return errNoModel
	case resp.StatusCode != http.StatusOK:
		return StatusError(resp.StatusCode)
	}
	return err
}

// StatusError is a backend's failing HTTP status.
type StatusError int

func (e StatusError) Error() string { return "status " + strconv.Itoa(int(e)) }

// silent reports whether err is a backend that kept the router waiting:
// a timeout (lifecycle.Timeout, no first token, a stream gone idle, or the
// transport's), not a refused or reset connection nor an error status. A
// breaker such a failure opens is probed with requests only: an engine
// stuck this way usually still answers its health endpoint.
func silent(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
