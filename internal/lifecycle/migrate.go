package lifecycle

import (
	"errors"
	"net/http"
	"time"

	"github.com/kvroute/kvroute/internal/members"
	"github.com/kvroute/kvroute/internal/request"
)

// RoleContinued is the role of a leg that continues a stream its engine
// broke (Plane.Continue).
const RoleContinued = "continued"

// Continued is the response of a leg that continues a broken stream.
type Continued struct {
	// Resp is the new engine's 2xx response; Head and HeadErr what was
	// read of its body (its first byte).
	Resp    *http.Response
	Head    []byte
	HeadErr error
	// From and To name the engines the stream moved between.
	From, To string
	// Uncached is the continuation's prompt tokens the new engine was
	// predicted not to hold: the prefill the move costs.
	Uncached int
}

var (
	// ErrNotMoved is a continuation that found no backend to go to.
	ErrNotMoved = errors.New("no backend to continue the stream on")
	// errProbesOut is a continuation routed to a half-open backend whose
	// probes are out.
	errProbesOut = errors.New("the backend is half-open and its probes are out")
)

// Continue moves request r, whose last leg's stream its engine broke
// with cause after the client had part of it (nil: the router cut it, a
// drain, which says nothing of the engine), to another engine: a new
// leg, routed on the continuation's view v by the same scheduler (away
// from every engine the request failed on, not from those it was drained
// from), sends body once. The new leg
// becomes the request's last: its response is the one the front relays
// from here on, and Settle judges and releases it as any last leg. The
// broken leg is judged by cause and its load released once a new leg
// exists (otherwise Settle judges it by the broken body, as any broken
// stream). A continuation that fails before its first byte (or is
// refused) is judged and released here and its error returned: the
// front may try again, each time with the leg that broke last.
//
// The request is not admitted again (it holds no grant: its load moved
// with it), counted again in the routed requests, nor its TTFT observed
// again; the new engine's first byte is its prefill's end, as for any
// leg.
func (p *Plane) Continue(r *Request, body []byte, v *request.View, cause error) (*Continued, error) {
	now := time.Now()
	old := r.Leg()
	tried := append([]int(nil), old.Tried...)
	if cause != nil || !old.responded {
		// An engine the request failed on. A drained one did not fail:
		// the snapshot leaves it out while it drains, and once it is
		// back (a rolling restart) the stream may come back to it when
		// the engine it went to drains in turn.
		tried = append(tried, old.Target.B.ID)
	}
	l := Leg{Role: RoleContinued, View: v, Tried: tried}
	r.trace.RouteStart()
	a, err := p.Sched.RoutePrecise(v, p.Sched.Hashes(v), nil, tried, now)
	r.trace.RouteEnd(a, err)
	if err != nil {
		return nil, ErrNotMoved
	}
	if old.responded {
		// The stream that broke: judged once, here, and its engine's
		// load released (Settle's judgement reads only the last leg's
		// body).
		p.judge(r, old, cause, BodyEnd{})
		old.A.Done(now)
		p.wake()
	}
	r.Legs = append(r.Legs, l)
	r.cur = len(r.Legs) - 1
	nl := r.Leg()
	p.assign(r, nl, a)
	c := &Continued{From: old.Target.B.Name, To: nl.Target.B.Name, Uncached: max(0, v.PromptTokens-a.MatchedTokens)}
	p.Log.Warn("stream moved", "request_id", r.ID, "from", c.From, "to", c.To, "err", cause)
	if !p.Set.Allow(nl.Target) {
		nl.A.Done(time.Now())
		return nil, errProbesOut
	}
	out := nl.outbound(r.out.Context(), r.out, &r.base, false, body)
	at := p.try(r, nl, out, false)
	if at.err == nil && at.resp.StatusCode/100 != 2 {
		// A refusal (4xx) of the continuation says nothing of the
		// engine; the stream cannot go on there.
		nl.status = at.resp.StatusCode
		at.close()
		nl.A.Done(time.Now())
		return nil, members.StatusError(at.resp.StatusCode)
	}
	if at.err != nil {
		r.trace.AttemptFailed(at.err)
		p.judge(r, nl, at.err, BodyEnd{})
		at.close()
		nl.A.Done(time.Now())
		return nil, at.err
	}
	nl.responded, nl.status = true, at.resp.StatusCode
	c.Resp, c.Head, c.HeadErr = at.resp, at.head, at.headErr
	return c, nil
}
