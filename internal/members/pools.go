package members

import (
	"context"
	"net/url"
	"sync"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/discovery"
)

// pool is one discovered entry (discovery: dns or kubernetes) and the
// backends it found.
type pool struct {
	entry   config.Entry
	members map[string]*Member // by target key
	// ctx is the pool's life, stop ends it; both nil until the set runs
	// (begin).
	ctx  context.Context
	stop context.CancelFunc
}

// fetchAtOnce bounds the /v1/models requests of one pool update.
const fetchAtOnce = 8

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

// begin gives p its context; the caller holds mu, and starts p
// (startPool) once it let go of mu.
func (s *Set) begin(p *pool) {
	p.ctx, p.stop = context.WithCancel(s.ctx)
}

// startPool finds p's backends once (with warm-up when warm) and keeps
// following them. The caller does not hold mu: the first lookup and the
// newcomers' models are waited for outside it (updatePool).
func (s *Set) startPool(p *pool, warm bool) {
	if p.entry.DNS() {
		s.resolvePool(p, warm)
		s.runPool(p)
		return
	}
	s.runKube(p, warm)
}

// runPool starts p's re-resolving loop.
func (s *Set) runPool(p *pool) {
	s.every(p.ctx, func() time.Duration {
		if p.entry.DNSInterval != 0 {
			return p.entry.DNSInterval
		}
		return s.dnsInterval
	}, func() { s.resolvePool(p, true) })
}

// every runs do every period() (read under mu) until ctx ends; do takes
// mu itself.
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
			do()
		}
	})
}

// resolvePool re-resolves p and adds and removes its backends; the caller
// does not hold mu. A failed lookup changes nothing: a DNS outage must not
// empty the fleet.
func (s *Set) resolvePool(p *pool, warm bool) {
	ctx, cancel := context.WithTimeout(p.ctx, s.c.Health.Timeout)
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
	s.updatePool(p, ts, warm, "gone from DNS")
}

// updatePool makes p's backends match ts (applyPool); the caller does not
// hold mu. The newcomers' /v1/models are asked for first, outside mu
// (fetchAll), so that pods that do not answer hold up no reload, drain
// or other pool; mu is taken only to read the pool's members and to
// apply the change.
func (s *Set) updatePool(p *pool, ts []target, warm bool, why string) {
	s.mu.Lock()
	var fresh []target
	if len(p.entry.Models) == 0 && s.c.DiscoverModels {
		for _, t := range ts {
			if _, ok := p.members[t.key()]; !ok {
				fresh = append(fresh, t)
			}
		}
	}
	s.mu.Unlock()
	found := s.fetchAll(p.ctx, fresh)
	s.mu.Lock()
	defer s.mu.Unlock()
	if p.ctx.Err() == nil { // not stopped meanwhile (a reload)
		s.applyPool(p, ts, warm, why, found)
	}
}

// fetchAll asks each of ts for its /v1/models, fetchAtOnce at a time, each
// bounded by health.timeout (FetchModels): what each answered by target
// key, nil for one that failed (fetchForEntry).
func (s *Set) fetchAll(ctx context.Context, ts []target) map[string]*ModelList {
	out := make([]*ModelList, len(ts))
	slots := make(chan struct{}, fetchAtOnce)
	var wg sync.WaitGroup
	for i, t := range ts {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			out[i] = s.fetchForEntry(ctx, t.url)
		})
	}
	wg.Wait()
	found := make(map[string]*ModelList, len(ts))
	for i, t := range ts {
		found[t.key()] = out[i]
	}
	return found
}

// applyPool makes p's backends match ts: newcomers join (with warm-up when
// warm, with the models found lists for them), backends not in ts are
// drained and retire once their last request ends; the caller holds mu.
func (s *Set) applyPool(p *pool, ts []target, warm bool, why string, found map[string]*ModelList) {
	// One batch: one fleet snapshot, one copy of the table, one rebuild
	// of the model labels for the whole update, which so costs O(n).
	s.release(s.c.Now())
	s.c.Fleet.Batch(func() {
		s.batch = true
		defer s.endBatch()
		seen := make(map[string]bool, len(ts))
		for _, t := range ts {
			k := t.key()
			seen[k] = true
			if _, ok := p.members[k]; ok {
				continue
			}
			p.members[k] = s.add(s.targetEntry(p, t), t.name, t.url, p.entry.Name, found[k], warm)
		}
		for k, m := range p.members {
			if !seen[k] {
				s.remove(m, why)
				delete(p.members, k)
			}
		}
	})
	s.release(s.c.Now())
}

// endBatch ends a batch: its table is stored, its newcomers' checks and
// streams started, and the labels rebuilt when a change asked for it. The
// caller holds mu.
func (s *Set) endBatch() {
	s.batch = false
	if s.next != nil {
		s.table.Store(s.next)
		s.next = nil
	}
	for _, m := range s.starts {
		s.start(m)
	}
	s.starts = nil
	if s.stale {
		s.refresh()
	}
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
