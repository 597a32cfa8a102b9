package server

import (
	"time"

	"github.com/kvroute/kvroute/internal/admin"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/members"
	"github.com/kvroute/kvroute/internal/prefix"
)

// adminSource is the router state the admin API reads and changes.
type adminSource struct{ s *Server }

func (a adminSource) Backends() []admin.Backend {
	s := a.s
	now := time.Now()
	snap := s.fleet.Snapshot()
	out := make([]admin.Backend, 0, len(snap.All))
	for _, b := range snap.All {
		l := b.KnownLoad()
		var st members.BreakerStatus
		if m := s.set.Of(b); m != nil {
			st = m.Breaker()
		}
		ab := admin.Backend{
			Name:     b.Name,
			Models:   b.Models,
			Role:     s.set.RoleOf(b),
			Healthy:  b.Healthy(),
			Draining: b.Draining(),
			Breaker:  admin.Breaker{State: st.State, ConsecutiveFailures: st.Fails},
			Load: admin.Load{InFlight: l.InFlight, PendingPrefillTokens: l.PendingPrefill, Decoding: l.Decoding,
				DecodeBudgetTokens: l.DecodeBudget, DecodeTokens: l.DecodeTokens},
			PrefillRate:       b.PrefillRate(now),
			EnginePrefillRate: b.EnginePrefillRate(),
			PrefixBlocks:      s.sched.Index().Len(b.ID),
		}
		if b.URL != nil {
			ab.URL = b.URL.String()
		}
		if st.Open {
			u := st.OpenUntil
			ab.Breaker.OpenUntil = &u
		}
		ab.RoutedPromptTokens, ab.PredictedCachedTokens = b.Routed()
		ab.MaxNumSeqs, ab.MaxNumSeqsSource = b.SeqCap()
		ab.Cache = cacheAudit(s.sched.Audit().Backend(b.ID))
		if e := b.Engine(); e != nil {
			ab.Engine = &admin.Engine{ReportedAt: e.At, AgeSeconds: now.Sub(e.At).Seconds(), KVBlocks: e.KVBlocks}
			if e.Has(fleet.EngineRunning) {
				ab.Engine.Running = &e.Running
			}
			if e.Has(fleet.EngineWaiting) {
				ab.Engine.Waiting = &e.Waiting
			}
			if e.Has(fleet.EngineKVUsage) {
				ab.Engine.KVUsage = &e.KVUsage
			}
			if l := e.LoRA; l != nil {
				ab.Adapters = &admin.Adapters{Running: nonNil(l.Running), Waiting: nonNil(l.Waiting), Max: l.Max, Used: l.Used}
			}
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
	a.s.fleet.Drain(b, time.Now())
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
	if m := a.s.set.ByName(name); m != nil {
		return m.B
	}
	return nil
}

var _ admin.Source = adminSource{}

// cacheAudit is a backend's audit as the admin API shows it: its totals
// summed over the policies.
func cacheAudit(a prefix.BackendAudit) admin.CacheAudit {
	var t prefix.Totals
	for _, x := range a.Totals {
		t.Sum(x)
	}
	return admin.CacheAudit{AuditedPromptTokens: t.Prompt, PredictedCachedTokens: t.Predicted, ReportedCachedTokens: t.Reported,
		BestCachedTokens: t.Best, Trusted: !a.Untrusted, CapacityBlocks: a.Capacity, Actions: a.Actions}
}

// nonNil is names, or an empty list for JSON's [] rather than null.
func nonNil(names []string) []string {
	if names == nil {
		return []string{}
	}
	return names
}
