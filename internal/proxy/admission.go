package proxy

import (
	"errors"
	"net/http"
	"time"

	"github.com/kvroute/kvroute/internal/admission"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/request"
)

// admit reads the request's priority (from trusted sources only, see
// priorities) and waits for admission. cost returns the request's own work
// (admission.Cost; nil: none), by which the deadline order takes it; see
// costOf; a request with a TTFT objective by that (its deadline). On
// success release must be called once the request is routed. Otherwise the
// error is the answer: 400 for a trusted front's bad priority, 429 from the
// queue, or status 499 when the client left while queued.
func (s *Server) admit(r *http.Request, model string, cost func() time.Duration, objective time.Duration) (release func(), e *openai.Error) {
	prio, perr := s.creds.Load().prio.of(r)
	if perr != nil {
		return nil, perr
	}
	if e := s.awaitPeers(r.Context()); e != nil {
		return nil, e
	}
	if s.adm == nil {
		return func() {}, nil
	}
	release, err := s.adm.AdmitBy(r.Context(), model, prio, admission.Tenant(r.Header, s.cfg.Admission.TenantHeader), cost, objective)
	if err != nil {
		if oe, isOE := errors.AsType[*openai.Error](err); isOE {
			return nil, oe
		}
		return nil, &openai.Error{Status: statusClientGone, Code: "client_gone", Message: err.Error()}
	}
	return release, nil
}

// costOf returns the cost function admit takes for a request of view v
// whose prompt hashes to hashes: its uncached tokens at the fleet's best
// match (Scheduler.Uncached), as the simulator computes it.
func (s *Server) costOf(v *request.View, hashes []uint64) func() time.Duration {
	return func() time.Duration { return admission.Cost(s.sched.Uncached(v, hashes)) }
}
