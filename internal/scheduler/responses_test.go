package scheduler

import (
	"errors"
	"testing"
	"time"
)

// TestRouteStoredResponse: a continuation of a stored response goes to
// the engine that stored it whatever the policy prefers; its engine
// ejected is a 503 (ErrNoBackend), gone from the fleet the engine's 404
// (ErrResponseGone); an unknown or expired id is routed as any request.
func TestRouteStoredResponse(t *testing.T) {
	tests := []struct {
		name    string
		eject   bool
		remove  bool
		exclude []int
		age     time.Duration
		id      string
		want    error
		wantID  int // -1: the policy's pick
	}{
		{"pinned", false, false, nil, 0, "resp_a", nil, 2},
		{"pinned an hour later", false, false, nil, time.Hour, "resp_a", nil, 2},
		{"home ejected", true, false, nil, 0, "resp_a", ErrNoBackend, 0},
		{"home excluded after a failure", false, false, []int{2}, 0, "resp_a", ErrNoBackend, 0},
		{"home gone", false, true, nil, 0, "resp_a", ErrResponseGone, 0},
		{"unknown id", false, false, nil, 0, "resp_other", nil, -1},
		{"expired", false, false, nil, DefaultResponseTTL + time.Second, "resp_a", nil, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFleet(t, 3, "m")
			home := f.Snapshot().All[2]
			p := &fixed{i: 0}
			s := New(f, p, Config{})
			s.ResponseStored("resp_a", home, t0)
			if tt.eject {
				f.SetHealthy(home, false)
			}
			if tt.remove {
				f.Remove(home, t0)
			}
			v := view("m", text(1, 300))
			v.PreviousResponseID = tt.id
			a, err := s.Route(v, tt.exclude, t0.Add(tt.age))
			if !errors.Is(err, tt.want) {
				t.Fatalf("error %v, want %v", err, tt.want)
			}
			if err != nil {
				return
			}
			defer a.Done(t0)
			want := f.Snapshot().All[0]
			if tt.wantID >= 0 {
				want = f.Snapshot().All[tt.wantID]
			}
			if a.Backend != want {
				t.Fatalf("routed to %s, want %s", a.Backend.Name, want.Name)
			}
		})
	}
}

// TestResponseTableBound: the table keeps at most its bound, the oldest
// learnt going first, and a later learning of an id wins.
func TestResponseTableBound(t *testing.T) {
	f := newFleet(t, 2, "m")
	a, b := f.Snapshot().All[0], f.Snapshot().All[1]
	s := New(f, &fixed{}, Config{})
	s.SetResponseBounds(time.Hour, 2)
	s.ResponseStored("r1", a, t0)
	s.ResponseStored("r2", a, t0)
	s.ResponseStored("r3", b, t0)
	if _, ok := s.ResponseHome("r1", t0); ok {
		t.Fatal("the oldest entry was kept past the bound")
	}
	s.LearnResponse(a, HashResponse("r3"), t0.Add(-time.Second).UnixNano())
	if name, _ := s.ResponseHome("r3", t0); name != b.Name {
		t.Fatalf("an older learning replaced a newer one: %s", name)
	}
	s.LearnResponse(a, HashResponse("r3"), t0.Add(time.Second).UnixNano())
	if name, _ := s.ResponseHome("r3", t0); name != a.Name {
		t.Fatalf("a newer learning did not win: %s", name)
	}
}
