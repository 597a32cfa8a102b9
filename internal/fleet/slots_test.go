package fleet

import (
	"fmt"
	"net/url"
	"testing"
	"time"
)

// learn teaches b a prefill rate with one sample.
func learn(b *Backend) {
	tk := b.Start(4000, 4000, 10, t0)
	tk.FirstByte(t0.Add(time.Second))
	tk.Done(t0.Add(2 * time.Second))
}

// TestRejoinWithinGrace: a backend removed and added back by the same name
// within the grace gets its slot and learned rate back, without warm-up;
// after the grace it is a newcomer.
func TestRejoinWithinGrace(t *testing.T) {
	f := New()
	f.SetGrace(time.Minute)
	u, _ := url.Parse("http://10.0.0.1:8000")
	a := f.AddWarm("pool/10.0.0.1:8000", u, nil, t0, 10*time.Second)
	f.Add("other", nil, nil)
	learn(a)
	rate := a.PrefillRate(t0.Add(2 * time.Second))
	if a.CostSamples() != 1 {
		t.Fatal("no rate learned")
	}
	f.Remove(a, t0.Add(time.Minute))
	back := f.AddWarm("pool/10.0.0.1:8000", u, nil, t0.Add(time.Minute+59*time.Second), 10*time.Second)
	if back.ID != a.ID {
		t.Fatalf("returned within the grace in slot %d, want its own %d", back.ID, a.ID)
	}
	if back.PrefillRate(t0.Add(2*time.Second)) != rate || back.CostSamples() != 1 {
		t.Errorf("rate after rejoin %g (%d samples), want %g (1)", back.PrefillRate(t0.Add(2*time.Second)), back.CostSamples(), rate)
	}
	if w := back.WarmupWeight(t0.Add(time.Minute + 59*time.Second)); w != 1 {
		t.Errorf("a returning backend warms up again (weight %g)", w)
	}
	if got := f.Snapshot().IDs; got != 2 {
		t.Errorf("IDs = %d, want 2", got)
	}

	f.Remove(back, t0.Add(2*time.Minute))
	late := f.AddWarm("pool/10.0.0.1:8000", u, nil, t0.Add(3*time.Minute+time.Second), 10*time.Second)
	if late.CostSamples() != 0 || late.ID == back.ID {
		t.Errorf("returned after the grace: slot %d (old %d), %d cost samples; want a new slot and no rate", late.ID, back.ID, late.CostSamples())
	}
}

// TestRejoinWhileDraining: a backend removed while requests are in flight
// and added back at the same URL is the same Backend, serving again; its
// last request's end does not retire it.
func TestRejoinWhileDraining(t *testing.T) {
	f := New()
	a := f.Add("a", nil, nil)
	tk := a.Start(100, 100, 10, t0)
	f.Remove(a, t0)
	if back := f.AddWarm("a", nil, nil, t0.Add(time.Second), time.Minute); back != a {
		t.Fatal("a draining backend that returned is a new Backend")
	}
	tk.Done(t0.Add(2 * time.Second))
	if a.Retired() || a.Draining() || len(f.Snapshot().Healthy) != 1 {
		t.Errorf("returned backend retired %v, draining %v, healthy %d", a.Retired(), a.Draining(), len(f.Snapshot().Healthy))
	}
}

// TestReleaseReusesSlots: a retired backend's slot is released only after
// its grace, then given to the next newcomer, and free slots at the end
// shrink IDs.
func TestReleaseReusesSlots(t *testing.T) {
	f := New()
	f.SetGrace(10 * time.Second)
	a, b, c := f.Add("a", nil, nil), f.Add("b", nil, nil), f.Add("c", nil, nil)
	f.Remove(a, t0)
	f.Remove(c, t0)
	if got := f.Release(t0.Add(9 * time.Second)); got != nil {
		t.Fatalf("released %d within the grace", len(got))
	}
	got := f.Release(t0.Add(10 * time.Second))
	if len(got) != 2 || got[0] != a || got[1] != c {
		t.Fatalf("released %v, want a and c", ids(got))
	}
	if s := f.Snapshot(); s.IDs != 2 {
		t.Errorf("IDs = %d after freeing the last slot, want 2", s.IDs)
	}
	if d := f.Add("d", nil, nil); d.ID != a.ID {
		t.Errorf("newcomer in slot %d, want the free slot %d", d.ID, a.ID)
	}
	if b.ID != 1 || f.Slots() != 2 {
		t.Errorf("b moved to %d, or %d slots in use, want 2", b.ID, f.Slots())
	}
}

// TestChurnSlotsBounded: 200 rounds of a fleet of 8 replaced by 8 new
// names leave IDs at twice the fleet (the leavers in their grace), never
// growing with the rounds.
func TestChurnSlotsBounded(t *testing.T) {
	f := New()
	f.SetGrace(time.Second)
	var live []*Backend
	now := t0
	for round := range 200 {
		now = now.Add(2 * time.Second)
		f.Release(now)
		var next []*Backend
		for i := range 8 {
			next = append(next, f.AddWarm(fmt.Sprintf("r%d-%d", round, i), nil, nil, now, 0))
		}
		for _, b := range live {
			f.Remove(b, now)
		}
		live = next
		if ids := f.Snapshot().IDs; ids > 16 {
			t.Fatalf("round %d: IDs = %d, want at most 16", round, ids)
		}
	}
}
