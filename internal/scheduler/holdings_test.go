package scheduler

import (
	"testing"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/policy"
)

// TestHoldings checks every backend's cached and uncached tokens are the
// pick's (the prefix index through split), and that Holdings changes
// nothing.
func TestHoldings(t *testing.T) {
	s := New(newFleet(t, 3), longestPrefix{}, Config{})
	v := view("", text(1, 6400)) // 1,600 tokens
	a, err := s.Route(v, nil, t0)
	if err != nil {
		t.Fatal(err)
	}
	hashes := s.Hashes(v)
	got := map[int][2]int64{}
	s.Holdings(v, hashes, func(b *fleet.Backend, c, u int64) { got[b.ID] = [2]int64{c, u} })
	for id, cu := range got {
		want := [2]int64{0, 1600}
		if id == a.Backend.ID {
			want = [2]int64{1600, 0}
		}
		if cu != want {
			t.Errorf("backend %d: cached, uncached %v; want %v", id, cu, want)
		}
	}
	if len(got) != 3 || s.Uncached(v, hashes) != 0 {
		t.Errorf("%d backends, Uncached %d; want 3 and 0", len(got), s.Uncached(v, hashes))
	}
}

// TestDecodeLegTicket checks a split request's decode leg leaves one
// token to compute on its engine, not its prompt: the decode engine
// receives the prompt's KV cache. Without it a decode engine's pending
// prefill counted the prompts of every request whose prefill leg was
// still queued on a prefill engine.
func TestDecodeLegTicket(t *testing.T) {
	s := New(newFleet(t, 1), longestPrefix{}, Config{})
	v := view("", text(2, 6400))
	dec := *v
	dec.Role = policy.RoleDecodeLeg
	a, err := s.Route(&dec, nil, t0)
	if err != nil {
		t.Fatal(err)
	}
	if l := a.Backend.Load(); l.PendingPrefill != 1 || l.InFlight != 1 {
		t.Errorf("decode leg: load %+v; want one request, one token pending", l)
	}
	a.Done(t0)
	w, err := s.Route(view("", text(3, 6400)), nil, t0)
	if err != nil {
		t.Fatal(err)
	}
	if l := w.Backend.Load(); l.PendingPrefill != 1600 {
		t.Errorf("whole request: pending %d; want its 1,600 tokens", l.PendingPrefill)
	}
}
