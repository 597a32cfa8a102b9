package members

import (
	"context"
	"slices"

	"github.com/kvroute/kvroute/internal/adapter"
	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/discovery"
)

// KubeClients returns the API clients of a discovery: kubernetes entry
// from its kubeconfig path ("": in-cluster). Stubbed in tests with fake
// clientsets.
var KubeClients = discovery.KubeClients

// Roles a pod's kvroute.io/role label may give its backend.
var roles = []string{"prefill", "decode", "both"}

// runKube follows p's endpoints in the Kubernetes API; the caller does not
// hold mu. Like a DNS pool's first lookup, the first listing is waited for
// (bounded by health.timeout) and its backends join with warm-up only when
// warm; every later change is applied as the watch reports it, newcomers
// warmed up, endpoints no longer ready (terminating, not ready, deleted)
// drained. Newcomers' models are asked for outside mu (updatePool).
func (s *Set) runKube(p *pool, warm bool) {
	ctx := p.ctx
	k := p.entry.Kubernetes
	ns := k.Namespace
	if ns == "" {
		ns = discovery.InClusterNamespace()
	}
	if ns == "" {
		s.c.Log.Error("kubernetes backend: no namespace set and not running in a cluster; it has no backends", "backend", p.entry.Name)
		return
	}
	cs, dyn, err := KubeClients(k.Kubeconfig)
	if err != nil {
		s.c.Log.Error("kubernetes backend: no API client; it has no backends", "backend", p.entry.Name, "err", err)
		return
	}
	w := discovery.NewKube(discovery.KubeSpec{Namespace: ns, Service: k.Service, Selector: k.Selector,
		InferencePool: k.InferencePool, Port: k.Port, Base: p.entry.Base, AllowLinkLocal: k.AllowLinkLocal}, cs, dyn)
	w.Warn = func(msg string) { s.c.Log.Warn(msg, "backend", p.entry.Name) }
	s.checks.Go(func() { w.Run(ctx) })
	first, cancel := context.WithTimeout(ctx, s.c.Health.Timeout)
	synced := w.WaitSynced(first)
	cancel()
	if synced {
		s.updateKube(p, w.Endpoints(), warm)
	} else {
		s.c.Log.Warn("kubernetes backend: not listed within health.timeout; its backends join (warmed up) once they are", "backend", p.entry.Name)
	}
	s.checks.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-w.Changed():
			}
			// A change seen while the caches still fill would take what
			// is not listed yet for gone.
			if !w.WaitSynced(ctx) {
				return
			}
			s.updateKube(p, w.Endpoints(), true)
		}
	})
}

// updateKube makes p's backends the ready endpoints eps; the caller does
// not hold mu.
func (s *Set) updateKube(p *pool, eps []discovery.Endpoint, warm bool) {
	ts := make([]target, len(eps))
	for i, e := range eps {
		ts[i] = target{name: e.Name, url: e.URL, kind: e.Engine, role: e.Role}
	}
	s.updatePool(p, ts, warm, "not ready or terminating in Kubernetes")
}

// targetEntry is the entry a pool's backend t takes: the pool's, with the
// engine kind and role t's labels give (a label with an unknown value is
// ignored, with a warning).
func (s *Set) targetEntry(p *pool, t target) config.Entry {
	e := p.entry
	if t.kind != "" {
		if k, err := adapter.ParseKind(t.kind); err != nil {
			s.c.Log.Warn("kubernetes backend: ignoring its engine label", "backend", t.name, "label", discovery.EngineLabel, "err", err)
		} else {
			e.Kind, e.EngineKind = t.kind, k
		}
	}
	if t.role != "" {
		if slices.Contains(roles, t.role) {
			e.Role = t.role
		} else {
			s.c.Log.Warn("kubernetes backend: ignoring its role label (not prefill, decode or both)", "backend", t.name, "label", discovery.RoleLabel, "value", t.role)
		}
	}
	return e
}
