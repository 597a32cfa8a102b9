package scheduler

import (
	"github.com/kvroute/kvroute/internal/request"
)

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
