package members

import (
	"context"
	"net/url"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/discovery"
)

// pool is one discovered entry (discovery: dns or kubernetes) and the
// backends it found.
type pool struct {
	entry   config.Entry
	members map[string]*Member // by target key
	stop    context.CancelFunc // nil until its loop runs
}

// target is one backend a pool should have. A DNS address is named by
// its entry and address; a Kubernetes endpoint by its pod, which may come
// back at a new address under the same name.
type target struct {
	name string
	url  *url.URL
	// kind and role are the endpoint's engine kind and role labels, ""
	// when it has none (the entry's kind then applies).
	kind, role string
}

// key tells targets apart: the same name at a new address is a new
// backend (the old one is drained).
func (t target) key() string { return t.name + " " + t.url.String() }

// startPool finds p's backends once (with warm-up when warm) and keeps
// following them; the caller holds mu.
func (s *Set) startPool(p *pool, warm bool) {
	if p.entry.DNS() {
		s.resolvePool(p, warm)
		s.runPool(p)
		return
	}
	s.runKube(p, warm)
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
	ts := make([]target, len(urls))
	for i, u := range urls {
		ts[i] = target{name: p.entry.Name + "/" + u.Host, url: u}
	}
	s.applyPool(p, ts, warm, "gone from DNS")
}

// applyPool makes p's backends match ts: newcomers join (with warm-up when
// warm), backends not in ts are drained and retire once their last
// request ends; the caller holds mu.
func (s *Set) applyPool(p *pool, ts []target, warm bool, why string) {
	s.batch = true
	defer func() {
		s.batch = false
		if s.stale {
			s.refresh()
		}
	}()
	seen := map[string]bool{}
	for _, t := range ts {
		k := t.key()
		seen[k] = true
		if _, ok := p.members[k]; ok {
			continue
		}
		p.members[k] = s.add(s.targetEntry(p, t), t.name, t.url, p.entry.Name, nil, warm)
	}
	for k, m := range p.members {
		if !seen[k] {
			s.remove(m, why)
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
