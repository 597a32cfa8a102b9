package policy

import (
	"fmt"
	"testing"

	"github.com/kvroute/kvroute/internal/fleet"
)

func TestSessionHashSticky(t *testing.T) {
	loads := make([]fxLoad, 4)
	cands := fxBackends(t, loads...)
	p := fxNew(t, "session-hash", Options{})
	home := map[string]int{}
	count := make([]int, len(cands))
	for k := range 400 {
		key := fmt.Sprintf("user-%d", k)
		d := p.Pick(fxInput(cands, loads, 100, key))
		if d.Note != "hash" {
			t.Fatalf("%s: note %q on an idle fleet, want hash", key, d.Note)
		}
		home[key] = d.Index
		count[d.Index]++
	}
	// Different keys spread: each of 4 backends owns roughly a quarter.
	for i, c := range count {
		if c < 60 || c > 140 {
			t.Errorf("backend %d is home to %d of 400 keys", i, c)
		}
	}
	// The same key always goes home, whichever instance asks.
	q := fxNew(t, "session-hash", Options{})
	for key, want := range home {
		if d := q.Pick(fxInput(cands, loads, 100, key)); d.Index != want {
			t.Fatalf("%s went to %d, then to %d", key, want, d.Index)
		}
	}
	// Removing a backend moves only the keys it was home to.
	rest := []int{0, 1, 3}
	sub := fxInput(nil, nil, 100, "")
	sub.Candidates = []*fleet.Backend{cands[0], cands[1], cands[3]}
	sub.Matched = make([]int32, 3)
	fxTokens(sub)
	for key, was := range home {
		sub.View.SessionKey = key
		sub.SessionHash = HashSession(key)
		now := rest[p.Pick(sub).Index]
		if was != 2 && now != was {
			t.Fatalf("%s moved from %d to %d when backend 2 left", key, was, now)
		}
	}
}

func TestSessionHashBound(t *testing.T) {
	// Find a key whose home is backend 0, then load backend 0.
	idle := make([]fxLoad, 4)
	cands := fxBackends(t, idle...)
	p := fxNew(t, "session-hash", Options{})
	key := ""
	for k := 0; key == ""; k++ {
		if p.Pick(fxInput(cands, idle, 100, fmt.Sprint("k", k))).Index == 0 {
			key = fmt.Sprint("k", k)
		}
	}
	tests := []struct {
		name       string
		inflight   []int
		loadFactor float64
		home       bool
	}{
		// total 4 + 1 over 4 backends at 1.25: bound ceil(1.5625) = 2.
		{"home within the bound", []int{1, 1, 1, 1}, 0, true},
		{"home over the bound", []int{2, 1, 1, 0}, 0, false},
		// At 2.0 the bound is ceil(2*5/4) = 3.
		{"a looser factor keeps it home", []int{2, 1, 1, 0}, 2, true},
		// Below 1 is raised to 1: bound ceil(9/4) = 3, home has 3.
		{"factor below 1 still finds a backend", []int{3, 2, 2, 1}, 0.5, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			loads := fxInFlight(tc.inflight...)
			cands := fxBackends(t, loads...)
			p := fxNew(t, "session-hash", Options{LoadFactor: tc.loadFactor})
			d := p.Pick(fxInput(cands, loads, 100, key))
			if (d.Index == 0) != tc.home {
				t.Fatalf("picked %d (%q), home=%v wanted", d.Index, d.Note, tc.home)
			}
			lf := tc.loadFactor
			if lf == 0 {
				lf = DefaultLoadFactor
			}
			total := int64(0)
			for _, n := range tc.inflight {
				total += int64(n)
			}
			if got := int64(tc.inflight[d.Index]) + 1; got > boundedLoadCap(max(lf, 1), total, len(cands)) {
				t.Fatalf("picked %d with %d in flight after, over the bound", d.Index, got)
			}
		})
	}
}

func TestSessionHashNoKey(t *testing.T) {
	loads := fxInFlight(3, 0, 2)
	cands := fxBackends(t, loads...)
	p := fxNew(t, "session-hash", Options{})
	if d := p.Pick(fxInput(cands, loads, 100, "")); d.Index != 1 || d.Note != "no-key" {
		t.Fatalf("picked %d (%q), want the least loaded 1", d.Index, d.Note)
	}
}

func TestSessionHashRingCache(t *testing.T) {
	loads := make([]fxLoad, 3)
	cands := fxBackends(t, loads...)
	p := NewSessionHash(Options{})
	p.Pick(fxInput(cands, loads, 100, "a"))
	r := p.ring.Load()
	p.Pick(fxInput(cands, loads, 100, "b"))
	if p.ring.Load() != r {
		t.Fatal("ring rebuilt for an unchanged candidate set")
	}
	p.Pick(fxInput(cands[1:], loads[1:], 100, "a"))
	if r2 := p.ring.Load(); r2 == r || len(r2.points) != 2*SessionVNodes {
		t.Fatal("ring not rebuilt for a changed candidate set")
	}
}
