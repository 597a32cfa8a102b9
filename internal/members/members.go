// Package members is the router's control plane: it owns the set of
// backends and everything known about each one, in one record per backend
// (Member), keyed one way, by the fleet's backend ID (its slot: see
// package fleet). A record carries the
// backend's config entry, the DNS pool it came from, its engine kind, its
// context lengths, its circuit breaker and active health checks, and its
// metric series, resolved once when it joins. The package also adds and
// removes backends: at startup, on a reload (Apply) and as DNS names
// resolve, with warm-up for newcomers and draining for leavers. A leaver's
// record, metric series and prefix index are kept through the fleet's
// rejoin grace (fleet.rejoin_grace), so that it finds them again if it
// returns by the same name; after the grace all three are deleted
// (release.go).
//
// The data plane (package proxy) asks it: Of to find a backend's record,
// Allow, Succeeded and Failed around each attempt, MaxContext before
// routing. It must not forward client requests nor make routing decisions;
// the load accounting it leaves to package fleet.
package members

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/adapter"
	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/discovery"
	"github.com/kvroute/kvroute/internal/fleet"
)

// Resolver answers the DNS queries of discovery: dns backends. Stubbed in
// tests.
var Resolver discovery.Resolver = net.DefaultResolver

// Series are the per-backend metric families whose children each Member
// resolves once, when it joins.
type Series struct {
	// Requests is labelled backend, policy, model, status.
	Requests *prometheus.CounterVec
	// TTFT and E2E are labelled backend, model. A model label is a name
	// the fleet serves, "other" or "" (the caller bounds it).
	TTFT, E2E *prometheus.HistogramVec
	// ITL (the router-side gap between a stream's token chunks) is
	// labelled backend, model, and so are InputTokens and OutputTokens
	// (the tokens of the requests the backend served).
	ITL                       *prometheus.HistogramVec
	InputTokens, OutputTokens *prometheus.CounterVec
	// Ejections and UpstreamErrors are labelled backend.
	Ejections, UpstreamErrors *prometheus.CounterVec
	// Others are the other families labelled backend (with any other
	// labels), kept elsewhere: a released backend's series are deleted
	// from them too.
	Others []Family
}

// Config wires a Set.
type Config struct {
	Fleet *fleet.Fleet
	// Forget makes the prefix index forget a backend's blocks: it is
	// called when a backend's breaker opens and when its slot is
	// released (after the rejoin grace).
	Forget func(id int)
	// Transport carries health checks and /v1/models requests.
	Transport http.RoundTripper
	Log       *slog.Logger
	Series    Series
	// Health is the health section (fixed for the Set's life).
	Health config.Health
	// DiscoverModels asks backends without configured models for their
	// /v1/models (and context lengths).
	DiscoverModels bool
	// Fleet is the fleet section in force at startup.
	FleetSection config.Fleet
	// KVStream follows the KV event stream of each backend whose entry
	// has kv_events; nil: none is followed.
	KVStream Stream
	// Now is the clock of membership changes (when a backend joins, leaves
	// and is released after its rejoin grace); nil: time.Now. Tests churn
	// the fleet in virtual time with it.
	Now func() time.Time
	// Adapters, when set, is given the LoRA adapters the backends'
	// /v1/models list, each with its base model, whenever they change
	// (scheduler.SetAdapters): the fleet's, bounded (labels.go). The map
	// is not modified afterwards.
	Adapters func(parents map[string]string)
	// SetCPUCapacity, when set, is given each backend's CPU tier in tokens
	// (backends[].cpu_kv_blocks) whenever its entry is applied
	// (scheduler.SetCPUCapacity).
	SetCPUCapacity func(id int, tokens int64)
}

// Set is every backend the router knows and its record.
type Set struct {
	c Config
	// table is every record, indexed by backend ID (members and leavers
	// in their grace); replaced whole (copy on write) when a backend
	// joins or a slot is released, so that Of is one atomic load.
	table atomic.Pointer[[]*Member]

	// mu serialises membership changes (startup, reloads, DNS updates).
	mu sync.Mutex
	// applying serialises whole reloads (Apply), which let go of mu while
	// their new pools' first lookups run.
	applying sync.Mutex
	// ctx is the context of health checks and DNS loops; nil before Start.
	ctx context.Context
	// static are the records of plain config entries, by entry key.
	static map[string]*Member
	// pools are the DNS entries, by entry key.
	pools map[string]*pool
	// warmup and dnsInterval are the fleet section in force.
	warmup, dnsInterval time.Duration
	// checks counts the goroutines Start and later additions run.
	checks sync.WaitGroup
	// labels are the model labels (labels.go), rebuilt by refresh; batch
	// and stale defer the rebuild to the end of a pool's update.
	labels       atomic.Pointer[modelLabels]
	batch, stale bool
	// next is the table a batch changes, stored at its end (draft,
	// commit); nil outside a batch or before its first change. starts
	// are the records whose checks and streams start then.
	next   *[]*Member
	starts []*Member
}

// start starts m's health check and event stream, at once or, inside a
// batch, once the table has m's record (endBatch): a check that looked
// its record up before would take itself for a replaced one and end.
func (s *Set) start(m *Member) {
	if s.batch {
		s.starts = append(s.starts, m)
		return
	}
	s.startCheck(m)
	s.startStream(m)
}

// draft returns a table to change and commit: a copy of the table, or,
// inside a batch, the batch's own copy, made once (a copy per backend
// made a pool of n cost O(n²)).
func (s *Set) draft() []*Member {
	if s.batch && s.next != nil {
		return *s.next
	}
	return slices.Clone(*s.table.Load())
}

// commit makes t the table, at once or, inside a batch, at its end
// (endBatch). The caller holds mu.
func (s *Set) commit(t []*Member) {
	if s.batch {
		s.next = &t
		return
	}
	s.table.Store(&t)
}

// New builds the set from the config's entries: static backends join the
// fleet at once (asked for their /v1/models first when discovery is on,
// bounded by health.timeout: the only network I/O New does); DNS pools are
// resolved by Start.
func New(c Config, entries []config.Entry) *Set {
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	s := &Set{c: c, static: map[string]*Member{}, pools: map[string]*pool{},
		warmup: c.FleetSection.Warmup, dnsInterval: c.FleetSection.DNSInterval}
	c.Fleet.SetGrace(c.FleetSection.RejoinGrace)
	t := []*Member{}
	s.table.Store(&t)
	found := s.discover(context.Background(), entries)
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range entries {
		e := &entries[i]
		if e.Pooled() {
			s.pools[e.Key()] = &pool{entry: *e, members: map[string]*Member{}}
			continue
		}
		s.static[e.Key()] = s.add(*e, e.Name, e.Base, "", found[i], false)
	}
	return s
}

// discover asks every static entry without configured models for its
// /v1/models, in parallel.
func (s *Set) discover(ctx context.Context, entries []config.Entry) []*ModelList {
	out := make([]*ModelList, len(entries))
	var wg sync.WaitGroup
	for i := range entries {
		e := &entries[i]
		if e.Pooled() || len(e.Models) > 0 || !s.c.DiscoverModels {
			continue
		}
		wg.Go(func() { out[i] = s.fetchForEntry(ctx, e.Base) })
	}
	wg.Wait()
	return out
}

// fetchForEntry asks u for its models, logging a failure.
func (s *Set) fetchForEntry(ctx context.Context, u *url.URL) *ModelList {
	l, err := s.FetchModels(ctx, u)
	if err != nil || len(l.IDs) == 0 {
		s.c.Log.Warn("model discovery failed; the backend is taken to serve any model", "backend", u.String(), "err", err)
		return nil
	}
	return l
}

// Of returns b's record, or nil for a backend this set does not own (or
// no longer: its slot was released).
func (s *Set) Of(b *fleet.Backend) *Member {
	t := *s.table.Load()
	if b == nil || b.ID < 0 || b.ID >= len(t) {
		return nil
	}
	if m := t[b.ID]; m != nil && m.B == b {
		return m
	}
	return nil
}

// All returns every record, leavers in their grace included, in ID order.
func (s *Set) All() []*Member {
	t := *s.table.Load()
	out := make([]*Member, 0, len(t))
	for _, m := range t {
		if m != nil {
			out = append(out, m)
		}
	}
	return out
}

// ByName returns the record of the backend named name, nil if none.
func (s *Set) ByName(name string) *Member {
	for _, m := range *s.table.Load() {
		if m != nil && m.B.Name == name && !m.B.Retired() {
			return m
		}
	}
	return nil
}

// KindOf is the engine monitor's lookup of a backend's configured kind.
func (s *Set) KindOf(b *fleet.Backend) adapter.Kind {
	if m := s.Of(b); m != nil {
		return m.Entry.EngineKind
	}
	return adapter.Unknown
}

// MaxContext returns the largest context length, in tokens, among the
// backends that serve model, and false when any of them has an unknown
// context (the router does not guess) or none serves it.
func (s *Set) MaxContext(model string) (int, bool) {
	largest := 0
	for _, b := range s.c.Fleet.Snapshot().All {
		if !b.Serves(model) {
			continue
		}
		m := s.Of(b)
		if m == nil {
			return 0, false
		}
		n := m.ContextOf(model)
		if n == 0 {
			return 0, false
		}
		largest = max(largest, n)
	}
	return largest, largest > 0
}

// Start resolves the DNS pools once (their backends join without warm-up,
// like the static ones), starts their re-resolving loops and every
// backend's active health check. All of them stop when ctx is done; Wait
// waits for them.
func (s *Set) Start(ctx context.Context) {
	s.mu.Lock()
	s.ctx = ctx
	for _, m := range s.All() {
		s.startCheck(m)
		s.startStream(m)
	}
	pools := make([]*pool, 0, len(s.pools))
	for _, p := range s.pools {
		s.begin(p)
		pools = append(pools, p)
	}
	s.runRelease()
	s.mu.Unlock()
	for _, p := range pools {
		s.startPool(p, false)
	}
}

// Wait waits for the goroutines Start began (after their context is done)
// and stops the breakers' cool-down timers.
func (s *Set) Wait() {
	s.checks.Wait()
	for _, m := range s.All() {
		m.mu.Lock()
		if m.timer != nil {
			m.timer.Stop()
		}
		m.mu.Unlock()
	}
}

// add makes a backend join the fleet (with warm-up when warm) and gives it
// its record and, once started, its health check; the caller holds mu.
// name and base are the backend's own (a pool member's are derived from
// its address); pool names the DNS entry it came from; found is its
// /v1/models, asked for by the caller before it took mu (nil: none, or
// they failed).
func (s *Set) add(e config.Entry, name string, base *url.URL, pool string, found *ModelList, warm bool) *Member {
	var w time.Duration
	if warm {
		w = s.warmup
	}
	models := e.Models
	if len(models) == 0 && found != nil {
		models = found.IDs
	}
	now := s.c.Now()
	if !s.batch { // a batch released once, at its start (applyPool)
		s.release(now)
	}
	b := s.c.Fleet.AddWarm(name, base, models, now, w)
	t := s.draft()
	for len(t) <= b.ID {
		t = append(t, nil) // IDs taken by an Add outside this set
	}
	if old := t[b.ID]; old != nil && old.B == b && old.Entry.Key() == e.Key() && old.Entry.EngineKind == e.EngineKind {
		// Back before its last request ended, under the same settings:
		// the same backend, record and health check; only its stream had
		// stopped. Under other settings (a role, kind, kv_events or tls
		// changed) it gets a record of its new entry below, and the old
		// record's check ends (startCheck).
		old.setLimits(e)
		if found != nil {
			old.adapters = found.Parents
		}
		s.refresh()
		if s.ctx != nil {
			s.startStream(old)
		}
		s.c.Log.Info("backend returned", "backend", name, "id", b.ID)
		return old
	}
	if old := t[b.ID]; old != nil && old.B.Name == name && !sameHost(old.B.URL, base) {
		// Back under its name at another address (a pod restarted
		// elsewhere): its slot and learned rate are its own, but its
		// engine started with an empty cache.
		s.c.Forget(b.ID)
	}
	m := newMember(b, e, pool, found, s.c.Series, s.c.SetCPUCapacity)
	t[b.ID] = m
	s.commit(t)
	s.refresh()
	if s.ctx != nil {
		s.start(m)
	}
	s.c.Log.Info("backend added", "backend", name, "url", base.String(), "models", models, "warmup", w)
	return m
}

// remove drains m's backend and retires it once its last request ends;
// its record, series and prefixes are kept through the rejoin grace
// (release). The caller holds mu.
func (s *Set) remove(m *Member, why string) {
	retired := s.c.Fleet.Remove(m.B, s.c.Now())
	s.stopStreamOf(m)
	s.c.Log.Info("backend removed: draining", "backend", m.B.Name, "why", why, "in_flight", m.B.Load().InFlight, "retired", retired)
}

// Apply makes the fleet match entries (a reloaded config's): entries that
// are gone are removed, new ones added with warm-up, DNS pools started and
// stopped; unchanged entries keep their backends, state and streams, and
// take the entry's new context length. fs is the reloaded fleet section.
// One Apply runs at a time; it holds mu only while it changes the set,
// not while new entries' models and new pools' first lookups are awaited.
func (s *Set) Apply(entries []config.Entry, fs config.Fleet) {
	s.applying.Lock()
	defer s.applying.Unlock()
	found := s.discoverNew(entries)
	s.mu.Lock()
	s.warmup, s.dnsInterval = fs.Warmup, fs.DNSInterval
	s.c.Fleet.SetGrace(fs.RejoinGrace)
	want := map[string]*config.Entry{}
	for i := range entries {
		want[entries[i].Key()] = &entries[i]
	}
	var started []*pool
	for k, e := range want {
		if m, ok := s.static[k]; ok {
			m.setLimits(*e)
			continue
		}
		if p, ok := s.pools[k]; ok {
			p.entry.MaxModelLen = e.MaxModelLen
			p.entry.MaxNumSeqs, p.entry.MaxNumBatchedTokens = e.MaxNumSeqs, e.MaxNumBatchedTokens
			for _, m := range p.members {
				m.setLimits(*e)
			}
			continue
		}
		if e.Pooled() {
			p := &pool{entry: *e, members: map[string]*Member{}}
			s.pools[k] = p
			if s.ctx != nil {
				s.begin(p)
				started = append(started, p)
			}
			continue
		}
		s.static[k] = s.add(*e, e.Name, e.Base, "", found[k], true)
	}
	s.mu.Unlock()
	// New pools' first lookups, outside mu (startPool).
	for _, p := range started {
		s.startPool(p, true)
	}
	// Removals come after additions, so that replacing the whole list
	// never leaves a moment without a backend to route to.
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, m := range s.static {
		if _, ok := want[k]; !ok {
			s.remove(m, "removed from the config")
			delete(s.static, k)
		}
	}
	for k, p := range s.pools {
		if _, ok := want[k]; !ok {
			s.stopPool(p, "removed from the config")
			delete(s.pools, k)
		}
	}
	s.release(s.c.Now())
}

// discoverNew asks the static entries of entries that are new to the set
// (a reload's additions) for their /v1/models, outside mu, once the set
// runs: their lists by entry key.
func (s *Set) discoverNew(entries []config.Entry) map[string]*ModelList {
	s.mu.Lock()
	ctx := s.ctx
	var fresh []config.Entry
	for _, e := range entries {
		if _, ok := s.static[e.Key()]; !ok && !e.Pooled() {
			fresh = append(fresh, e)
		}
	}
	s.mu.Unlock()
	found := map[string]*ModelList{}
	if ctx == nil {
		return found
	}
	for i, l := range s.discover(ctx, fresh) {
		found[fresh[i].Key()] = l
	}
	return found
}

// sameHost reports whether a and b name the same host and port.
func sameHost(a, b *url.URL) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Host == b.Host
}
