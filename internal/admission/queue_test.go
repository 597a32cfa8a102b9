package admission

import (
	"fmt"
	"math/rand/v2"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
)

// arrival is one entry of a table-driven queue test: name, priority,
// tenant, model, arrival offset and own cost.
type arrival struct {
	name   string
	prio   int
	tenant string
	model  string
	at     time.Duration
	cost   time.Duration
}

// drainQueue pushes arrivals into a fresh queue of order o, slack and cap
// limit, then takes every entry with ready, and returns their names in the
// order taken.
func drainQueue(t *testing.T, o Order, slack float64, limit time.Duration, arrivals []arrival, ready func(string) bool) []string {
	t.Helper()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	q := NewQueue(o, slack, limit)
	for _, a := range arrivals {
		q.Push(&Entry{Model: a.model, Priority: a.prio, Tenant: a.tenant, Enqueued: t0.Add(a.at), Cost: a.cost, Value: a.name})
	}
	if q.Len() != len(arrivals) {
		t.Fatalf("Len %d after %d pushes", q.Len(), len(arrivals))
	}
	var got []string
	for {
		e := q.Next(ready)
		if e == nil {
			break
		}
		got = append(got, e.Value.(string))
	}
	return got
}

func all(string) bool { return true }

func TestQueueOrder(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		name     string
		order    Order
		slack    float64
		limit    time.Duration // the cap; 0: an hour, out of the way
		arrivals []arrival
		ready    func(string) bool
		want     string
	}{
		{"fcfs ignores cost", FCFS, 1, 0, []arrival{
			{name: "long", at: 0, cost: 4000 * ms},
			{name: "short", at: 10 * ms, cost: 10 * ms},
		}, all, "long short"},
		{"deadline: a short prompt overtakes a long one that arrived within slack x its cost", Deadline, 1, 0, []arrival{
			{name: "long", at: 0, cost: 4000 * ms},
			{name: "short", at: 10 * ms, cost: 10 * ms},
		}, all, "short long"},
		{"deadline: but not one that waited longer than that", Deadline, 1, 0, []arrival{
			{name: "long", at: 0, cost: 4000 * ms},
			{name: "short", at: 4000 * ms, cost: 10 * ms},
		}, all, "long short"},
		{"deadline: the slack scales the bound", Deadline, 4, 0, []arrival{
			{name: "long", at: 0, cost: 1000 * ms},
			{name: "short", at: 3000 * ms, cost: 10 * ms},
		}, all, "short long"},
		{"deadline: equal deadlines keep arrival order", Deadline, 1, 0, []arrival{
			{name: "a", at: 0, cost: 20 * ms},
			{name: "b", at: 10 * ms, cost: 10 * ms},
			{name: "c", at: 20 * ms, cost: 0},
		}, all, "a b c"},
		{"priority beats deadline", Deadline, 1, 0, []arrival{
			{name: "short", at: 0, cost: 1 * ms},
			{name: "long-high", prio: 1, at: 10 * ms, cost: 9000 * ms},
		}, all, "long-high short"},
		{"tenants take turns whatever their costs", Deadline, 1, 0, []arrival{
			{name: "a-long1", tenant: "a", at: 0, cost: 5000 * ms},
			{name: "a-long2", tenant: "a", at: 1 * ms, cost: 5000 * ms},
			{name: "b-short1", tenant: "b", at: 2 * ms, cost: 1 * ms},
			{name: "b-short2", tenant: "b", at: 3 * ms, cost: 1 * ms},
		}, all, "a-long1 b-short1 a-long2 b-short2"},
		{"within a tenant, its own deadline order", Deadline, 1, 0, []arrival{
			{name: "a-long", tenant: "a", at: 0, cost: 5000 * ms},
			{name: "a-short", tenant: "a", at: 1 * ms, cost: 1 * ms},
			{name: "b-short", tenant: "b", at: 2 * ms, cost: 1 * ms},
		}, all, "a-short b-short a-long"},
		{"the cap bounds how long a long prompt can be passed", Deadline, 4, 5 * time.Second, []arrival{
			{name: "long", at: 0, cost: 10000 * ms},
			{name: "short-in-time", at: 4990 * ms, cost: 1 * ms},
			{name: "short-too-late", at: 5010 * ms, cost: 1 * ms},
		}, all, "short-in-time long short-too-late"},
		{"a saturated model does not hold up another", Deadline, 1, 0, []arrival{
			{name: "x", model: "busy", at: 0, cost: 1 * ms},
			{name: "y", model: "free", at: 1 * ms, cost: 5000 * ms},
		}, func(m string) bool { return m == "free" }, "y"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			limit := tc.limit
			if limit == 0 {
				limit = time.Hour
			}
			got := strings.Join(drainQueue(t, tc.order, tc.slack, limit, tc.arrivals, tc.ready), " ")
			if got != tc.want {
				t.Errorf("taken %q, want %q", got, tc.want)
			}
		})
	}
}

// TestQueueDeadlineBound checks the Deadline order's promise on random
// arrivals: nobody that arrived after a waiter's deadline (arrival +
// min(slack x cost, cap)) is taken before it, within one priority and
// tenant.
func TestQueueDeadlineBound(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const slack, limit = 2, 3 * time.Second
	q := NewQueue(Deadline, slack, limit)
	var taken []*Entry
	at := time.Duration(0)
	for i := range 2000 {
		at += time.Duration(rng.IntN(50)) * time.Millisecond
		// Costs from 1 ms to 5 s, heavy-tailed like prompt lengths.
		cost := time.Duration(1+rng.ExpFloat64()*500) * time.Millisecond
		q.Push(&Entry{Enqueued: t0.Add(at), Cost: min(cost, 5*time.Second), Value: i})
		if rng.IntN(3) == 0 {
			taken = append(taken, q.Next(all))
		}
	}
	for q.Len() > 0 {
		taken = append(taken, q.Next(all))
	}
	for i, e := range taken {
		deadline := e.Enqueued.Add(min(slack*e.Cost, limit))
		for _, before := range taken[:i] {
			if before.Enqueued.After(deadline) {
				t.Fatalf("entry %v (arrived %v, deadline %v) taken after entry %v that arrived at %v",
					e.Value, e.Enqueued.Sub(t0), deadline.Sub(t0), before.Value, before.Enqueued.Sub(t0))
			}
		}
	}
}

// TestQueueRemove checks that removing entries anywhere keeps the rest in
// order and the round robin intact, and that removing twice is harmless.
func TestQueueRemove(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	q := NewQueue(FCFS, 0, 0)
	es := map[string]*Entry{}
	for i, name := range []string{"a1", "b1", "a2", "c1", "b2"} {
		e := &Entry{Tenant: name[:1], Enqueued: t0.Add(time.Duration(i)), Value: name}
		es[name] = e
		q.Push(e)
		q.Push(e) // a second push of a queued entry does nothing
	}
	if q.Len() != 5 {
		t.Fatalf("Len %d, want 5", q.Len())
	}
	if !q.Remove(es["b1"]) || q.Remove(es["b1"]) {
		t.Fatal("Remove: first true, then false")
	}
	if !q.Remove(es["c1"]) {
		t.Fatal("Remove c1")
	}
	var got []string
	for e := q.Next(all); e != nil; e = q.Next(all) {
		got = append(got, e.Value.(string))
	}
	if want := []string{"a1", "b2", "a2"}; !slices.Equal(got, want) {
		t.Errorf("taken %v, want %v", got, want)
	}
	if q.Len() != 0 || q.WaitingAtOrAbove(-1<<31) {
		t.Error("queue not empty")
	}
	if q.Remove(nil) || q.Next(all) != nil {
		t.Error("empty queue: Remove(nil) and Next must find nothing")
	}
}

func TestParseOrder(t *testing.T) {
	for _, s := range []string{"", "fcfs", "deadline"} {
		o, err := ParseOrder(s)
		if err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		if s != "" && o.String() != s {
			t.Errorf("%q round trips to %q", s, o)
		}
	}
	if _, err := ParseOrder("wspt"); err == nil {
		t.Error("unknown order accepted")
	}
}

// TestSaturatedAtHoldRule is late binding's hold decision on hand-built
// fleets: hold while every healthy backend serving the model has at least
// the bound of prefill routed and not started; a first byte frees it.
func TestSaturatedAtHoldRule(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	lim := Limits{MaxPendingPrefill: DefaultHoldTokens}
	u, _ := url.Parse("http://a")
	for _, tc := range []struct {
		name    string
		pending []int64 // uncached tokens routed to each backend
		started []bool  // whether that backend's request had its first byte
		want    bool
	}{
		{"idle fleet", []int64{0, 0, 0}, nil, false},
		{"one backend with room", []int64{DefaultHoldTokens, DefaultHoldTokens, DefaultHoldTokens - 1}, nil, false},
		{"every backend at the bound", []int64{DefaultHoldTokens, 3 * DefaultHoldTokens, DefaultHoldTokens}, nil, true},
		{"a prefill done frees one", []int64{DefaultHoldTokens, DefaultHoldTokens, DefaultHoldTokens}, []bool{false, true, false}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := fleet.New()
			for i, p := range tc.pending {
				b := f.Add(fmt.Sprint(i), u, nil)
				if p > 0 {
					tk := b.Start(p, p, 1, now)
					if tc.started != nil && tc.started[i] {
						tk.FirstByte(now)
					}
				}
			}
			if got := lim.SaturatedAt(f.Snapshot().Healthy, "m", now); got != tc.want {
				t.Errorf("hold %v, want %v", got, tc.want)
			}
		})
	}
}
