package proxy

import (
	"net/http"
	"time"

	"github.com/kvroute/kvroute/internal/admin"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/request"
)

// newAdmin builds the admin API and the decision log the proxy feeds. The
// API answers 404 everywhere unless a token is configured.
func (s *Server) newAdmin() (http.Handler, error) {
	token, err := s.cfg.Admin.ResolveToken()
	if err != nil {
		return nil, err
	}
	s.decisions = admin.NewLog(s.cfg.Admin.Decisions)
	if token != "" {
		s.log.Info("admin API enabled", "path", admin.Prefix)
	}
	return admin.New(token, adminSource{s}, s.decisions), nil
}

// record logs the settled routing decision of a scheduled request: its
// final backend and reason, how many retries it took, and the status the
// router saw. It reads the flight's view, never its body.
func (s *Server) record(fl *flight, status int) {
	if fl == nil || fl.view == nil || s.decisions == nil {
		return
	}
	d := admin.Decision{Time: fl.start, Model: fl.view.Model, Session: fl.view.SessionKey, Retries: fl.retries, Status: status}
	if fl.target != nil {
		d.Backend = fl.target.Name
	}
	if fl.a != nil {
		d.Reason = fl.a.Reason
	}
	s.decisions.Record(d)
}

// recordRejected logs a request the scheduler could not route.
func (s *Server) recordRejected(v *request.View, start time.Time, e *openai.Error) {
	if s.decisions == nil {
		return
	}
	s.decisions.Record(admin.Decision{Time: start, Model: v.Model, Session: v.SessionKey, Reason: e.Code, Status: e.Status})
}

// adminSource is the router state the admin API reads and changes.
type adminSource struct{ s *Server }

func (a adminSource) Backends() []admin.Backend {
	s := a.s
	now := time.Now()
	snap := s.fleet.Snapshot()
	out := make([]admin.Backend, 0, len(snap.All))
	for _, b := range snap.All {
		l := b.Load()
		st := s.breakerStatus(b)
		ab := admin.Backend{
			Name:     b.Name,
			Models:   b.Models,
			Healthy:  b.Healthy(),
			Draining: b.Draining(),
			Breaker:  admin.Breaker{State: st.state.String(), ConsecutiveFailures: st.fails},
			Load: admin.Load{InFlight: l.InFlight, PendingPrefillTokens: l.PendingPrefill, Decoding: l.Decoding,
				DecodeBudgetTokens: l.DecodeBudget, DecodeTokens: l.DecodeTokens},
			PrefillRate:  b.PrefillRate(),
			PrefixBlocks: s.sched.Index().Len(b.ID),
		}
		if b.URL != nil {
			ab.URL = b.URL.String()
		}
		if st.state == breakerOpen {
			u := st.until
			ab.Breaker.OpenUntil = &u
		}
		ab.RoutedPromptTokens, ab.PredictedCachedTokens = b.Routed()
		if e := b.Engine(); e != nil {
			ab.Engine = &admin.Engine{ReportedAt: e.At, AgeSeconds: now.Sub(e.At).Seconds(), Running: e.Running,
				Waiting: e.Waiting, KVUsage: e.KVUsage, KVBlocks: e.KVBlocks}
		}
		out = append(out, ab)
	}
	return out
}

func (a adminSource) Drain(name string) error {
	b := a.find(name)
	if b == nil {
		return admin.ErrUnknownBackend
	}
	a.s.fleet.Drain(b)
	a.s.log.Info("backend drained", "backend", name, "by", "admin")
	return nil
}

func (a adminSource) Undrain(name string) error {
	b := a.find(name)
	if b == nil {
		return admin.ErrUnknownBackend
	}
	if !a.s.fleet.Undrain(b) {
		return admin.ErrRemoving
	}
	a.s.log.Info("backend undrained", "backend", name, "by", "admin")
	return nil
}

func (a adminSource) find(name string) *fleet.Backend {
	for _, b := range a.s.fleet.Snapshot().All {
		if b.Name == name {
			return b
		}
	}
	return nil
}

var _ admin.Source = adminSource{}
