package lifecycle

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/scheduler"
)

// Settle ends the request, exactly once: the front's one deferred call,
// also when the front aborts a response (aborted: the reverse proxy's
// panic on a body broken after the headers). It settles the status, judges
// each leg's last attempt (the breaker's one feed at the end of a
// request), releases every assignment and wakes the admission queue,
// counts the request and its tokens and what it attained of its
// objectives (Attained), logs its decision, then lets the front write its
// own records.
func (p *Plane) Settle(r *Request, aborted bool) {
	now := time.Now()
	r.Status = r.final(aborted)
	end := r.front.Ended()
	routed := false
	for i := range r.Legs {
		l := &r.Legs[i]
		if l.A == nil {
			continue
		}
		l.waitBeside()
		if i == len(r.Legs)-1 && l.responded {
			l.end = end
		}
		p.judge(r, l, l.failed, l.end)
		if l.end.HasCached && l.end.Complete {
			l.A.Reported(r.report(l.end), now)
		}
		decoded(l, now)
		l.A.Done(now)
		routed = true
	}
	if routed {
		p.wake()
	}
	p.count(r, end, now)
	p.attained(r, end)
	if p.Split != nil {
		if t, ok := r.legTimes(); ok {
			p.Split(r, t)
		}
	}
	p.record(r)
	r.front.Settled(r)
}

// report is what the engine said of the request's last leg, for the
// audit of the prefix picture: its cached and prompt tokens, and the
// observed TTFT of a streamed response.
func (r *Request) report(end BodyEnd) scheduler.Report {
	rep := scheduler.Report{Cached: end.Cached, Prompt: end.In}
	if r.View != nil && r.View.Stream {
		rep.TTFT = r.TTFT
	}
	return rep
}

// decoded teaches leg l's backend its stream's inter-token timings as
// relayed (scheduler.Assignment.Decoded): those of a complete 2xx stream
// that this leg answered, of more than one token.
func decoded(l *Leg, now time.Time) {
	if e := l.end; e.Complete && e.Counted && e.Out > 1 && e.Decoding > 0 {
		l.A.Decoded(int64(e.Out-1), e.Decoding, now)
	}
}

// final is the request's status: the one answered, else 502 for a
// response the front aborted, else 499 (the client left before an answer
// was known).
func (r *Request) final(aborted bool) int {
	switch {
	case r.answered != 0:
		return r.answered
	case aborted:
		return http.StatusBadGateway
	}
	return StatusClientGone
}

// judge feeds the breaker of leg l's backend with the outcome of one
// attempt, the one place where a request's outcome reaches a breaker:
// failed (a connection error, a timeout, a 5xx, passed through or not)
// and a body the backend broke count against the backend, a complete 2xx
// body for it, and anything else says nothing of its health: a 4xx is the
// backend's answer to the client's mistake, and a client that left ended
// the body itself. A failed attempt that is retried is judged at once (its
// backend may be ejected while the retry runs); the last attempt of each
// leg by Settle, once.
func (p *Plane) judge(r *Request, l *Leg, failed error, end BodyEnd) {
	switch {
	case failed != nil:
		p.Set.Failed(l.Target, failed)
	case end.Broken != nil:
		// The backend broke the response after it started; the client
		// saw a truncated body. Never retried.
		p.Set.Failed(l.Target, end.Broken)
		p.Log.Warn("response broken after first byte", "request_id", r.ID, "backend", l.Target.B.Name, "err", end.Broken)
	case end.Complete && l.status/100 == 2:
		p.Set.Succeeded(l.Target, false)
	}
}

// count counts the request in the backend's series (or as answered by the
// router), with its whole duration for a completion and its tokens for a
// complete 2xx body.
func (p *Plane) count(r *Request, end BodyEnd, now time.Time) {
	policy := p.policy()
	t := r.Leg().Target
	if t == nil { // a request the router answered itself has none
		if p.Unrouted != nil {
			p.Unrouted(policy, r.Model, r.Status)
		}
		return
	}
	t.Count(policy, r.Model, r.Status)
	if r.View != nil && !r.Passthrough {
		t.ObserveE2E(r.Model, now.Sub(r.Start))
	}
	if end.Counted && end.Complete {
		t.CountTokens(r.Model, end.In, end.Out)
	}
}

// record tells the decision log of a settled routed request (Recorder);
// it reads the request's view, never its body.
func (p *Plane) record(r *Request) {
	if r.View == nil || p.Decisions == nil {
		return
	}
	p.Decisions.Decided(r)
}

// SkipReason is why leg l was skipped, "" when it was not.
func (l *Leg) SkipReason() string {
	switch {
	case l.A == nil:
		return "no backend"
	case l.skipped:
		return "failed on " + l.Target.B.Name
	}
	return ""
}

// ServedWhole reports whether leg l, the last of a split request, served
// it whole: its Rewrite said so (the earlier leg's answer unusable), or
// every earlier leg was skipped.
func (l *Leg) ServedWhole(r *Request) bool {
	if len(r.Legs) < 2 || l != &r.Legs[len(r.Legs)-1] {
		return false
	}
	if l.Whole != "" {
		return true
	}
	for i := range r.Legs[:len(r.Legs)-1] {
		if !r.Legs[i].skipped {
			return false
		}
	}
	return true
}

// Reason is why the request went where it went: its leg's decision
// (prefixed "whole (why): " for a request the router chose not to split),
// or for a request of several legs each leg's role, backend and decision,
// in order ("prefill a: ...; decode b: ..."): a leg sent more than once
// says after how many retries, a skipped leg why, and a decode leg that
// served the request whole after its prefill leg was skipped says so
// ("decode b (whole): ...").
func (r *Request) Reason() string {
	if len(r.Legs) == 1 {
		a := r.Legs[0].A
		switch {
		case a == nil:
			return ""
		case r.Whole != "":
			return "whole (" + r.Whole + "): " + a.Reason
		}
		return a.Reason
	}
	var b strings.Builder
	for i := range r.Legs {
		l := &r.Legs[i]
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(l.Role)
		switch {
		case l.A == nil:
			b.WriteString(" skipped (no backend)")
			continue
		case l.skipped:
			b.WriteString(" skipped after failing on " + l.Target.B.Name)
			continue
		}
		b.WriteString(" " + l.Target.B.Name)
		if l.ServedWhole(r) {
			b.WriteString(" (whole)")
		}
		switch {
		case l.Retries == 1:
			b.WriteString(" after 1 retry")
		case l.Retries > 1:
			b.WriteString(" after " + strconv.Itoa(l.Retries) + " retries")
		}
		b.WriteString(": " + l.A.Reason)
	}
	return b.String()
}
