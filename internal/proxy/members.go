package proxy

import (
	"context"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/discovery"
	"github.com/kvroute/kvroute/internal/fleet"
)

// resolver answers the DNS queries of discovery: dns backends. Stubbed in
// tests.
var resolver discovery.Resolver = net.DefaultResolver

// membership is the part of the server that changes the fleet while it
// serves: backends of the config file (added and removed by a reload) and
// pools of backends behind DNS names (added and removed as the names
// resolve). A backend added while serving warms up (fleet.AddWarm); one
// that leaves is drained and retired once its last request ends, and the
// prefix index forgets it at once, since no request will be routed to it
// again.
type membership struct {
	// mu serialises membership changes (reloads and DNS updates).
	mu sync.Mutex
	// ctx is the context of health checks and DNS loops; nil before Start.
	ctx context.Context
	// table is every backend's health, indexed by ID; nil until the first
	// backend is added after New (until then Server.health is the table).
	table atomic.Pointer[[]*backendHealth]
	// static are the backends of plain config entries, by entryKey.
	static map[string]*fleet.Backend
	// pools are the DNS entries, by entryKey.
	pools map[string]*pool
	// last is the configuration last reloaded; nil before any reload.
	last *config.Config
	// warmup and dnsInterval are the fleet section in force.
	warmup      time.Duration
	dnsInterval time.Duration
}

// pool is one discovery: dns entry and the backends its name resolves to.
type pool struct {
	entry   config.Backend
	base    *url.URL
	models  []string
	members map[string]*fleet.Backend // by URL
	stop    context.CancelFunc        // nil until its loop runs
	done    chan struct{}
}

// healthTable returns every backend's health, indexed by ID.
func (s *Server) healthTable() []*backendHealth {
	if t := s.members.table.Load(); t != nil {
		return *t
	}
	return s.health
}

// entryKey identifies a config entry: an entry whose key changed is a
// different backend (it is removed and the new one added), since its
// models, name and kind are fixed for a backend's life.
func entryKey(b *config.Backend) string {
	return strings.Join([]string{b.URL, b.Name, strings.Join(b.Models, ","), b.Kind, b.Discovery, b.SRV}, "\x00")
}

// initMembers records the backends New added and the DNS pools, whose
// names Start resolves. models are the per-entry models New found.
func (s *Server) initMembers(models [][]string) {
	m := &s.members
	m.static = map[string]*fleet.Backend{}
	m.pools = map[string]*pool{}
	m.warmup, m.dnsInterval = s.cfg.Fleet.Warmup, s.cfg.Fleet.DNSInterval
	for i := range s.cfg.Backends {
		bc := &s.cfg.Backends[i]
		if bc.IsDNS() {
			if p := s.newPool(bc, models[i]); p != nil {
				m.pools[entryKey(bc)] = p
			}
		}
	}
	for _, h := range s.health {
		for i := range s.cfg.Backends {
			bc := &s.cfg.Backends[i]
			if !bc.IsDNS() && bc.Name == h.b.Name {
				m.static[entryKey(bc)] = h.b
			}
		}
	}
}

func (s *Server) newPool(bc *config.Backend, models []string) *pool {
	u, err := config.ParseBackendURL(bc.URL)
	if err != nil {
		s.log.Error("dns backend: bad URL", "url", bc.URL, "err", err)
		return nil
	}
	if len(bc.Models) > 0 {
		models = bc.Models
	}
	return &pool{entry: *bc, base: u, models: models, members: map[string]*fleet.Backend{}}
}

// startMembers resolves the DNS pools once (their backends join without
// warm-up, like the static ones) and starts their re-resolving loops.
func (s *Server) startMembers(ctx context.Context) {
	m := &s.members
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ctx = ctx
	for _, p := range m.pools {
		s.resolvePool(p, false)
		s.runPool(p)
	}
}

// runPool starts p's loop; the caller holds members.mu.
func (s *Server) runPool(p *pool) {
	ctx, stop := context.WithCancel(s.members.ctx)
	p.stop, p.done = stop, make(chan struct{})
	s.checks.Add(1)
	go func() {
		defer s.checks.Done()
		defer close(p.done)
		for {
			every := p.entry.DNSInterval
			if every == 0 {
				s.members.mu.Lock()
				every = s.members.dnsInterval
				s.members.mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(every):
			}
			s.members.mu.Lock()
			if ctx.Err() == nil {
				s.resolvePool(p, true)
			}
			s.members.mu.Unlock()
		}
	}()
}

// resolvePool re-resolves p and adds and removes its backends; the caller
// holds members.mu. A failed lookup changes nothing: a DNS outage must not
// empty the fleet.
func (s *Server) resolvePool(p *pool, warm bool) {
	ctx, cancel := context.WithTimeout(s.members.ctx, s.cfg.Health.Timeout)
	urls, err := discovery.Resolve(ctx, resolver, p.base, p.entry.SRV)
	cancel()
	if err != nil {
		s.log.Warn("dns backend: lookup failed; keeping its backends", "backend", p.entry.Name, "err", err)
		return
	}
	seen := map[string]bool{}
	for _, u := range urls {
		k := u.String()
		seen[k] = true
		if _, ok := p.members[k]; ok {
			continue
		}
		p.members[k] = s.addBackend(p.entry.Name+"/"+u.Host, u, p.models, p.entry.Kind, warm)
	}
	for k, b := range p.members {
		if !seen[k] {
			s.removeBackend(b, "gone from DNS")
			delete(p.members, k)
		}
	}
}

// stopPool stops p's loop and removes its backends; the caller holds
// members.mu, which p's loop may be waiting for, so the loop is not
// waited for (it sees its context done and exits).
func (s *Server) stopPool(p *pool, why string) {
	if p.stop != nil {
		p.stop()
	}
	for k, b := range p.members {
		s.removeBackend(b, why)
		delete(p.members, k)
	}
}

// addBackend adds a backend (with warm-up when warm), its health and its
// active checker; the caller holds members.mu.
func (s *Server) addBackend(name string, u *url.URL, models []string, kind string, warm bool) *fleet.Backend {
	m := &s.members
	var w time.Duration
	if warm {
		w = m.warmup
	}
	if len(models) == 0 && s.cfg.Upstream.DiscoverModels && m.ctx != nil {
		if ids, _, err := s.fetchModels(m.ctx, u); err == nil {
			models = ids
		}
	}
	s.setKind(name, kind)
	b := s.fleet.AddWarm(name, u, models, time.Now(), w)
	h := &backendHealth{b: b}
	t := slices.Clone(s.healthTable())
	for len(t) < b.ID {
		t = append(t, nil) // IDs taken by a concurrent Add outside members
	}
	t = append(t, h)
	m.table.Store(&t)
	if m.ctx != nil {
		s.startCheck(m.ctx, h)
	}
	s.log.Info("backend added", "backend", name, "url", u.String(), "models", models, "warmup", w)
	return b
}

// removeBackend drains b, retires it once its last request ends, and
// forgets its prefixes; the caller holds members.mu.
func (s *Server) removeBackend(b *fleet.Backend, why string) {
	retired := s.fleet.Remove(b)
	s.sched.Index().RemoveBackend(b.ID)
	s.log.Info("backend removed: draining", "backend", b.Name, "why", why, "in_flight", b.Load().InFlight, "retired", retired)
}

// applyBackends makes the fleet match cfg's backends list: entries that
// are gone are removed, new ones added with warm-up, DNS pools started and
// stopped; unchanged entries keep their backends, state and streams. The
// caller holds members.mu.
func (s *Server) applyBackends(cfg *config.Config) {
	m := &s.members
	m.warmup, m.dnsInterval = cfg.Fleet.Warmup, cfg.Fleet.DNSInterval
	want := map[string]*config.Backend{}
	for i := range cfg.Backends {
		want[entryKey(&cfg.Backends[i])] = &cfg.Backends[i]
	}
	for k, bc := range want {
		if _, ok := m.static[k]; ok {
			continue
		}
		if _, ok := m.pools[k]; ok {
			continue
		}
		if bc.IsDNS() {
			p := s.newPool(bc, nil)
			if p == nil {
				continue
			}
			m.pools[k] = p
			if m.ctx != nil {
				s.resolvePool(p, true)
				s.runPool(p)
			}
			continue
		}
		u, err := config.ParseBackendURL(bc.URL)
		if err != nil {
			s.log.Error("reload: bad backend URL", "url", bc.URL, "err", err)
			continue
		}
		m.static[k] = s.addBackend(bc.Name, u, bc.Models, bc.Kind, true)
	}
	// Removals come after additions, so that replacing the whole list
	// never leaves a moment without a backend to route to.
	for k, b := range m.static {
		if _, ok := want[k]; !ok {
			s.removeBackend(b, "removed from the config")
			delete(m.static, k)
		}
	}
	for k, p := range m.pools {
		if _, ok := want[k]; !ok {
			s.stopPool(p, "removed from the config")
			delete(m.pools, k)
		}
	}
}
