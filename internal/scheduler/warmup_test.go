package scheduler

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/policy"
)

// last always picks the last candidate: with the newcomer last, it shows
// how often the newcomer is offered at all.
type last struct{}

func (last) Name() string { return "test-last" }
func (last) Pick(in *policy.Input) policy.Decision {
	return policy.Decision{Index: len(in.Candidates) - 1}
}

// TestWarmupRamp: a backend added with a warm-up is offered a share of
// requests that follows its weight, and takes requests alone when nothing
// else can.
func TestWarmupRamp(t *testing.T) {
	f := newFleet(t, 2)
	s := New(f, last{}, Config{})
	warm := f.AddWarm("new", nil, nil, t0, 10*time.Second)
	const n = 1500
	for _, at := range []time.Duration{0, 2 * time.Second, 5 * time.Second, 8 * time.Second, 10 * time.Second} {
		now := t0.Add(at)
		got := 0
		for i := range n {
			a, err := s.Route(view("", text(i, 200)), nil, now)
			if err != nil {
				t.Fatal(err)
			}
			if a.Backend == warm {
				got++
			}
			a.Done(now)
		}
		want := warm.WarmupWeight(now)
		if share := float64(got) / n; math.Abs(share-want) > 0.05 {
			t.Errorf("at +%v: newcomer offered %.3f of requests, want %.2f", at, share, want)
		}
	}
	// Alone, a warming backend takes everything.
	for _, b := range f.Snapshot().All[:2] {
		f.SetHealthy(b, false)
	}
	a, err := s.Route(view("", text(1, 200)), nil, t0)
	if err != nil || a.Backend != warm {
		t.Fatalf("only a warming backend left: got %v, %v; want the warming backend", a, err)
	}
	a.Done(t0)
}

// TestWarmupMonotone: a session admitted to a warming backend stays
// admitted as its weight grows, so warm-up does not bounce conversations.
func TestWarmupMonotone(t *testing.T) {
	f := newFleet(t, 1)
	s := New(f, last{}, Config{})
	warm := f.AddWarm("new", nil, nil, t0, 10*time.Second)
	admitted := map[string]bool{}
	for step := range 11 {
		now := t0.Add(time.Duration(step) * time.Second)
		for i := range 300 {
			v := view("", text(i, 100))
			v.SessionKey = fmt.Sprint("s", i)
			a, err := s.Route(v, nil, now)
			if err != nil {
				t.Fatal(err)
			}
			on := a.Backend == warm
			a.Done(now)
			if admitted[v.SessionKey] && !on {
				t.Fatalf("session %s admitted earlier, not at +%ds", v.SessionKey, step)
			}
			admitted[v.SessionKey] = on
		}
	}
	for k, on := range admitted {
		if !on {
			t.Fatalf("session %s not admitted after warm-up", k)
		}
	}
}

// TestRouteAfterRemove: removing a backend keeps routing right (the
// match buffer is sized by IDs, not members) and never picks it.
func TestRouteAfterRemove(t *testing.T) {
	f := newFleet(t, 3)
	s := New(f, last{}, Config{})
	gone := f.Snapshot().All[2]
	f.Remove(gone, t0)
	s.Index().RemoveBackend(gone.ID)
	for i := range 50 {
		a, err := s.Route(view("", text(i, 300)), nil, t0)
		if err != nil {
			t.Fatal(err)
		}
		if a.Backend == gone {
			t.Fatal("routed to a removed backend")
		}
		a.Done(t0)
	}

}

func TestSetPolicy(t *testing.T) {
	f := newFleet(t, 3)
	s := New(f, last{}, Config{})
	a, _ := s.Route(view("", "x"), nil, t0)
	a.Done(t0)
	s.SetPolicy(&fixed{i: 0})
	b, _ := s.Route(view("", "x"), nil, t0)
	b.Done(t0)
	if a.Backend.ID != 2 || b.Backend.ID != 0 || s.Policy().Name() != "test-fixed" {
		t.Fatalf("before %d, after %d (%s): want 2 then 0 under test-fixed", a.Backend.ID, b.Backend.ID, s.Policy().Name())
	}
}
