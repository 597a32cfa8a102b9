package slo

import (
	"sync/atomic"
	"time"
)

// ReserveWindow is how long the tightest objective of a request that may
// not be shed holds sheddable requests to it (Reserve).
const ReserveWindow = 10 * time.Second

// Reserve keeps the fleet's capacity for the requests that may not be
// shed. A sheddable request meets its own objective on any engine whose
// queue is shorter than that objective, and a loose one (a batch job's
// seconds) would let queues grow until the tight objectives of the
// critical and standard requests arriving after it are missed everywhere:
// an engine's queue delays everything that arrives after it, and its
// prefill slows every stream decoding beside it. So a sheddable request is
// held to the tightest time to first token and the tightest inter-token
// latency that requests that may not be shed asked for within
// ReserveWindow (Hold), where tighter than its own: it is admitted only
// where it leaves the queue short and the streams fast enough for them,
// and shed otherwise. On the simulator's mixed-objective workload at load
// 1.3 this is the difference between 18% and 99.8% of critical requests
// within their objectives (docs/benchmarks.md, "Objectives").
//
// Reserve is safe for concurrent use; the zero value holds nothing.
type Reserve struct {
	// ttft and itl are the tightest objectives noted (nanoseconds), each
	// until (Unix nanoseconds) it lapses.
	ttft, itl tightest
}

// tightest is the tightest of some durations noted within ReserveWindow.
type tightest struct{ d, until atomic.Int64 }

// note records d (> 0) at n (Unix nanoseconds).
func (t *tightest) note(d time.Duration, n int64) {
	if d <= 0 {
		return
	}
	if cur := t.d.Load(); cur > 0 && cur < int64(d) && n < t.until.Load() {
		return // a tighter one still holds
	}
	t.d.Store(int64(d))
	t.until.Store(n + int64(ReserveWindow))
}

// hold returns the tighter of d and the tightest noted that holds at n.
func (t *tightest) hold(d time.Duration, n int64) time.Duration {
	x := time.Duration(t.d.Load())
	if x <= 0 || n >= t.until.Load() {
		return d
	}
	if d <= 0 || x < d {
		return x
	}
	return d
}

// Note records o, the objective of a request that is routed, at now.
func (r *Reserve) Note(o Objective, now time.Time) {
	if o.Class == Sheddable {
		return
	}
	n := now.UnixNano()
	r.ttft.note(o.TTFT, n)
	r.itl.note(o.ITL, n)
}

// Hold returns o as a sheddable request is held to it at now: its TTFT
// objective at most the tightest noted (see Reserve). Other requests'
// objectives are returned as they are.
func (r *Reserve) Hold(o Objective, now time.Time) Objective {
	if o.Class != Sheddable {
		return o
	}
	n := now.UnixNano()
	o.TTFT, o.ITL = r.ttft.hold(o.TTFT, n), r.itl.hold(o.ITL, n)
	return o
}
