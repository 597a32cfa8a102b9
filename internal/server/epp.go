package server

import (
	"context"
	"fmt"
	"net"

	"github.com/kvroute/kvroute/internal/epp"
)

// newEPP builds the Endpoint Picker when epp.listen is set: a front of
// the same lifecycle as the data plane's, sharing its plane, read,
// admission and split (the proxy is its epp.Router).
func (s *Server) newEPP() {
	if s.cfg.EPP.Listen == "" {
		return
	}
	s.epp = epp.New(epp.Parts{Config: s.cfg.EPP, MaxBody: int64(s.cfg.Limits.MaxBodyBytes), Router: s.proxy,
		Members: s.set, Log: s.log, Tracer: s.tracer, Ready: func() bool { return len(s.fleet.Snapshot().Healthy) > 0 }})
}

// listenEPP opens the picker's listeners (epp.listen and, when set,
// epp.health_listen); nil without the picker.
func (s *Server) listenEPP() (ln, health net.Listener, err error) {
	if s.epp == nil {
		return nil, nil, nil
	}
	if ln, err = net.Listen("tcp", s.cfg.EPP.Listen); err != nil {
		return nil, nil, fmt.Errorf("epp.listen: %w", err)
	}
	if a := s.cfg.EPP.HealthListen; a != "" {
		if health, err = net.Listen("tcp", a); err != nil {
			_ = ln.Close()
			return nil, nil, fmt.Errorf("epp.health_listen: %w", err)
		}
	}
	return ln, health, nil
}

// serveEPP serves the picker on its listeners, over TLS with listen_tls.
func (s *Server) serveEPP(ln, health net.Listener) {
	if s.epp == nil {
		return
	}
	s.eppAddr, s.eppHealthAddr = ln.Addr().String(), ""
	if health != nil {
		s.eppHealthAddr = health.Addr().String()
	}
	if s.cert.Load() != nil {
		s.epp.UseTLS(s.listenerTLS())
	}
	s.epp.Serve(ln, health)
}

// shutdownEPP stops the picker, its open streams given until ctx is done.
func (s *Server) shutdownEPP(ctx context.Context) {
	if s.epp != nil {
		s.epp.Shutdown(ctx)
	}
}

// EPPAddr returns the address epp.listen is bound to, and
// epp.health_listen's ("" without it), or "" before Start or without the
// picker.
func (s *Server) EPPAddr() (ext, health string) { return s.eppAddr, s.eppHealthAddr }

// killEPP ends the picker's streams at once, as a crash would.
func (s *Server) killEPP() {
	if s.epp != nil {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		s.epp.Shutdown(ctx)
	}
}
