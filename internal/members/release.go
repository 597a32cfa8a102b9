package members

import (
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Family is a metric family with a backend label, whose series of a
// released backend are deleted (prometheus' CounterVec, HistogramVec and
// GaugeVec are Families).
type Family interface {
	DeletePartialMatch(labels prometheus.Labels) int
}

// release forgets the backends whose slots the fleet released by now
// (their rejoin grace passed): their records, their metric series and
// their prefix index, so that none of it outlives them and a later
// backend given the slot starts clean. The caller holds mu.
func (s *Set) release(now time.Time) {
	gone := s.c.Fleet.Release(now)
	if len(gone) == 0 {
		return
	}
	next := slices.Clone(*s.table.Load())
	for _, b := range gone {
		if b.ID < len(next) && next[b.ID] != nil && next[b.ID].B == b {
			next[b.ID] = nil
		}
	}
	for len(next) > 0 && next[len(next)-1] == nil {
		next = next[:len(next)-1]
	}
	s.table.Store(&next)
	s.refresh()
	live := make(map[string]bool, len(next)) // ByName's answer for every name at once
	for _, m := range next {
		if m != nil && !m.B.Retired() {
			live[m.B.Name] = true
		}
	}
	for _, b := range gone {
		if s.c.Forget != nil {
			s.c.Forget(b.ID)
		}
		if !live[b.Name] {
			// Not back under another slot meanwhile: its series go.
			s.c.Series.deleteBackend(b.Name)
		}
		s.c.Log.Info("backend released", "backend", b.Name, "id", b.ID)
	}
}

// runRelease releases expired slots every half grace (at least every
// 100ms, at most every minute) until the set's context ends, so that a
// fleet that stops changing still lets go of its leavers.
func (s *Set) runRelease() {
	ctx := s.ctx
	s.every(ctx, func() time.Duration {
		return min(max(s.c.Fleet.Grace()/2, 100*time.Millisecond), time.Minute)
	}, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if ctx.Err() == nil {
			s.release(s.c.Now())
		}
	})
}

// deleteBackend deletes every series of the backend named name.
func (se *Series) deleteBackend(name string) {
	l := prometheus.Labels{"backend": name}
	for _, v := range []*prometheus.CounterVec{se.Requests, se.InputTokens, se.OutputTokens, se.Ejections, se.UpstreamErrors} {
		if v != nil {
			v.DeletePartialMatch(l)
		}
	}
	for _, v := range []*prometheus.HistogramVec{se.TTFT, se.E2E, se.ITL} {
		if v != nil {
			v.DeletePartialMatch(l)
		}
	}
	for _, v := range se.Others {
		v.DeletePartialMatch(l)
	}
}
