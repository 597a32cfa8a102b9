package proxy

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/admission"
	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/openai"
)

// newAdmission builds the admission queue from the admission section, or
// returns nil when no limit is set: a nil controller admits everything at
// the cost of a nil check.
func newAdmission(cfg *config.Config, f *fleet.Fleet, reg prometheus.Registerer) (*admission.Controller, error) {
	a := cfg.Admission
	if !a.Enabled() {
		return nil, nil
	}
	lim := admission.Limits{
		MaxInFlight:       int64(a.MaxInFlightPerBackend),
		MaxPendingPrefill: a.MaxPendingPrefillTokensPerBackend,
		MaxEngineWaiting:  a.MaxEngineWaiting,
		// An engine's queue counts as long as the engine reader itself
		// trusts the report.
		EngineMaxAge: cfg.Engines.Interval * time.Duration(cfg.Engines.StaleAfter),
	}
	return admission.New(admission.Config{MaxQueue: a.MaxQueue, MaxWait: a.MaxWait}, lim.Saturated(f), reg)
}

// admit reads the request's priority and waits for admission. When it
// returns false the answer is written (400 for a bad priority, 429 from
// the queue) or the client is gone. Otherwise release must be called once
// the request is routed.
func (s *Server) admit(w http.ResponseWriter, r *http.Request, model string) (release func(), ok bool) {
	prio, perr := admission.ParsePriority(r.Header)
	if perr != nil {
		s.reject(w, perr)
		return nil, false
	}
	if s.adm == nil {
		return func() {}, true
	}
	release, err := s.adm.Admit(r.Context(), model, prio, admission.Tenant(r.Header, s.cfg.Admission.TenantHeader))
	if err != nil {
		if oe, isOE := errors.AsType[*openai.Error](err); isOE {
			s.reject(w, oe)
		} else {
			// The client left while queued: nobody to answer.
			s.metrics.requests.WithLabelValues(noBackend, s.policyName(), strconv.Itoa(statusClientGone)).Inc()
		}
		return nil, false
	}
	return release, true
}
