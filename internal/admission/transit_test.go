package admission

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/clocktest"
)

// TestArrivalWaitsBehindGrantInTransit: once the last waiter is granted,
// an arrival before its release queues behind it. The freed capacity is
// the granted waiter's until its load shows; admitted at once, the arrival
// would take it too, ahead of the request that waited for it.
func TestArrivalWaitsBehindGrantInTransit(t *testing.T) {
	var sat switchable
	sat.on.Store(true)
	c := newController(t, Config{}, sat.saturated)
	ctx := context.Background()
	old := enqueue(t, c, ctx, "old", 0, "A")
	sat.on.Store(false)
	c.Wake()
	r := <-old // granted and not released: its grant is in transit
	if r.err != nil {
		t.Fatal(r.err)
	}
	if c.Len() != 0 {
		t.Fatalf("queue length %d after the last waiter's grant", c.Len())
	}
	newer := make(chan result, 1)
	go func() {
		rel, err := c.Admit(ctx, "m", 0, "B")
		newer <- result{"new", rel, err}
	}()
	clock := clocktest.Start(t)
	defer clock.Stop()
	var early *result
	queued := clock.Until(time.Second, func() bool {
		select {
		case n := <-newer:
			early = &n
			return true
		default:
			return c.Len() == 1
		}
	})
	if early != nil {
		if early.err == nil {
			early.release()
		}
		t.Fatalf("an arrival was answered (error %v) while the last waiter's grant was in transit, want it queued behind", early.err)
	}
	if !queued {
		t.Fatalf("queue length %d, want the arrival queued (%s)", c.Len(), clock)
	}
	r.release()
	admitted(t, newer, clock.Scale(time.Second), "the arrival, once the grant ahead of it was released")
	waitLen(t, c, 0)
}

// TestOneFreedSlotAdmitsOne: two waiters for one backend slot; when the
// slot frees, one is granted, and no further wake-up (a first byte, a
// settle, the periodic re-check) grants the other before the first one's
// load shows, nor after, while the slot stays taken.
func TestOneFreedSlotAdmitsOne(t *testing.T) {
	var inflight atomic.Int64
	inflight.Store(1) // the one slot is taken
	c := newController(t, Config{}, func(string) bool { return inflight.Load() >= 1 })
	ctx := context.Background()
	a := enqueue(t, c, ctx, "a", 0, "A")
	b := enqueue(t, c, ctx, "b", 0, "B")
	inflight.Store(0) // the slot frees
	for range 3 {
		c.Wake()
	}
	if n := c.Len(); n != 1 {
		t.Fatalf("one freed slot admitted %d of 2 waiters", 2-n)
	}
	first := <-a
	if first.err != nil {
		t.Fatal(first.err)
	}
	inflight.Add(1) // routed: its load shows
	first.release()
	c.Wake()
	if n := c.Len(); n != 1 {
		t.Fatalf("the second waiter was admitted onto the taken slot (queue length %d)", n)
	}
	select {
	case r := <-b:
		t.Fatalf("%s admitted onto the taken slot (error %v)", r.name, r.err)
	default:
	}
	inflight.Add(-1) // the first request finishes
	c.Wake()
	admitted(t, b, time.Minute, "the second waiter, once the slot freed again")
	waitLen(t, c, 0)
}
