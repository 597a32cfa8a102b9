package scheduler

import (
	"slices"
	"sync"
	"time"

	"github.com/kvroute/kvroute/internal/adapter"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/prefix"
	"github.com/kvroute/kvroute/internal/request"
)

// LoRA adapters. The scheduler knows which model names are adapters, and
// of which base model (SetAdapters: the engines' /v1/models in kvroute
// serve, the workload in kvroute sim). A request for an adapter:
//
//   - may go to any backend that serves the adapter or its base model;
//   - has its prefix hashes salted with the adapter's name
//     (prefix.AdapterSalt), as the engine salts its blocks: the same text
//     under another adapter, or the base model, matches nothing;
//   - is narrowed to the backends that would not hold it back for an
//     adapter slot (policy.AdapterTiers) before the policy picks, when the
//     policy asks for it (policy.AdapterAffinity).
//
// A policy that implements policy.AdapterBlind gets none of the last two.
// The hook into route is two calls: serves for the candidates and
// adapterStage on them; on a scheduler pipeline of filters and scorers,
// adapterStage is a filter.

// SetAdapters replaces the known adapters: adapter name -> base model.
// The map is not modified afterwards.
func (s *Scheduler) SetAdapters(parents map[string]string) {
	s.adaptersMu.Lock()
	defer s.adaptersMu.Unlock()
	s.adapters.Store(&parents)
}

// Parent returns the base model of adapter model, "" when model is not a
// known adapter.
func (s *Scheduler) Parent(model string) string {
	if m := s.adapters.Load(); m != nil && model != "" {
		return (*m)[model]
	}
	return ""
}

// Salt is the salt of v's prefix hashes (Hashes): v.PrefixSalt, under
// v.Model when it is a known adapter and the policy knows adapters.
func (s *Scheduler) Salt(v *request.View) string {
	if s.adapterBlind() {
		return v.PrefixSalt
	}
	if s.Parent(v.Model) == "" {
		return v.PrefixSalt
	}
	return prefix.AdapterSalt(v.Model, v.PrefixSalt)
}

// adapterBlind reports whether the current policy must not know adapters.
func (s *Scheduler) adapterBlind() bool {
	_, ok := s.Policy().(policy.AdapterBlind)
	return ok
}

// serves reports whether b may take a request for model, whose base model
// is parent ("" for a base model): b lists model, or b lists parent and no
// adapter at all (its models are configured, not read from its
// /v1/models, which lists every adapter an engine serves).
func (s *Scheduler) serves(b *fleet.Backend, model, parent string) bool {
	if b.Serves(model) {
		return true
	}
	if parent == "" || !b.Serves(parent) {
		return false
	}
	for _, m := range b.Models {
		if s.Parent(m) != "" {
			return false
		}
	}
	return true
}

// adapterStage narrows cands for a request for adapter model (parent its
// base model, "" for none) when the policy asks for it. The tier it kept
// is returned when it left some candidates out (the adapter decided
// among them), "" otherwise.
func (s *Scheduler) adapterStage(cands []*fleet.Backend, model, parent string, now time.Time) ([]*fleet.Backend, string) {
	if parent == "" || len(cands) < 2 {
		return cands, ""
	}
	if a, ok := s.Policy().(policy.AdapterAffinity); !ok || !a.AdapterAffinity() {
		return cands, ""
	}
	n := len(cands)
	kept, tier := policy.AdapterTiers(cands, model, now, s.resident.of)
	if len(kept) == n {
		tier = ""
	}
	return kept, tier
}

// residents is the router's picture of the adapters each backend keeps
// loaded: the adapters it routed there, most recent first. An engine
// keeps an adapter loaded after its last request ends, until another
// needs its slot (vLLM's LRU of --max-loras adapters, as llm-d's
// simulator keeps them too), but reports only the adapters of the
// requests it runs or holds; so the adapter stage reads this picture
// beside the engine's report (policy.AdapterTiers).
type residents struct {
	mu sync.Mutex
	by map[int][]string // fleet ID -> adapters, most recent first
}

// maxResident bounds the adapters remembered per backend: the engine's
// cap on adapters (max_lora) is at most adapter.MaxLoRAs.
const maxResident = adapter.MaxLoRAs

// routedAdapter notes that a request for model went to b, when model is
// a known adapter and the policy knows adapters.
func (s *Scheduler) routedAdapter(b *fleet.Backend, model string) {
	if s.Parent(model) == "" || s.adapterBlind() {
		return
	}
	r := &s.resident
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.by == nil {
		r.by = map[int][]string{}
	}
	list := r.by[b.ID]
	if i := slices.Index(list, model); i >= 0 {
		list = slices.Delete(list, i, i+1)
	} else if len(list) == maxResident {
		list = list[:maxResident-1]
	}
	r.by[b.ID] = slices.Insert(list, 0, model)
}

// of returns the adapters routed to b, most recent first; the slice is
// a copy.
func (r *residents) of(b *fleet.Backend) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.by[b.ID])
}

// forget drops what was routed to backend (its slot is freed or its
// engine restarted).
func (r *residents) forget(backend int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.by, backend)
}
