package scheduler

import (
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/policy"
)

// With peers whose decisions arrive after a blind window, a routing is
// presumed to be matched by one of each peer's on the same backend for
// that window: the picker reads it in Load (not in OwnLoad or PeerLoad),
// and it is taken back once the window has passed.
func TestPresumedPeerLoad(t *testing.T) {
	tests := []struct {
		name             string
		rank, replicas   int
		window           time.Duration
		presumedInFlight int64 // on the routed backend, right after routing
	}{
		{"one router", 0, 1, 2 * time.Millisecond, 0},
		{"no blind window", 0, 3, 0, 0},
		{"two peers", 1, 3, 2 * time.Millisecond, 2},
		{"one peer", 0, 2, 10 * time.Millisecond, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t, 2)
			s := New(f, &fixed{i: 0}, Config{})
			s.SetReplicas(tc.rank, tc.replicas)
			s.SetBlindWindow(tc.window)
			v := view("m", text(1, 4000))
			a, err := s.Route(v, nil, t0)
			if err != nil {
				t.Fatal(err)
			}
			b := a.Backend
			own := b.OwnLoad()
			want := fleet.Load{InFlight: tc.presumedInFlight, PendingPrefill: tc.presumedInFlight * own.PendingPrefill}
			if got := b.Load().Add(own.Neg()); got != want {
				t.Fatalf("presumed %+v, want %+v", got, want)
			}
			if b.PeerLoad() != (fleet.Load{}) {
				t.Fatalf("peer load %+v, want none: a presumption is not a peer's report", b.PeerLoad())
			}
			// The next routing after the window takes the presumption back
			// before its pick, and presumes its own.
			a.Done(t0)
			a2, err := s.Route(v, nil, t0.Add(tc.window+time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			a2.Done(t0)
			if got := a2.Backend.Load().Add(a2.Backend.OwnLoad().Neg()); got.InFlight != tc.presumedInFlight {
				t.Fatalf("after the window: presumed %+v, want %d in flight (the second routing's only)", got, tc.presumedInFlight)
			}
		})
	}
}

// burstSeen picks the first candidate and records Input.Burst.
type burstSeen struct{ bursts []bool }

func (*burstSeen) Name() string { return "test-burst" }

func (p *burstSeen) Pick(in *policy.Input) policy.Decision {
	p.bursts = append(p.bursts, in.Burst)
	return policy.Decision{}
}

// A replica is in a burst while a routing of its own is within the blind
// window: the policy is told so.
func TestBurst(t *testing.T) {
	pol := &burstSeen{}
	s := New(newFleet(t, 2), pol, Config{})
	s.SetReplicas(0, 2)
	s.SetBlindWindow(2 * time.Millisecond)
	v := view("m", text(1, 400))
	for _, at := range []time.Duration{0, time.Millisecond, 10 * time.Millisecond, 10*time.Millisecond + 1} {
		a, err := s.Route(v, nil, t0.Add(at))
		if err != nil {
			t.Fatal(err)
		}
		a.Done(t0)
	}
	if want := []bool{false, true, false, true}; !slices.Equal(pol.bursts, want) {
		t.Fatalf("bursts %v, want %v", pol.bursts, want)
	}
}
