package scheduler

import (
	"time"

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
// base model, "" for none) when the policy asks for it.
func (s *Scheduler) adapterStage(cands []*fleet.Backend, model, parent string, now time.Time) []*fleet.Backend {
	if parent == "" || len(cands) < 2 {
		return cands
	}
	if a, ok := s.Policy().(policy.AdapterAffinity); !ok || !a.AdapterAffinity() {
		return cands
	}
	return policy.AdapterTiers(cands, model, now)
}
