package lifecycle

import (
	"errors"
	"time"

	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/members"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/scheduler"
)

// A front whose data plane forwards the request itself (an Envoy external
// processor: the gateway sends the bytes, the router only picks) drives a
// routed request without RoundTrip. It hands the decision to its data
// plane (Forwarded), then reports what the data plane saw of the answer,
// in the order it sees it:
//
//	Route ─▶ Forwarded ─▶ Served (a fallback?) ─▶ Status ─▶ FirstByte ─▶ (body, in the front's Tally) ─▶ Settle
//	                  └─▶ AttemptFailed (no response) ───────────────────────────────────────────────────▶ Settle
//
// Each hook changes the request's state exactly as the router's own
// attempt loop does for the same event (firstContent, judge, assign), so
// that admission wakes, tickets settle, breakers judge and the cost model
// learns alike whatever carries the request; Settle then ends it once, the
// body's end read from the front (Front.Ended, its Tally's End). The
// hooks run on the goroutine that drives the request, as every step of
// its lifecycle does.
//
// A split request's earlier legs (a prefill the decode engine's sidecar
// runs, named to it in a header) are not seen by the front: they are
// released when the last leg's first byte comes (the prefill is done by
// then), or by Settle.

// ErrFallback is the failure charged to a picked backend when the data
// plane's answer came from another one (a fallback it tried after the
// pick failed, which it does not report otherwise).
var ErrFallback = errors.New("the data plane's attempt on the picked backend failed: another endpoint served")

// Forwarded notes that the routed request went to the data plane, which
// sends it on: every routed leg counts as sent (its attempts, its timings).
// It is called once, after Route reported true.
func (p *Plane) Forwarded(r *Request) {
	r.cur = len(r.Legs) - 1
	for i := range r.Legs {
		if l := &r.Legs[i]; l.A != nil && !l.skipped {
			l.markSent()
		}
	}
}

// Served tells the backend the data plane's answer came from, b, when it
// is known. When b is not the last leg's target (the data plane fell back
// to another endpoint after the pick failed) the pick's attempt is judged
// failed now (ErrFallback, or the failure AttemptFailed reported), as a
// retried attempt is, its assignment released, and the leg assigned to b
// through the scheduler (its load ticket and pinned blocks), as a retry's
// is; the leg counts a retry. A b the scheduler would not route this
// request to keeps the pick's released assignment, the leg's target b: its
// outcome is judged on the backend that gave it. It reports whether b was
// the pick.
func (p *Plane) Served(r *Request, b *fleet.Backend) bool {
	l := &r.Legs[len(r.Legs)-1]
	if l.Target == nil || l.Target.B == b {
		return true
	}
	m := p.Set.Of(b)
	if m == nil {
		return false
	}
	failed := l.failed
	if failed == nil {
		failed = ErrFallback
	}
	p.judge(r, l, failed, BodyEnd{})
	l.failed = nil
	now := time.Now()
	l.A.Done(now)
	l.Tried = append(l.Tried, l.Target.B.ID)
	l.Retries++
	if p.Retried != nil {
		p.Retried()
	}
	if a := p.routeTo(r, l, b, now); a != nil {
		p.assign(r, l, a)
		return false
	}
	l.Target = m
	return false
}

// routeTo asks the scheduler for leg l's assignment on backend b, every
// other backend excluded; nil when it would not route the leg there.
func (p *Plane) routeTo(r *Request, l *Leg, b *fleet.Backend, now time.Time) *scheduler.Assignment {
	all := p.Set.All()
	others := make([]int, 0, len(all))
	for _, o := range all {
		if o.B.ID != b.ID {
			others = append(others, o.B.ID)
		}
	}
	v := l.View
	if v == nil {
		v = r.View
	}
	a, err := p.Sched.RoutePrecise(v, r.Hashes, r.Keys, others, now)
	if err != nil || a.Backend != b {
		if a != nil {
			a.Done(now)
		}
		return nil
	}
	return a
}

// Status tells the status of the answer's headers: the client's answer
// from now on. A 5xx fails the attempt (judged by Settle against the
// backend that gave it); any other status is the backend's answer, judged
// on how its body ends.
func (p *Plane) Status(r *Request, status int) {
	l := &r.Legs[len(r.Legs)-1]
	l.status, l.responded = status, true
	if status >= 500 {
		l.failed = members.StatusError(status)
	} else {
		l.failed = nil
	}
	r.answer(status, "")
}

// FirstByte tells the answer's first content byte, as the router's own
// attempt loop notes it for a 2xx answer (firstContent): the prompt's
// prefill leaves the backend's pending tokens, the admission queue wakes,
// the request's TTFT is set (and observed, for a stream), and the earlier
// legs, done by now, are released. Only the first call counts; another
// status's first byte says nothing of prefill.
func (p *Plane) FirstByte(r *Request) {
	l := &r.Legs[len(r.Legs)-1]
	if !l.first.IsZero() || l.A == nil || l.status/100 != 2 {
		return
	}
	now := time.Now()
	for i := range r.Legs[:len(r.Legs)-1] {
		if e := &r.Legs[i]; e.A != nil && !e.skipped {
			e.A.Done(now)
		}
	}
	p.firstContent(r, l, true)
}

// AttemptFailed tells that the data plane's attempt on the last leg's
// backend failed without an answer (a connection refused or reset, a
// timeout): judged by Settle against that backend (or now, by Served,
// when another endpoint answers after all), and, unless an answer
// follows, the request's status is what a gateway answers for it (504
// for a timeout, else 502).
func (p *Plane) AttemptFailed(r *Request, err error) {
	l := &r.Legs[len(r.Legs)-1]
	l.failed = err
	if r.answered == 0 {
		status, code, _ := failureStatus(err)
		r.answer(status, code)
	}
}

// maxUnreported bounds how long a request whose answer the data plane
// never reports holds its load (Unreported).
const maxUnreported = 5 * time.Minute

// Unreported is how long a routed request whose data plane reports
// nothing of its answer (it asks for the decision, forwards, and ends
// the exchange: NGINX Gateway Fabric's endpoint-picker shim) should keep
// its load on its backend: the policy's estimate of its time to first
// token plus its output budget at the backend's predicted inter-token
// latency, at most five minutes. Released at once, such requests would
// leave every backend looking idle to the next pick. Settle releases it
// then, as a request whose client left (nothing is learned, no breaker
// judged); 0 when the request holds nothing. Such a request is marked
// unreported: nothing says whether it met its latency objectives, so its
// settle records no attainment (neither met nor missed, it is not counted
// in kvroute_slo_*).
func (p *Plane) Unreported(r *Request, now time.Time) time.Duration {
	l := &r.Legs[len(r.Legs)-1]
	if l.A == nil || r.View == nil || !l.first.IsZero() || l.responded {
		return 0
	}
	r.unreported = true
	budget := r.View.MaxTokens
	if budget <= 0 {
		budget = request.DefaultOutputBudget
	}
	itl := l.A.Pred.ITL
	if itl <= 0 {
		b := l.A.Backend
		load := b.KnownLoad()
		itl = b.Cost().Coeffs(now).DecodeStep(float64(load.Decoding+1), float64(load.DecodeTokens+int64(r.View.PromptTokens)))
	}
	d := time.Duration((l.A.EstTTFT + float64(budget)*itl) * float64(time.Second))
	return min(max(d, 0), maxUnreported)
}
