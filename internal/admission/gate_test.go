package admission

import (
	"math/rand/v2"
	"testing"
	"time"
)

// slots is a fleet of n request slots for the gate tests: saturated while
// every slot is taken, in virtual time.
type slots struct{ n, taken int }

func (s *slots) saturated(string, time.Time) bool { return s.taken >= s.n }

// TestGateGrantInTransit walks the gate through one freed slot and two
// waiters, and an arrival while the grant is in transit.
func TestGateGrantInTransit(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	fleet := &slots{n: 1, taken: 1}
	g := NewGate(FCFS, 0, 0, fleet.saturated)
	if g.GoesNow("m", 0, t0) {
		t.Fatal("a request went at once with every slot taken")
	}
	a, b := &Entry{Model: "m", Enqueued: t0, Value: "a"}, &Entry{Model: "m", Enqueued: t0, Value: "b"}
	g.Wait(a)
	g.Wait(b)
	if e := g.Grant(t0); e != nil {
		t.Fatalf("granted %v with every slot taken", e.Value)
	}
	fleet.taken = 0 // the slot frees
	if e := g.Grant(t0); e != a {
		t.Fatalf("granted %v, want a", e)
	}
	if e := g.Grant(t0); e != nil {
		t.Fatalf("one freed slot granted a second waiter, %v, before the first one's load showed", e.Value)
	}
	if g.GoesNow("m", 1, t0) || g.Idle() {
		t.Fatal("an arrival went at once, ahead of a grant in transit")
	}
	fleet.taken = 1 // a is routed
	g.Release()
	if e := g.Grant(t0); e != nil {
		t.Fatalf("granted %v onto the taken slot", e.Value)
	}
	fleet.taken = 0
	if e := g.Grant(t0); e != b {
		t.Fatalf("granted %v, want b", e)
	}
	g.Release()
	if !g.Idle() || g.Len() != 0 {
		t.Fatalf("gate not idle with nobody waiting: %d waiting", g.Len())
	}
}

// TestGateNeverOverfills drives a gate with random arrivals, completions
// and routings over a fleet of slots, a granted request taking its slot
// only when it is routed, some events later, as in the live router: no
// slot is ever taken twice, and within one priority nobody is granted
// before an earlier waiter or let through ahead of one.
func TestGateNeverOverfills(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	rng := rand.New(rand.NewPCG(27, 1))
	fleet := &slots{n: 3}
	g := NewGate(FCFS, 0, 0, fleet.saturated)
	take := func(what string) {
		fleet.taken++
		if fleet.taken > fleet.n {
			t.Fatalf("%s: %d slots taken of %d", what, fleet.taken, fleet.n)
		}
	}
	var transit []*Entry    // granted, not routed yet
	var lastGrant time.Time // arrival of the last waiter granted
	granted := 0
	grant := func(now time.Time) {
		if e := g.Grant(now); e != nil {
			if e.Enqueued.Before(lastGrant) {
				t.Fatalf("a waiter of %v granted after one of %v", e.Enqueued, lastGrant)
			}
			lastGrant = e.Enqueued
			transit = append(transit, e)
			granted++
		}
	}
	for i := range 10000 {
		now := t0.Add(time.Duration(i) * time.Millisecond)
		switch r := rng.IntN(10); {
		case r < 4 && len(transit) > 0: // the granted request is routed
			transit = transit[1:]
			take("routing a grant")
			g.Release()
			grant(now)
		case r < 7 && fleet.taken > 0: // a request finishes
			fleet.taken--
			grant(now)
		default: // a request arrives
			if g.GoesNow("m", 0, now) {
				if g.Len() != 0 {
					t.Fatalf("request %d went at once past %d waiters", i, g.Len())
				}
				take("an arrival let through")
				continue
			}
			g.Wait(&Entry{Model: "m", Enqueued: now})
			grant(now)
		}
	}
	if granted == 0 {
		t.Fatal("nobody waited: the walk tested nothing")
	}
	n := g.Len()
	left := g.Flush()
	if len(left) != n || g.Len() != 0 {
		t.Fatalf("Flush returned %d of %d waiters and left %d", len(left), n, g.Len())
	}
	for i := 1; i < len(left); i++ {
		if left[i].Enqueued.Before(left[i-1].Enqueued) {
			t.Fatalf("Flush out of queue order at %d", i)
		}
	}
}
