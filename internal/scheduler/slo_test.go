package scheduler

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/slo"
)

// TestShed: a request the policy sheds is refused with a ShedError (429,
// Retry-After) before any load is taken or the policy hears of it; one it
// routes carries its objectives and prediction on its assignment.
func TestShed(t *testing.T) {
	f := newFleet(t, 2, "m")
	p, err := policy.New("kvroute", policy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s := New(f, p, Config{})
	v := view("m", text(1, 2000))
	v.Objective = slo.Objective{TTFT: time.Nanosecond, Class: slo.Sheddable}
	a, err := s.Route(v, nil, t0)
	se, ok := errors.AsType[*ShedError](err)
	if !ok || a != nil {
		t.Fatalf("Route = %v, %v; want a ShedError", a, err)
	}
	if e := se.OpenAI(); e.Status != http.StatusTooManyRequests || e.Code != CodeShed || e.RetryAfter < 1 {
		t.Errorf("answer %+v", e)
	}
	for _, b := range f.Snapshot().All {
		if l := b.Load(); l.InFlight != 0 {
			t.Errorf("backend %s took load %+v", b.Name, l)
		}
	}
	v.Objective = slo.Objective{TTFT: time.Hour, ITL: time.Hour, Class: slo.Sheddable}
	a, err = s.Route(v, nil, t0)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Done(t0)
	if a.Objective != v.Objective || !a.Met || a.Pred.TTFT <= 0 || a.Pred.ITL <= 0 {
		t.Errorf("assignment objective %+v met %v pred %+v", a.Objective, a.Met, a.Pred)
	}
}

// TestSplitLegsWithoutObjectives: a leg of a split request is routed
// without objectives, so that a sheddable request's prefill leg is not
// refused on a prediction of half of it.
func TestSplitLegsWithoutObjectives(t *testing.T) {
	f := newFleet(t, 1, "m")
	p, err := policy.New("kvroute", policy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s := New(f, p, Config{})
	v := view("m", text(2, 2000))
	v.Role = "prefill"
	v.Objective = slo.Objective{TTFT: time.Nanosecond, Class: slo.Sheddable}
	a, err := s.Route(v, nil, t0)
	if err != nil {
		t.Fatalf("a prefill leg refused: %v", err)
	}
	a.Done(t0)
	if !a.Objective.None() {
		t.Errorf("the leg was routed with objectives %+v", a.Objective)
	}
}
