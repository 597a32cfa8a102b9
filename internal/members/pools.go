package members

import (
	"context"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/discovery"
)

// pool is one discovery: dns entry and the backends its name resolves to.
type pool struct {
	entry   config.Entry
	members map[string]*Member // by URL
	stop    context.CancelFunc // nil until its loop runs
}

// runPool starts p's re-resolving loop; the caller holds mu.
func (s *Set) runPool(p *pool) {
	ctx, stop := context.WithCancel(s.ctx)
	p.stop = stop
	s.every(ctx, func() time.Duration {
		if p.entry.DNSInterval != 0 {
			return p.entry.DNSInterval
		}
		return s.dnsInterval
	}, func() { s.resolvePool(p, true) })
}

// every runs do under mu every period() (read under mu) until ctx ends.
func (s *Set) every(ctx context.Context, period func() time.Duration, do func()) {
	s.checks.Go(func() {
		for {
			s.mu.Lock()
			wait := period()
			s.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			s.mu.Lock()
			if ctx.Err() == nil {
				do()
			}
			s.mu.Unlock()
		}
	})
}

// resolvePool re-resolves p and adds and removes its backends; the caller
// holds mu. A failed lookup changes nothing: a DNS outage must not empty
// the fleet.
func (s *Set) resolvePool(p *pool, warm bool) {
	ctx, cancel := context.WithTimeout(s.ctx, s.c.Health.Timeout)
	urls, err := discovery.Resolve(ctx, Resolver, p.entry.Base, p.entry.SRV)
	cancel()
	if err != nil {
		s.c.Log.Warn("dns backend: lookup failed; keeping its backends", "backend", p.entry.Name, "err", err)
		return
	}
	seen := map[string]bool{}
	for _, u := range urls {
		k := u.String()
		seen[k] = true
		if _, ok := p.members[k]; ok {
			continue
		}
		p.members[k] = s.add(p.entry, p.entry.Name+"/"+u.Host, u, p.entry.Name, nil, warm)
	}
	for k, m := range p.members {
		if !seen[k] {
			s.remove(m, "gone from DNS")
			delete(p.members, k)
		}
	}
	s.release(s.c.Now())
}

// stopPool stops p's loop and removes its backends; the caller holds mu,
// which p's loop may be waiting for, so the loop is not waited for (it
// sees its context done and exits).
func (s *Set) stopPool(p *pool, why string) {
	if p.stop != nil {
		p.stop()
	}
	for k, m := range p.members {
		s.remove(m, why)
		delete(p.members, k)
	}
}
