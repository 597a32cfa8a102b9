package server

import (
	"context"
	"net"
	"net/http"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/monitor"
)

// newMonitor builds the scraper of the engines' own metrics (engines.*
// keys) and registers its metrics; with engines.enabled off it does
// nothing.
func (s *Server) newMonitor() error {
	ec := s.cfg.Engines
	if !ec.Enabled {
		return nil
	}
	// Scrapes get a transport of their own: a few idle connections per
	// engine, so that they neither wait behind nor hold proxied traffic's.
	s.scrapes = &http.Transport{
		DialContext:         (&net.Dialer{Timeout: s.cfg.Upstream.ConnectTimeout, KeepAlive: 30 * time.Second}).DialContext,
		DialTLSContext:      s.dialBackendTLS,
		MaxIdleConnsPerHost: 2,
		IdleConnTimeout:     time.Minute,
	}
	client := &http.Client{Transport: s.scrapes}
	s.monitor = monitor.New(s.fleet, monitor.Config{
		Interval:    ec.Interval,
		Timeout:     ec.Timeout,
		StaleAfter:  ec.StaleAfter,
		KindOf:      s.set.KindOf,
		SetCapacity: s.sched.SetKVCapacity,
		SetContext: func(b *fleet.Backend, tokens int) {
			if m := s.set.Of(b); m != nil {
				m.SetReportedContext(tokens)
			}
		},
	}, client, s.log)
	return s.monitor.Register(s.metrics.Registry())
}

// startMonitor runs the scraper until ctx is done; Shutdown waits for it
// with the health checks.
func (s *Server) startMonitor(ctx context.Context) {
	if s.monitor == nil {
		return
	}
	s.checks.Add(1)
	go func() {
		defer s.checks.Done()
		s.monitor.Run(ctx)
	}()
}
