package proxy

import (
	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/disagg"
)

// split gives a completion its prefill and decode legs when the fleet had
// prefill engines (backends[].role) at startup (package disagg);
// otherwise it keeps its one leg.
func (s *Server) split(ex *exchange) {
	if s.splitProto == "" {
		return
	}
	if legs := disagg.Legs(ex.View, s.splitProto); legs != nil {
		ex.SetLegs(legs...)
	}
}

// bootstrap gives a routed SGLang request's legs their body (the prefill
// engine named in it); nothing for other requests.
func (s *Server) bootstrap(ex *exchange) {
	if s.splitProto == config.ProtocolSGLang {
		disagg.Bootstrap(ex.Legs, ex.Body, s.cfg.Disaggregation.BootstrapPort)
	}
}
