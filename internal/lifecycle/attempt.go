package lifecycle

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/kvroute/kvroute/internal/members"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/scheduler"
)

// Timeout is a backend that kept the router waiting past one of the
// upstream timeouts. It is a net.Error timeout (504 when no retry is left)
// and counts as a failure of the backend.
type Timeout string

func (e Timeout) Error() string { return string(e) }

// Timeout reports true: a Timeout is a net.Error timeout.
func (Timeout) Timeout() bool { return true }

// Temporary reports true, as net.Error asks.
func (Timeout) Temporary() bool { return true }

var (
	// ErrFirstByteTimeout is a backend that sent its response headers
	// and then nothing within upstream.response_header_timeout.
	ErrFirstByteTimeout error = Timeout("no response byte within upstream.response_header_timeout after the headers")
	// ErrFirstTokenTimeout is a streaming request that got no body byte
	// within upstream.first_token_timeout of being sent.
	ErrFirstTokenTimeout error = Timeout("no first token within upstream.first_token_timeout")
)

// attempt is what one try of a leg produced: a response to hand on (err
// nil), or the failure before its first byte (err), with the backend's
// 5xx response when it answered one.
type attempt struct {
	resp    *http.Response
	head    []byte
	headErr error
	err     error
}

// close drops the attempt's response.
func (at *attempt) close() {
	if at.resp != nil {
		_ = at.resp.Body.Close()
	}
}

// RoundTrip is the reverse proxy's transport: it runs the request's legs
// in order, each through its attempt loop (a Beside leg and the next one
// as a pair, pair.go), reads an earlier leg's body to its end, and hands
// the last leg's response to the front (Respond). Its error, when no
// backend produced a response, goes to Fail.
func (p *Plane) RoundTrip(r *Request, req *http.Request) (*http.Response, error) {
	base := *req.URL
	r.out, r.base = req, base
	last := len(r.Legs) - 1
	split := last > 0
	var prev *Leg
	sent := false
	for i := range r.Legs {
		r.cur = i
		l := &r.Legs[i]
		if l.skipped || (l.Beside && i < last) {
			// A Beside leg runs with the next one (pair).
			if split && !l.skipped {
				r.trace.LegStart(l)
			}
			prev = nil
			continue
		}
		if split {
			r.trace.LegStart(l)
		}
		var at attempt
		if i > 0 && r.Legs[i-1].Beside && !r.Legs[i-1].skipped {
			at = p.pair(r, &r.Legs[i-1], l, req, &base, !sent, i == last)
		} else {
			at = p.attempts(r, l, req, &base, !sent, i == last, prev)
		}
		sent = true
		if at.err != nil && !p.skip(r, l, req, at.err, i == last) {
			return nil, at.err
		}
		if l.skipped {
			at.close()
			r.trace.LegEnd(l)
			prev = nil
			continue
		}
		l.status = at.resp.StatusCode
		if i == last || refused(at.resp.StatusCode) {
			// The last leg's response is the client's; so is an earlier
			// leg's refusal (a 4xx: the client's request is at fault,
			// and the next leg would refuse it too).
			l.responded = true
			r.answer(at.resp.StatusCode, "")
			r.front.Respond(l, at.resp, at.head, at.headErr)
			return at.resp, nil
		}
		if err := p.drain(r, l, at); err != nil && !p.skip(r, l, req, err, false) {
			r.trace.LegEnd(l)
			return nil, err
		}
		// The leg's engine is done with the request: its load is released
		// now, not when the last leg's stream ends (Settle judges it).
		l.A.Done(time.Now())
		r.trace.LegEnd(l)
		prev = l
		if l.skipped {
			prev = nil
		}
	}
	panic("lifecycle: a request without legs")
}

// refused reports whether status is a backend's refusal of the request
// itself (a 4xx): the client's mistake, which says nothing of the backend
// (judge) and is the client's answer on any leg.
func refused(status int) bool { return status/100 == 4 }

// attempts is a leg's attempt loop. It sends the request to the leg's
// backend and, when that backend fails before the first response byte
// (connection error, 5xx, or a body that breaks before its first byte),
// re-routes it to another one, at most Attempts times (never a
// passthrough). It waits for the first body byte before handing the
// response on, so that nothing has reached the client while a retry is
// still possible. req is sent as it is on the first leg's first attempt;
// every other attempt sends a copy aimed from base.
func (p *Plane) attempts(r *Request, l *Leg, req *http.Request, base *url.URL, first, last bool, pre *Leg) attempt {
	ctx := req.Context()
	var prev []byte
	if pre != nil {
		prev = pre.Answer
	}
	for n := 0; ; n++ {
		p.probe(r, l)
		out := l.outbound(ctx, req, base, n == 0 && first, l.body(r.Body, prev))
		at := p.try(r, l, out, last)
		if at.err == nil {
			return at
		}
		// The attempt failed before its first byte.
		r.trace.AttemptFailed(at.err)
		if ctx.Err() != nil {
			at.close()
			return attempt{err: ctx.Err()}
		}
		drained := errors.Is(at.err, ErrDrainedWaiting) || errors.Is(at.err, ErrHungWaiting)
		var next *scheduler.Assignment
		if drained {
			next = p.away(r, l)
		} else {
			next = p.reroute(r, l)
		}
		if next == nil {
			// Out of attempts or of backends: pass a backend's 5xx
			// through as it is (it says what went wrong), else report
			// the error. Settle judges it.
			l.failed = at.err
			if at.resp != nil {
				at.err = nil
			}
			return at
		}
		at.close()
		l.A.Done(time.Now())
		if drained {
			// Planned: nothing to hold against the backend, no retry.
			p.Log.Info("resent", "request_id", r.ID, "from", l.Target.B.Name, "to", next.Backend.Name, "err", at.err)
			p.assign(r, l, next)
		} else {
			p.judge(r, l, at.err, BodyEnd{})
			p.Log.Warn("retry", "request_id", r.ID, "from", l.Target.B.Name, "to", next.Backend.Name, "attempt", l.Retries+2, "err", at.err)
			if p.Retried != nil {
				p.Retried()
			}
			p.assign(r, l, next)
			l.Retries++
		}
		if prev != nil {
			// The failed engine may have pulled the earlier leg's KV
			// cache already, which its engine then freed: the answer's
			// parameters name blocks that may be gone or reused, so the
			// earlier leg runs again for fresh ones (none: served whole).
			prev = p.again(r, pre, req, base)
		}
	}
}

// again runs an earlier leg pre once more, on an engine routed anew, for
// a later leg retried after its engine failed; it returns pre's new
// answer, or nil when pre failed (it is then skipped, and judged by
// Settle) or has no backend.
func (p *Plane) again(r *Request, pre *Leg, req *http.Request, base *url.URL) []byte {
	now := time.Now()
	next, err := p.route(r, pre, now)
	if err != nil {
		pre.skipped = true
		return nil
	}
	pre.A.Done(now) // released when its answer was read: Done is once
	p.assign(r, pre, next)
	pre.Answer, pre.end, pre.responded, pre.ended = nil, BodyEnd{}, false, time.Time{}
	at := p.attempts(r, pre, req, base, false, false, nil)
	if at.err == nil && !refused(at.resp.StatusCode) {
		pre.status = at.resp.StatusCode
		at.err = p.drain(r, pre, at)
	} else if at.err == nil {
		at.close()
		at.err = members.StatusError(at.resp.StatusCode)
	}
	pre.A.Done(time.Now())
	if at.err != nil {
		p.Log.Warn("leg skipped", "request_id", r.ID, "role", pre.Role, "backend", pre.Target.B.Name, "err", at.err)
		pre.skipped = true
		return nil
	}
	return pre.Answer
}

// probe keeps a request off a half-open backend whose probes are out: it
// goes elsewhere if any other backend can take it (releasing the first
// assignment), else probes anyway.
func (p *Plane) probe(r *Request, l *Leg) {
	if p.Set.Allow(l.Target) {
		return
	}
	l.Tried = append(l.Tried, l.Target.B.ID)
	if next, err := p.route(r, l, time.Now()); err == nil {
		l.A.Done(time.Now())
		p.assign(r, l, next)
	}
}

// reroute is the next backend for a leg whose attempt failed, nil when it
// is out of attempts (a passthrough has none unless idempotent) or of
// backends.
func (p *Plane) reroute(r *Request, l *Leg) *scheduler.Assignment {
	if r.Passthrough && !r.Idempotent || l.Retries >= p.Attempts {
		return nil
	}
	l.Tried = append(l.Tried, l.Target.B.ID)
	next, _ := p.route(r, l, time.Now())
	return next
}

// away is the next backend for a leg whose attempt its backend's drain
// or hang cut before the first byte (ErrDrainedWaiting, ErrHungWaiting):
// any other, whatever the retries spent; nil when there is none.
func (p *Plane) away(r *Request, l *Leg) *scheduler.Assignment {
	l.Tried = append(l.Tried, l.Target.B.ID)
	next, _ := p.route(r, l, time.Now())
	return next
}

// try sends out to the leg's backend once and classifies the answer: a
// response to hand on, or a failure before the first byte.
func (p *Plane) try(r *Request, l *Leg, out *http.Request, last bool) attempt {
	r.trace.Attempt(r, l, out)
	sent, ft := p.boundFirstToken(r, out)
	sent, db := p.boundDrain(r, l, sent)
	resp, err := p.Upstream.RoundTrip(sent)
	at := attempt{resp: resp, err: err}
	if err == nil && resp.StatusCode/100 == 2 {
		at.head, at.headErr = p.firstByte(resp.Body, r.View != nil && r.View.Stream && (r.View.Kind == request.Responses || r.View.Kind == request.Messages))
	}
	cut := db.done()
	if ft.done() {
		at.close()
		return attempt{err: ErrFirstTokenTimeout}
	}
	if cut != nil {
		at.close()
		return attempt{err: cut}
	}
	if err != nil {
		return at
	}
	switch {
	case resp.StatusCode >= 500:
		at.err = members.StatusError(resp.StatusCode)
	case resp.StatusCode/100 != 2:
		// The backend's own answer (a 4xx such as a too long prompt):
		// handed on; its timing says nothing of prefill.
		r.trace.FirstByte()
	case len(at.head) > 0:
		r.trace.FirstByte()
		p.firstContent(r, l, last)
	case at.headErr == io.EOF:
		r.trace.FirstByte() // an empty body, complete
	default:
		at.close()
		return attempt{err: at.headErr}
	}
	return at
}

// firstContent notes a leg's first content byte: its prefill left the
// backend's pending tokens (which may admit a held request), and for the
// last leg the request's TTFT, observed as such for a stream only (a JSON
// answer's first byte comes with its last).
func (p *Plane) firstContent(r *Request, l *Leg, last bool) {
	now := time.Now()
	l.first = now
	l.A.FirstByte(now)
	p.wake()
	if !last {
		return
	}
	r.TTFT = now.Sub(r.Start)
	if r.View != nil && r.View.Stream {
		l.Target.ObserveTTFT(r.Model, r.TTFT)
	}
}

// drain reads an earlier leg's response to its end (its answer feeds the
// next leg through that leg's Rewrite, not the client), noting how it
// ended for Settle; a failure ends the request. The engine writes its
// answer at once, so the whole body is bounded by one deadline
// (answerTimeout) from its first byte, and an answer that stalls or
// trickles fails in bounded time, charged to its engine. Its bytes are
// held in the front's budget of buffered bytes (Front.Hold) as they
// arrive: an answer the budget has no room for fails with errNoRoom.
func (p *Plane) drain(r *Request, l *Leg, at attempt) error {
	defer at.close()
	if l.failed != nil {
		return l.failed
	}
	if at.resp.StatusCode/100 != 2 {
		l.failed = members.StatusError(at.resp.StatusCode)
		return l.failed
	}
	l.responded = true
	answer, err := p.readAnswer(r, at)
	if err != nil {
		if !errors.Is(err, errNoRoom) {
			l.end.Broken = err
		}
		return err
	}
	l.Answer = answer
	l.end.Complete = true
	l.ended = time.Now()
	return nil
}

// readAnswer reads an earlier leg's answer whole: at most maxAnswer bytes,
// within answerTimeout, held in the front's budget as they arrive.
func (p *Plane) readAnswer(r *Request, at attempt) ([]byte, error) {
	answer := make([]byte, 0, min(len(at.head)+answerChunk, maxAnswer+1))
	if !r.front.Hold(int64(cap(answer))) {
		return nil, errNoRoom
	}
	answer = append(answer, at.head...)
	if at.headErr != nil {
		return answer, nil // the body ended with its first bytes
	}
	body := at.resp.Body
	t := AfterFunc(p.answerTimeout(), func() { _ = body.Close() })
	var err error
	for err == nil {
		if len(answer) == cap(answer) {
			if len(answer) > maxAnswer {
				err = errAnswerTooLong
				break
			}
			grow := min(cap(answer), maxAnswer+1-cap(answer))
			if !r.front.Hold(int64(grow)) {
				err = errNoRoom
				break
			}
			answer = append(make([]byte, 0, cap(answer)+grow), answer...)
		}
		var n int
		n, err = body.Read(answer[len(answer):cap(answer)])
		answer = answer[:len(answer)+n]
	}
	if !t.Stop() {
		// The deadline passed first: the body is (or is about to be)
		// closed, whatever the last read returned.
		return nil, ErrAnswerTimeout
	}
	if err == io.EOF && len(answer) > maxAnswer {
		err = errAnswerTooLong
	}
	if err != io.EOF {
		return nil, err
	}
	return answer, nil
}

// answerTimeout bounds the read of an earlier leg's answer after its
// first byte: upstream.stream_idle_timeout, else
// upstream.response_header_timeout, else defaultAnswerTimeout.
func (p *Plane) answerTimeout() time.Duration {
	switch {
	case p.StreamIdleTimeout > 0:
		return p.StreamIdleTimeout
	case p.HeaderTimeout > 0:
		return p.HeaderTimeout
	}
	return defaultAnswerTimeout
}

// defaultAnswerTimeout bounds an earlier leg's answer when the upstream
// timeouts are off: every read of a backend's body has a deadline.
const defaultAnswerTimeout = 30 * time.Second

// answerChunk is the first room taken for an answer past its first bytes;
// the room doubles as the answer grows.
const answerChunk = 4 << 10

var (
	// ErrAnswerTimeout is an earlier leg's answer (a prefill's) that did
	// not end within the stream idle timeout of its first byte: a
	// timeout, charged to its engine.
	ErrAnswerTimeout error = Timeout("the prefill answer did not end within upstream.stream_idle_timeout of its first byte")
	// errAnswerTooLong is an earlier leg's answer over maxAnswer bytes:
	// no engine's one-token answer is that long; charged to its engine.
	errAnswerTooLong = errors.New("the prefill answer is over 1 MiB")
	// errNoRoom is an earlier leg's answer the budget of buffered bytes
	// has no room for: the router's limit, charged to no engine.
	errNoRoom = errors.New("no room in limits.max_buffered_bytes for the prefill answer")
)

// Fail answers a request that no backend answered (the reverse proxy's
// error handler): nothing when the client left (499), else 504 for a
// timeout and 502 for anything else, with a generic message: the cause
// names the backend's address (a dial error's ip:port), which stays in
// the log.
func (p *Plane) Fail(r *Request, clientGone bool, err error) {
	if clientGone {
		r.answer(StatusClientGone, "")
		return
	}
	status, code, msg := failureStatus(err)
	retries := r.Retries()
	if retries > 0 {
		msg += " (after " + strconv.Itoa(retries) + " retries)"
	}
	p.Log.Warn("proxy error", "request_id", r.ID, "backend", r.Leg().Target.B.Name, "status", status, "retries", retries, "err", err)
	r.answer(status, "")
	r.front.WriteError(&openai.Error{Status: status, Type: openai.TypeServer, Code: code, Message: msg})
}

// failureStatus is the status, error code and client message of a
// request that no backend answered: 504 for a timeout, else 502.
func failureStatus(err error) (int, string, string) {
	if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
		return http.StatusGatewayTimeout, "backend_timeout", "the backend did not answer in time"
	}
	return http.StatusBadGateway, "backend_error", "the backend failed to answer"
}

// body is what leg l sends of the request's body, prev being the earlier
// leg's answer.
func (l *Leg) body(b, prev []byte) []byte {
	if l.Rewrite == nil {
		return b
	}
	return l.Rewrite(b, prev)
}

// skip decides what becomes of an Optional leg (not the last) that failed
// with err: it is skipped, and the request goes on to the next leg without
// its answer, unless the client left. Its failure stays for Settle to
// judge. It reports whether the leg was skipped.
func (p *Plane) skip(r *Request, l *Leg, req *http.Request, err error, last bool) bool {
	if !l.Optional || last || req.Context().Err() != nil {
		return false
	}
	if l.failed == nil && !errors.Is(err, errNoRoom) && l.end.Broken == nil {
		l.failed = err
	}
	l.skipped = true
	p.Log.Warn("leg skipped", "request_id", r.ID, "role", l.Role, "backend", l.Target.B.Name, "err", err)
	return true
}

// maxAnswer bounds the answer of a leg that feeds the next one (a
// prefill's one-token completion and its kv_transfer_params): a longer
// one fails (errAnswerTooLong).
const maxAnswer = 1 << 20

// firstByte is peek bounded by upstream.response_header_timeout: engines
// such as vLLM send a stream's headers before its prefill, so a stuck
// engine is one that sends headers and then nothing. The timeout closes
// the body, which ends the upstream request; nothing has reached the
// client yet, so the request can still be retried.
func (p *Plane) firstByte(body io.ReadCloser, agent bool) ([]byte, error) {
	read := peek
	if agent {
		read = peekToken
	}
	d := p.HeaderTimeout
	if d <= 0 {
		return read(body)
	}
	t := AfterFunc(d, func() { _ = body.Close() })
	head, err := read(body)
	if !t.Stop() {
		// The deadline passed first: the body is (or is about to be)
		// closed, whatever peek read.
		return nil, ErrFirstByteTimeout
	}
	return head, err
}

// maxAgentHead bounds what peekToken holds before the first token.
const maxAgentHead = 64 << 10

// peekToken reads a Responses or Messages stream until its first token:
// these APIs open with events sent before the prefill (response.created,
// message_start), which say nothing of when it ended, so the first byte
// that counts (TTFT, the prefill's end in the backend's load, the last
// moment to try another engine) is the first text delta's, or the end
// of a stream with none. It holds at most maxAgentHead bytes.
func peekToken(body io.Reader) ([]byte, error) {
	var head []byte
	for {
		b, err := peek(body)
		head = append(head, b...)
		if err != nil || openai.AgentStarted(head) || len(head) >= maxAgentHead {
			return head, err
		}
	}
}

// peek reads until the first byte of body arrives or the body ends.
func peek(body io.Reader) ([]byte, error) {
	buf := make([]byte, 4096)
	for {
		n, err := body.Read(buf)
		if n > 0 || err != nil {
			return buf[:n], err
		}
	}
}

// firstToken bounds a streaming attempt, from its sending to its first
// body byte, by upstream.first_token_timeout: it cancels the attempt's
// context, which ends the wait for headers and for the first byte alike.
// A nil *firstToken bounds nothing.
type firstToken struct {
	t Timer
}

// boundFirstToken returns out under the first-token bound when r is a
// streaming request and the bound is set, else out and nil.
func (p *Plane) boundFirstToken(r *Request, out *http.Request) (*http.Request, *firstToken) {
	d := p.FirstTokenTimeout
	if r.View == nil || !r.View.Stream || d <= 0 {
		return out, nil
	}
	ctx, cancel := context.WithCancelCause(out.Context())
	ft := &firstToken{t: AfterFunc(d, func() { cancel(ErrFirstTokenTimeout) })}
	// The attempt's context is a child of the request's, which the front
	// cancels when the request ends: cancel need not be kept.
	return out.WithContext(ctx), ft
}

// done stops the bound once the attempt has its first byte (or failed)
// and reports whether the bound fired first (Stop false), in which case
// the attempt's context is (or is about to be) cancelled and the attempt
// is a timeout. It is called once per attempt.
func (ft *firstToken) done() bool {
	return ft != nil && !ft.t.Stop()
}

// outbound is what an attempt of leg l sends: body, to l's backend, under
// ctx: req itself when reuse (the first leg's first attempt: the reverse
// proxy's outbound request), else a copy aimed from base.
func (l *Leg) outbound(ctx context.Context, req *http.Request, base *url.URL, reuse bool, body []byte) *http.Request {
	out := req
	switch {
	case !reuse:
		out = req.Clone(ctx)
		u := *base
		out.URL = &u
	case ctx != req.Context():
		out = req.WithContext(ctx)
	}
	setTarget(out, l.Target.B.URL)
	setBody(out, body)
	l.markSent()
	return out
}

// setTarget points out at the backend with base URL base, keeping the
// inbound path (appended to base's path) and query.
func setTarget(out *http.Request, base *url.URL) {
	u := out.URL
	u.Scheme, u.Host = base.Scheme, base.Host
	if base.Path != "" {
		if u.RawPath != "" {
			u.RawPath = base.EscapedPath() + u.RawPath
		}
		u.Path = base.Path + u.Path
	}
	out.Host = ""
}

// setBody makes body, read whole by the front, out's body.
func setBody(out *http.Request, body []byte) {
	out.ContentLength, out.TransferEncoding = int64(len(body)), nil
	if len(body) == 0 {
		out.Body, out.GetBody = http.NoBody, func() (io.ReadCloser, error) { return http.NoBody, nil }
		return
	}
	out.Body = io.NopCloser(bytes.NewReader(body))
	out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
}

// beside sends a Beside leg once, from a copy of req aimed from base, on a
// goroutine of its own, in the pair guarded by g (pair.go): its first byte
// is its prefill done, its body is read to its end and dropped, its
// failure kept for Settle to judge and, before the next leg's first byte,
// reported to g (that leg waits for a KV cache that will never come). Its
// engine's load is released when its attempt ends. It is not traced as an
// attempt of the request (the trace follows the legs run in turn; the
// leg's own span covers it).
func (p *Plane) beside(r *Request, l *Leg, req *http.Request, base *url.URL, g *pairGuard) {
	ctx, stop := context.WithCancel(req.Context())
	out := l.outbound(ctx, req, base, false, l.body(r.Body, nil))
	l.done, l.stop = make(chan struct{}), stop
	l.failed, l.status, l.responded, l.end, l.first, l.ended = nil, 0, false, BodyEnd{}, time.Time{}, time.Time{}
	go func() {
		defer close(l.done)
		fail := func(err error) {
			if ctx.Err() == nil {
				l.failed = err
				g.fail(err)
			}
		}
		resp, err := p.Upstream.RoundTrip(out)
		if err != nil {
			fail(err)
			return
		}
		defer resp.Body.Close()
		l.status = resp.StatusCode
		if resp.StatusCode >= 500 {
			fail(members.StatusError(resp.StatusCode))
			return
		}
		l.first = time.Now()
		l.A.FirstByte(l.first)
		p.wake()
		l.responded = true
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			if ctx.Err() == nil {
				l.end.Broken = err
			}
			return
		}
		l.end.Complete = true
		l.ended = time.Now()
		l.A.Done(l.ended)
		p.wake()
	}()
}

// waitBeside waits for a Beside leg's attempt to end, ending it first: by
// the time the request settles, its last leg has answered, so an attempt
// still running has nothing left to give (its engine is not judged).
func (l *Leg) waitBeside() {
	if l.done == nil {
		return
	}
	select {
	case <-l.done:
	default:
		l.stop()
		<-l.done
	}
	l.stop()
}
