package admission

import (
	"testing"
	"time"
)

// TestQueueObjectiveDeadline: a waiter with a time to first token
// objective is taken by arrival + objective, its promise, ahead of one
// whose deadline (slack x cost) or objective lies later, FCFS keeps order.
func TestQueueObjectiveDeadline(t *testing.T) {
	t0 := time.Unix(1000, 0)
	all := func(string) bool { return true }
	for _, tc := range []struct {
		order Order
		want  []string
	}{
		{Deadline, []string{"tight", "cheap", "loose"}},
		{FCFS, []string{"loose", "cheap", "tight"}},
	} {
		q := NewQueue(tc.order, 4, 5*time.Second)
		// loose: arrives first with a 10 s objective; cheap: 100 ms of
		// work (deadline t0+1ms+400ms); tight: arrives last, 200 ms objective.
		q.Push(&Entry{Model: "m", Enqueued: t0, Cost: time.Millisecond, Objective: 10 * time.Second, Value: "loose"})
		q.Push(&Entry{Model: "m", Enqueued: t0.Add(time.Millisecond), Cost: 100 * time.Millisecond, Value: "cheap"})
		q.Push(&Entry{Model: "m", Enqueued: t0.Add(2 * time.Millisecond), Cost: time.Second, Objective: 200 * time.Millisecond, Value: "tight"})
		for _, w := range tc.want {
			if e := q.Next(all); e == nil || e.Value != w {
				t.Fatalf("%v: next %v, want %s", tc.order, e, w)
			}
		}
	}
}
