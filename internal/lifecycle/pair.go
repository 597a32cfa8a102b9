package lifecycle

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/internal/scheduler"
)

// ErrPairFailed is the cause that ends a leg's attempt when the Beside leg
// sent with it failed first: the leg's engine waits for a KV cache that
// will never come (SGLang's decode engine waits for its prefill engine's
// bootstrap until its own timeout), so the router stops waiting.
var ErrPairFailed = errors.New("the prefill leg sent with this leg failed before its first byte")

// pairGuard is one sending of a pair: a Beside leg and the leg sent with
// it. Whichever happens first wins: the leg's first byte (the pair served:
// a later failure of the Beside leg is only judged), or the Beside leg's
// failure (the leg's attempt is cancelled, and the pair sent again).
type pairGuard struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	// state: 0 undecided, 1 the leg has its first byte, 2 the Beside leg
	// failed first.
	state atomic.Int32
}

func newPairGuard(parent context.Context) *pairGuard {
	g := &pairGuard{}
	g.ctx, g.cancel = context.WithCancelCause(parent)
	return g
}

// served reports that the leg has its first byte, unless the Beside leg
// failed first.
func (g *pairGuard) served() bool {
	return g.state.CompareAndSwap(0, 1) || g.state.Load() == 1
}

// fail ends the leg's wait, unless it already has its first byte.
func (g *pairGuard) fail(err error) {
	if g != nil && g.state.CompareAndSwap(0, 2) {
		g.cancel(errors.Join(ErrPairFailed, err))
	}
}

// besideFailed reports whether the Beside leg failed first.
func (g *pairGuard) besideFailed() bool { return g.state.Load() == 2 }

// pair runs a Beside leg (pre, SGLang's prefill) and the leg after it (l,
// the decode) as SGLang's router runs a pair: both sent at once with one
// body naming the prefill engine and a fresh bootstrap room (Bind), the
// client reading l's response. When either fails before l's first byte
// the pair is sent again, with a new room: on another engine of pre's
// role when pre failed (connection refused, 5xx: l's wait is cancelled at
// once rather than left to the decode engine's own bootstrap timeout), on
// another engine of l's role when l failed (pre's attempt, now useless, is
// ended first, and its engine chosen anew). At most Attempts times in all, as SGLang's router retries
// a pair; then l's 5xx passes through, or the failure is the answer (502,
// 504 for a timeout). l's wait is bounded as any attempt's is
// (upstream.first_token_timeout, upstream.response_header_timeout).
func (p *Plane) pair(r *Request, pre, l *Leg, req *http.Request, base *url.URL, first, last bool) attempt {
	ctx := req.Context()
	for {
		p.probe(r, pre)
		p.probe(r, l)
		if p.Bind != nil {
			p.Bind(r)
		}
		g := newPairGuard(ctx)
		p.beside(r, pre, req, base, g)
		out := l.outbound(g.ctx, req, base, first && pre.Retries+l.Retries == 0, l.body(r.Body, nil))
		at := p.try(r, l, out, last)
		if at.err == nil && g.served() {
			return at
		}
		if at.err == nil { // pre failed just before l's first byte
			at.close()
			at = attempt{err: context.Cause(g.ctx)}
		}
		r.trace.AttemptFailed(at.err)
		if ctx.Err() != nil {
			at.close()
			return attempt{err: ctx.Err()}
		}
		failed := l
		if g.besideFailed() {
			<-pre.done
			failed, at.err = pre, pre.failed
			at.close()
			at.resp = nil
		} else {
			pre.waitBeside() // its room is abandoned: end it, unjudged
			pre.failed = nil
		}
		g.cancel(nil)
		next := p.reroutePair(r, pre, l, failed)
		if next == nil {
			// Out of attempts or of engines: Settle judges the failed leg.
			failed.failed = at.err
			if failed == l && at.resp != nil {
				at.err = nil // l's 5xx passes through
			}
			return at
		}
		p.judge(r, failed, at.err, BodyEnd{})
		failed.failed = nil
		at.close()
		failed.A.Done(time.Now())
		p.Log.Warn("retry pair", "request_id", r.ID, "role", failed.Role, "from", failed.Target.B.Name, "to", next.Backend.Name,
			"attempt", pre.Retries+l.Retries+2, "err", at.err)
		if p.Retried != nil {
			p.Retried()
		}
		p.assign(r, failed, next)
		failed.Retries++
		if failed == l {
			// The prefill engine is chosen again too, as SGLang's router
			// selects a new pair: its abandoned attempt released its load.
			p.repick(r, pre)
		}
	}
}

// repick routes leg l anew (its engines tried before not excluded), its
// assignment released: for a leg sent again through no fault of its
// engine. It keeps its engine when no other can be routed to.
func (p *Plane) repick(r *Request, l *Leg) {
	now := time.Now()
	next, err := p.route(r, l, now)
	if err != nil {
		return
	}
	l.A.Done(now)
	p.assign(r, l, next)
}

// reroutePair is the next engine for the failed leg of a pair (pre or l),
// nil when the pair is out of attempts (Attempts over both legs) or the
// leg's role is out of engines.
func (p *Plane) reroutePair(r *Request, pre, l, failed *Leg) *scheduler.Assignment {
	if pre.Retries+l.Retries >= p.Attempts {
		return nil
	}
	failed.Tried = append(failed.Tried, failed.Target.B.ID)
	next, _ := p.route(r, failed, time.Now())
	return next
}
