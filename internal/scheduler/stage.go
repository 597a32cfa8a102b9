package scheduler

import (
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/prefix"
	"github.com/kvroute/kvroute/internal/request"
)

// The stages of a routing decision before the policy's pick, in order:
// candidates (healthy, serving the model or the adapter's base model, not
// excluded, warm-up, the filters: narrow, then the adapter stage), the prefix match (match), tokens, and the scorers
// (score). The filters and scorers are the seams of features the policies
// need not weigh themselves (policy.Filter, policy.Scorer).

// candidates sets sc.cands to the backends of snap that may take v: the
// healthy ones that serve its model and are not in exclude, those of them
// that warm-up admits for the key warm (all of them if it admits none),
// narrowed by the filters, then by the adapter stage. The error is ErrUnknownModel when no
// backend, healthy or not, serves the model, ErrNoBackend when none may
// take it.
func (s *Scheduler) candidates(sc *scratch, snap *fleet.Snapshot, v *request.View, warm uint64, exclude []int, now time.Time) error {
	sc.adapterTier = ""
	if pinned, err := s.pinResponse(sc, snap, v, exclude, now); pinned {
		return err
	}
	sc.cands = sc.cands[:0]
	parent := s.Parent(v.Model)
	held := 0
	for _, b := range snap.Healthy {
		if s.serves(b, v.Model, parent) && !excluded(exclude, b.ID) {
			if !warmAdmits(b, warm, now) {
				held++
				continue
			}
			sc.cands = append(sc.cands, b)
		}
	}
	if len(sc.cands) == 0 && held > 0 {
		// Only warming backends can take the request: warm-up slows a
		// newcomer's ramp, it must not turn a request away.
		for _, b := range snap.Healthy {
			if s.serves(b, v.Model, parent) && !excluded(exclude, b.ID) {
				sc.cands = append(sc.cands, b)
			}
		}
	}
	if len(sc.cands) == 0 {
		for _, b := range snap.All {
			if s.serves(b, v.Model, parent) {
				return ErrNoBackend
			}
		}
		return ErrUnknownModel
	}
	if s.narrow(sc, v) == 0 {
		return ErrNoBackend
	}
	// An adapter's request goes where the adapter is loaded, or a slot
	// is free, before an engine that would have to evict (lora.go); among
	// the engines the filters left, so that an adapter loaded only where
	// a leg may not go (a prefill engine, for a decode leg) does not
	// leave the leg no engine.
	sc.cands, sc.adapterTier = s.adapterStage(sc.cands, v.Model, parent, now)
	return nil
}

// narrow runs the scheduler's filters (Config.Filters, policy.Filter)
// over sc.cands, in order: each keeps the candidates of the lowest
// non-negative tier among those left, in their order. It returns how
// many are left; 0 when a filter allows none.
func (s *Scheduler) narrow(sc *scratch, v *request.View) int {
	for _, f := range s.filters {
		sc.tiers = sc.tiers[:0]
		low := -1
		for _, b := range sc.cands {
			t := f.Tier(v, b)
			sc.tiers = append(sc.tiers, t)
			if t >= 0 && (low < 0 || t < low) {
				low = t
			}
		}
		kept := sc.cands[:0]
		for i, b := range sc.cands {
			if low >= 0 && sc.tiers[i] == low {
				kept = append(kept, b)
			}
		}
		clear(sc.cands[len(kept):])
		sc.cands = kept
	}
	return len(sc.cands)
}

// tokens sets sc.matched, sc.cached and sc.uncached per candidate from
// the match in sc.all (see split) and, with cache tiers, sc.ctiers and
// the price of their lower tiers in sc.load (nil without).
func (s *Scheduler) tokens(sc *scratch, v *request.View) {
	sc.matched, sc.cached, sc.uncached = sc.matched[:0], sc.cached[:0], sc.uncached[:0]
	for _, b := range sc.cands {
		m := sc.all[b.ID]
		c, u := s.split(v, m)
		sc.matched, sc.cached, sc.uncached = append(sc.matched, m), append(sc.cached, c), append(sc.uncached, u)
	}
	sc.ctiers, sc.load = sc.ctiers[:0], sc.load[:0]
	if !sc.tiered {
		sc.ctiers, sc.load = nil, nil
		return
	}
	for i, b := range sc.cands {
		t := sc.ktiers[b.ID]
		if t.Total() != sc.matched[i] {
			// The audit untrusted b's picture: no cache on any tier.
			t = prefix.Tiers{}
		}
		tt, sec := s.tierLoad(b.Cost(), int64(max(v.PromptTokens, 0)), t)
		sc.ctiers, sc.load = append(sc.ctiers, tt), append(sc.load, sec)
	}
}

// score sums the scheduler's scorers' costs (Config.Scorers,
// policy.Scorer) per candidate, for policy.Input.Extra: nil without
// scorers.
func (s *Scheduler) score(sc *scratch, v *request.View) []float64 {
	if len(s.scorers) == 0 {
		return nil
	}
	sc.extra = sc.extra[:0]
	for _, b := range sc.cands {
		var c float64
		for _, f := range s.scorers {
			c += max(f.Cost(v, b), 0)
		}
		sc.extra = append(sc.extra, c)
	}
	return sc.extra
}
