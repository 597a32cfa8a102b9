package fleet

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

func TestMembership(t *testing.T) {
	tests := []struct {
		name        string
		ops         func(f *Fleet, b []*Backend)
		all, health []int
	}{
		{"drain", func(f *Fleet, b []*Backend) { f.Drain(b[1], time.Now()) }, []int{0, 1, 2}, []int{0, 2}},
		{"drain twice, undrain", func(f *Fleet, b []*Backend) { f.Drain(b[1], time.Now()); f.Drain(b[1], time.Now()); f.Undrain(b[1]) }, []int{0, 1, 2}, []int{0, 1, 2}},
		{"remove idle", func(f *Fleet, b []*Backend) { f.Remove(b[0], time.Time{}) }, []int{1, 2}, []int{1, 2}},
		{"undrain after remove refused", func(f *Fleet, b []*Backend) {
			f.Remove(b[2], time.Time{})
			if f.Undrain(b[2]) {
				t.Error("Undrain of a removed backend reported true")
			}
		}, []int{0, 1}, []int{0, 1}},
		{"drained and unhealthy", func(f *Fleet, b []*Backend) { f.Drain(b[0], time.Now()); f.SetHealthy(b[0], false); f.Undrain(b[0]) }, []int{0, 1, 2}, []int{1, 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := New()
			var bs []*Backend
			for range 3 {
				bs = append(bs, f.Add("b", nil, nil))
			}
			tt.ops(f, bs)
			s := f.Snapshot()
			if got := ids(s.All); !slices.Equal(got, tt.all) {
				t.Errorf("All = %v, want %v", got, tt.all)
			}
			if got := ids(s.Healthy); !slices.Equal(got, tt.health) {
				t.Errorf("Healthy = %v, want %v", got, tt.health)
			}
			if s.IDs != 3 {
				t.Errorf("IDs = %d, want 3", s.IDs)
			}
		})
	}
}

func TestRemoveWaitsForInFlight(t *testing.T) {
	f := New()
	b := f.Add("b0", nil, nil)
	f.Add("b1", nil, nil)
	t1 := b.Start(100, 100, 10, t0)
	t2 := b.Start(100, 100, 10, t0)
	t1.FirstByte(t0.Add(time.Second))
	if f.Remove(b, time.Time{}) {
		t.Fatal("Remove retired a backend with two requests in flight")
	}
	if !b.Draining() || slices.Contains(f.Snapshot().Healthy, b) || !slices.Contains(f.Snapshot().All, b) {
		t.Fatal("a removed backend with requests in flight must be draining: out of Healthy, still in All")
	}
	t1.Done(t0.Add(2 * time.Second))
	if b.Retired() {
		t.Fatal("retired with one request still in flight")
	}
	t2.Done(t0.Add(3 * time.Second))
	t2.Done(t0.Add(3 * time.Second))
	if !b.Retired() || slices.Contains(f.Snapshot().All, b) {
		t.Fatal("not retired after its last request ended")
	}
	assertZero(t, b)
	if nb := f.Add("b2", nil, nil); nb.ID != 2 {
		t.Errorf("new backend after a removal got ID %d, want 2 (b0's slot is kept through its grace)", nb.ID)
	}
}

// TestRemoveRace removes a backend while requests start and end on it: it
// must end retired, with nothing leaked, whatever the interleaving.
func TestRemoveRace(t *testing.T) {
	for range 50 {
		f := New()
		b := f.Add("b0", nil, nil)
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				for range 20 {
					b.Start(10, 10, 1, t0).Done(t0)
				}
			})
		}
		wg.Go(func() { f.Remove(b, time.Time{}) })
		wg.Wait()
		if !b.Retired() {
			t.Fatalf("removed idle backend not retired (in flight %d)", b.Load().InFlight)
		}
		assertZero(t, b)
	}
}

func TestWarmupWeight(t *testing.T) {
	f := New()
	b := f.AddWarm("w", nil, nil, t0, 10*time.Second)
	cold := f.Add("c", nil, nil)
	tests := []struct {
		at   time.Duration
		want float64
	}{{-time.Second, 0}, {0, 0}, {time.Second, 0.1}, {5 * time.Second, 0.5}, {10 * time.Second, 1}, {time.Hour, 1}}
	for _, tt := range tests {
		if got := b.WarmupWeight(t0.Add(tt.at)); got != tt.want {
			t.Errorf("WarmupWeight(+%v) = %g, want %g", tt.at, got, tt.want)
		}
		if got := cold.WarmupWeight(t0.Add(tt.at)); got != 1 {
			t.Errorf("backend without warm-up: weight %g, want 1", got)
		}
	}
}

// TestBatch: membership changes inside a Batch publish one snapshot, at
// its end, with all of them (a health change made meanwhile included);
// the changes take effect on the backends at once.
func TestBatch(t *testing.T) {
	f := New()
	now := time.Unix(1000, 0)
	old := f.AddWarm("old", nil, nil, now, 0)
	sick := f.AddWarm("sick", nil, nil, now, 0)
	before := f.Snapshot()
	var added []*Backend
	f.Batch(func() {
		for i := range 100 {
			added = append(added, f.AddWarm(fmt.Sprintf("b%d", i), nil, nil, now, 0))
		}
		f.Remove(old, now)
		f.SetHealthy(sick, false)
		if f.Snapshot() != before {
			t.Error("a snapshot was published inside the batch")
		}
		if !old.Draining() {
			t.Error("the removed backend is not draining at once")
		}
	})
	after := f.Snapshot()
	if after == before || len(after.All) != 101 || len(after.Healthy) != 100 {
		t.Fatalf("after the batch: %d backends, %d healthy; want 101 and 100", len(after.All), len(after.Healthy))
	}
	for _, b := range after.Healthy {
		if b == old || b == sick {
			t.Errorf("%s still healthy in the snapshot", b.Name)
		}
	}
	f.Batch(func() {})
	if f.Snapshot() != after {
		t.Error("an empty batch published a snapshot")
	}
}

// TestDrainingSince: a drain's start is the time it was given, kept by a
// second Drain and by a Remove after it, Remove's own when it starts the
// drain, and forgotten by Undrain.
func TestDrainingSince(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	later := at.Add(time.Minute)
	tests := []struct {
		name string
		ops  func(f *Fleet, b *Backend)
		want time.Time // zero: not draining
	}{
		{"serving", func(f *Fleet, b *Backend) {}, time.Time{}},
		{"drained", func(f *Fleet, b *Backend) { f.Drain(b, at) }, at},
		{"drained twice keeps the first start", func(f *Fleet, b *Backend) { f.Drain(b, at); f.Drain(b, later) }, at},
		{"undrained", func(f *Fleet, b *Backend) { f.Drain(b, at); f.Undrain(b) }, time.Time{}},
		{"drained again after an undrain", func(f *Fleet, b *Backend) { f.Drain(b, at); f.Undrain(b); f.Drain(b, later) }, later},
		{"removed", func(f *Fleet, b *Backend) {
			b.Start(10, 10, 1, t0) // in flight: not retired at once
			f.Remove(b, at)
		}, at},
		{"drained, then removed, keeps the drain's start", func(f *Fleet, b *Backend) {
			b.Start(10, 10, 1, t0)
			f.Drain(b, at)
			f.Remove(b, later)
		}, at},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := New()
			b := f.Add("b", nil, nil)
			tt.ops(f, b)
			since, ok := b.DrainingSince()
			if ok != !tt.want.IsZero() || !since.Equal(tt.want) && ok {
				t.Errorf("DrainingSince = %v, %v; want %v (zero: not draining)", since, ok, tt.want)
			}
		})
	}
}
