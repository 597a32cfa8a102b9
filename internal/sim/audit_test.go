package sim

import (
	"math"
	"slices"
	"testing"

	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/report"
)

// resetRun runs chat on engines whose engine 0 has its prefix cache
// cleared behind the router's back halfway (Faults.RestartAt, which the
// approximate index cannot see), routed approximately by policy. It
// returns the run, how many requests were routed to engine 0 from the
// reset until the audit forgot its blocks (-1: never), and the audit's
// verdicts on engine 0 before the reset.
func resetRun(t *testing.T, engines, limit int, pol string) (run report.Run, detectedAfter int, before map[string]uint64) {
	t.Helper()
	presets, reqs := fixture(t, "chat", engines, limit, 0.7)
	reset := reqs[len(reqs)/2].At
	s, err := newSim(reqs, Config{Engines: presets, Policy: pol, Seed: 1, Faults: Faults{RestartAt: reset}})
	if err != nil {
		t.Fatal(err)
	}
	audit := s.sched.Audit()
	detectedAfter = -1
	routedThere := 0
	for _, k := range s.order {
		r := &s.reqs[k]
		s.until(r.At)
		if r.At >= reset && before == nil {
			before = audit.Backend(0).Actions
		}
		prev, _ := s.nodes[0].b.Routed()
		s.arrive(k)
		if now, _ := s.nodes[0].b.Routed(); now != prev && r.At >= reset {
			routedThere++
		}
		if detectedAfter < 0 && before != nil && audit.Backend(0).Actions["forget"] > before["forget"] {
			detectedAfter = routedThere
		}
	}
	s.until(-1)
	s.finish()
	return s.result(), detectedAfter, before
}

// predictionError is the hit-rate prediction error in points, |predicted
// - reported| cached tokens over prompt tokens, of the requests of run on
// backend that started in [from, from+n) of its requests starting at or
// after at, in start order; NaN when there are fewer than n.
func predictionError(run report.Run, backend string, at, from, n int) float64 {
	var on []report.Sample
	for _, s := range run.Samples {
		if s.Backend == backend && s.Err == "" && int(s.Start) >= at {
			on = append(on, s)
		}
	}
	slices.SortFunc(on, func(a, b report.Sample) int { return int(a.Start - b.Start) })
	if len(on) < from+n {
		return math.NaN()
	}
	var pred, rep, prompt int
	for _, s := range on[from : from+n] {
		pred += s.MatchedTokens
		rep += s.CachedTokens
		prompt += s.PromptTokens
	}
	return 100 * math.Abs(float64(pred-rep)) / float64(prompt)
}

// TestResetPrefixCacheDetected is issue 26's target: an engine whose
// cache is cleared behind the router's back is detected from its reported
// cached tokens within 20 requests, and the hit-rate prediction error on
// it is back under 5 points over the next 40 requests; the audit makes no
// verdict on a picture that was right before.
func TestResetPrefixCacheDetected(t *testing.T) {
	run, after, before := resetRun(t, 3, 900, policy.Default)
	for v, n := range before {
		if n != 0 {
			t.Errorf("before the reset the audit said %s %d times", v, n)
		}
	}
	t.Logf("reset detected after %d requests on engine 0", after)
	if after < 0 || after > 20 {
		t.Errorf("reset detected after %d requests routed to the engine, want within 20", after)
	}
	presets, reqs := fixture(t, "chat", 3, 900, 0.7)
	_ = presets
	reset := int(reqs[len(reqs)/2].At)
	name := run.Samples[0].Backend
	for _, s := range run.Samples {
		if s.Backend < name {
			name = s.Backend
		}
	}
	e := predictionError(run, name, reset, 20, 40)
	t.Logf("hit-rate prediction error on %s, requests 20-60 after the reset: %.1f points", name, e)
	if !(e < 5) {
		t.Errorf("prediction error %.1f points over requests 20-60 after the reset, want under 5", e)
	}
}
