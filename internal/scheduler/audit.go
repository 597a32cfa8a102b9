package scheduler

import (
	"time"

	"github.com/kvroute/kvroute/internal/prefix"
)

// The scheduler owns the audit of its prefix picture (prefix.Audit): the
// route records what the index predicted for the chosen backend and the
// best any candidate held, the caller reports what the engine said it
// reused once the request ends (Assignment.Reported), and the verdict is
// applied to the index here, the index's one writer for it.

// Audit returns the audit of the prefix picture against the engines'
// reported cached tokens.
func (s *Scheduler) Audit() *prefix.Audit { return s.audit }

// untrust zeroes the matches of the candidates whose picture the audit
// untrusted, after noting each candidate's raw match and the best of
// them: the pick sees no cache on an untrusted backend, while the audit
// keeps comparing what the index would have predicted.
func (s *Scheduler) untrust(sc *scratch) {
	sc.best = 0
	for _, b := range sc.cands {
		sc.best = max(sc.best, sc.all[b.ID])
	}
	if !s.audit.AnyUntrusted() {
		sc.raw = sc.raw[:0]
		return
	}
	sc.raw = append(sc.raw[:0], sc.all...)
	for _, b := range sc.cands {
		if s.audit.Untrusted(b.ID) {
			sc.all[b.ID] = 0
		}
	}
}

// rawMatch is backend's match before untrust zeroed it.
func (sc *scratch) rawMatch(backend int) int32 {
	if backend < len(sc.raw) {
		return sc.raw[backend]
	}
	return sc.all[backend]
}

// Report is what the engine said of a finished request.
type Report struct {
	// Cached is the prompt tokens the engine reported reusing, out of
	// Prompt prompt tokens by its count (0: the router's estimate).
	Cached, Prompt int
	// TTFT is the observed time to first token, 0 when none (a
	// response that was not streamed).
	TTFT time.Duration
}

// Reported feeds the audit with what the engine reported of a's request
// and applies the verdict to the index. Only the first call counts; an
// assignment without a routing (a test's) is ignored, and so is a split
// request's decode leg, whose engine counts the KV it received from the
// prefill engine as cached.
func (a *Assignment) Reported(r Report, now time.Time) {
	s := a.sched
	if s == nil || a.transferred || !a.reported.CompareAndSwap(false, true) {
		return
	}
	id := a.Backend.ID
	v := s.audit.Observe(prefix.Observation{
		Backend: id, Policy: a.policy, Routed: a.routed,
		Prompt: int64(a.prompt), Predicted: int64(a.Predicted), Best: int64(a.Best), Fresh: a.age.Fresh(),
		Reported: int64(r.Cached), ReportedPrompt: int64(r.Prompt),
		EstTTFT: a.EstTTFT, TTFT: r.TTFT.Seconds(),
	}, now)
	switch v {
	case prefix.Forget:
		s.index.RemoveBackend(id)
	case prefix.Shrink, prefix.Grow:
		s.index.SetCapacity(id, s.audit.Capacity(id))
	}
}
