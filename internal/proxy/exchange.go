package proxy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/kvroute/kvroute/internal/members"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/scheduler"
)

// Response headers the router adds; client-sent headers with this prefix
// are stripped before forwarding so that a client cannot forge them
// towards a backend.
const (
	headerPrefix  = "X-Kvroute-"
	headerBackend = "X-Kvroute-Backend"
	headerReason  = "X-Kvroute-Reason"
)

// statusClientGone labels requests whose client went away before the
// response started (nginx's convention).
const statusClientGone = 499

// exchange is one client request, owned by the handler's goroutine from
// its parse to its one settle, which counts it in the metrics, logs its
// decision, releases its load and wakes the admission queue, exactly once,
// whatever happened (a panic of the reverse proxy's copy included). The
// standard library's reverse proxy does the forwarding, with the exchange
// as its transport (RoundTrip: the attempt loop) and its error handler;
// the response body it relays is the exchange's relay (relay.go).
//
// Its life, top to bottom:
//
//	read body, parse, check context, admit   (serveCompletion)
//	route ─▶ attempt ─▶ first byte?           (RoundTrip: retry on another backend
//	           ▲            │ no                until the first byte, at most
//	           └── reroute ◀┘                   retry.attempts times)
//	relay the body                            (relay)
//	settle(status)                            (settle)
type exchange struct {
	s     *Server
	start time.Time
	// ttft is the time from arrival to the backend's first content byte,
	// 0 until it comes.
	ttft time.Duration
	// view is the request's routing view, once parsed; model its model
	// as a metric label (modelLabel).
	view   *request.View
	model  string
	body   []byte
	hashes []uint64 // the prompt's block hashes, for every attempt
	keys   []uint64 // its token-block keys for the precise index, or nil
	// tokenized is the tokenizer's answer behind keys, cached at settle
	// if the engine accepted the request (precise.go).
	tokenized tokenized
	// a is the current attempt's assignment (completions); target the
	// backend of the current attempt.
	a      *scheduler.Assignment
	target *members.Member
	// tried are the IDs of backends that failed this request.
	tried   []int
	retries int

	// status is the request's outcome: the status the client got, or 499
	// when it left first; 0 until known.
	status int
	// relay is the response body being relayed, nil before one was chosen.
	relay *relay
	// client controls the client's response (its write deadline, see
	// relay); nil without limits.client_write_timeout.
	client *http.ResponseController
	// rejected is the error code of a request the router answered itself.
	rejected string
	// held is the room taken for the body in the budget of buffered
	// bodies, given back by settle.
	held int64
	// tenant is who sent the request (tenant.go): whether it sees the
	// decision headers, and its prefix salt.
	tenant tenant
	// passthrough marks a request to another endpoint than the
	// completions (passthrough.go): its view has no prompt, and it is
	// not retried.
	passthrough bool

	// entry is the request's access log line (accesslog.go); nil
	// outside the access log's handler.
	entry *accessEntry

	// The exchange's trace (tracing.go): its context and span, the
	// current attempt's span and its first byte's; nil with tracing off.
	ctx                          context.Context
	span, attempt, firstByteSpan trace.Span
	// op is the request's GenAI operation (gen_ai.operation.name), ""
	// for none.
	op string
}

// serveCompletion serves POST /v1/chat/completions and /v1/completions.
func (s *Server) serveCompletion(kind request.Kind, w http.ResponseWriter, r *http.Request) {
	ex := &exchange{s: s, start: time.Now()}
	defer ex.settleDeferred()
	w = unwrapStatus(w)
	r = ex.begin(r, operationOf(kind))
	ex.tenant = s.tenantOf(r)
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		ex.reject(w, &openai.Error{Status: http.StatusMethodNotAllowed, Type: openai.TypeInvalidRequest, Code: "method_not_allowed", Message: r.Method + " is not allowed on " + r.URL.Path + "; use POST"})
		return
	}
	body, e := ex.readBody(w, r)
	if e != nil {
		ex.reject(w, e)
		return
	}
	v, e := request.Parse(kind, body, s.parse)
	if e == nil && v.Model == "" {
		e = errMissingModel()
	}
	if e != nil {
		ex.reject(w, e)
		return
	}
	// The session header wins over the body's session field.
	if h := s.cfg.Session.Header; h != "" {
		if k := r.Header.Get(h); k != "" {
			v.SessionKey = k
		}
	}
	v.PrefixSalt = ex.tenant.prefixSalt(v.PrefixSalt)
	ex.setView(v, body)
	if e := s.checkContext(v); e != nil {
		ex.reject(w, e)
		return
	}
	ex.hashes = s.sched.Hashes(v)
	_, span := ex.child("admission", trace.SpanKindInternal)
	release, e := s.admit(r, v.Model, s.costOf(v, ex.hashes))
	endSpan(span, errorOf(e))
	if e != nil {
		ex.reject(w, e)
		return
	}
	ex.keys = ex.tokenKeys(r.Context(), v, body)
	a, err := ex.route(ex.start)
	release() // the request's load is accounted (or it failed to route)
	if err != nil {
		ex.reject(w, routeError(err, v.Model))
		return
	}
	ex.assign(a)
	ex.forward(w, r)
}

// setView makes v the request's routing view and body its body.
func (ex *exchange) setView(v *request.View, body []byte) {
	ex.view, ex.body, ex.model = v, body, modelLabel(ex.s.fleet, v.Model)
	ex.viewSpan()
}

// route asks the scheduler for a backend, away from those tried, in a
// route span of its own: a retry's decision is traced as the first one.
func (ex *exchange) route(now time.Time) (*scheduler.Assignment, error) {
	_, span := ex.child("route", trace.SpanKindInternal)
	a, err := ex.s.sched.RoutePrecise(ex.view, ex.hashes, ex.keys, ex.tried, now)
	routeSpan(span, ex.s.policyName(), a, err)
	return a, err
}

// assign makes a the current attempt's assignment.
func (ex *exchange) assign(a *scheduler.Assignment) {
	ex.a, ex.target = a, ex.s.set.Of(a.Backend)
	ex.s.metrics.routed(ex.view, a)
}

// forward hands the request to the reverse proxy, with the exchange as its
// transport and error handler.
func (ex *exchange) forward(w http.ResponseWriter, r *http.Request) {
	if ex.s.cfg.Limits.ClientWriteTimeout > 0 {
		ex.client = http.NewResponseController(w)
		// The next request on the connection starts without a deadline.
		defer func() { _ = ex.client.SetWriteDeadline(time.Time{}) }()
	}
	rp := httputil.ReverseProxy{
		Rewrite:      ex.s.rewrite,
		Transport:    ex,
		ErrorHandler: ex.proxyError,
		ErrorLog:     ex.s.proxyLog,
		BufferPool:   bufferPool{},
		// Event streams (and any response without a length) are
		// flushed write by write by the reverse proxy itself; a JSON
		// answer with a length goes out in as few writes as it takes
		// (flushing it write by write cost 10-15% of the hop at 4 KB). A
		// JSON body the backend breaks before the router sent anything
		// ends in a closed connection without a response, which clients
		// see as a connection error (and the OpenAI SDKs retry).
		FlushInterval: 0,
	}
	rp.ServeHTTP(w, r)
}

// reject answers with a router-made error.
func (ex *exchange) reject(w http.ResponseWriter, e *openai.Error) {
	ex.status, ex.rejected = e.Status, e.Code
	if e.Status == statusClientGone {
		return // nobody to answer
	}
	e.Write(w)
}

// RoundTrip is the attempt loop. It sends the request to the current
// backend and, when that backend fails before the first response byte
// (connection error, 5xx, or a body that breaks before its first byte),
// re-routes it to another one, at most retry.attempts times. It waits for
// the first body byte before handing the response to the reverse proxy, so
// that nothing has reached the client while a retry is still possible.
// Its error, when no backend produced a response, is classified by
// failureStatus.
func (ex *exchange) RoundTrip(req *http.Request) (*http.Response, error) {
	s := ex.s
	if ex.passthrough {
		setTarget(req, ex.target.B.URL)
		setBody(req, ex.body)
		ex.startAttempt(req)
		resp, err := s.upstream.RoundTrip(req)
		if err != nil {
			ex.attemptFailed(err)
			return nil, err
		}
		ex.firstByteSeen()
		ex.a.FirstByte(time.Now())
		ex.relayResponse(resp, nil, nil)
		return resp, nil
	}
	ctx := req.Context()
	out := req
	for {
		m := ex.target
		if !s.set.Allow(m) {
			// A half-open breaker's probes are out: go elsewhere if any
			// other backend can take the request, else probe anyway.
			ex.tried = append(ex.tried, m.B.ID)
			if next, err := ex.route(time.Now()); err == nil {
				ex.a.Done(time.Now())
				ex.assign(next)
				continue
			}
		}
		if ex.retries > 0 {
			out = req.Clone(ctx)
		}
		setTarget(out, m.B.URL)
		setBody(out, ex.body)

		ex.startAttempt(out)
		sent, ft := s.boundFirstToken(ex.view, out)
		resp, err := s.upstream.RoundTrip(sent)
		var head []byte
		var perr error
		if err == nil && resp.StatusCode/100 == 2 {
			head, perr = s.firstByte(resp.Body)
		}
		if ft.done() {
			if resp != nil {
				_ = resp.Body.Close()
			}
			resp, err = nil, errFirstTokenTimeout
		}
		if err == nil {
			switch {
			case resp.StatusCode >= 500:
				err = members.StatusError(resp.StatusCode)
			case resp.StatusCode/100 != 2:
				// The backend's own answer (a 4xx such as a too long
				// prompt): not a failure of the backend, and its timing
				// says nothing of prefill.
				s.set.Succeeded(m, false)
				ex.firstByteSeen()
				ex.relayResponse(resp, nil, nil)
				return resp, nil
			default:
				if len(head) > 0 || perr == io.EOF {
					ex.firstByteSeen()
					if len(head) > 0 {
						now := time.Now()
						ex.a.FirstByte(now)
						s.adm.Wake() // its prefill left the backend's pending tokens
						ex.ttft = now.Sub(ex.start)
						m.ObserveTTFT(ex.model, ex.ttft)
					}
					// Success is recorded when the body ends (settle): a
					// backend that starts responses and then breaks them
					// must collect consecutive failures.
					ex.relayResponse(resp, head, perr)
					return resp, nil
				}
				_ = resp.Body.Close()
				resp, err = nil, perr
			}
		}

		// The attempt failed before its first byte.
		ex.attemptFailed(err)
		if ctx.Err() != nil {
			if resp != nil {
				_ = resp.Body.Close()
			}
			return nil, ctx.Err()
		}
		s.set.Failed(m, err)
		var next *scheduler.Assignment
		if ex.retries < s.cfg.Retry.Attempts {
			ex.tried = append(ex.tried, m.B.ID)
			next, _ = ex.route(time.Now())
		}
		if next == nil {
			// Out of attempts or of backends: pass a backend's 5xx through
			// as it is (it says what went wrong), else report the error.
			if resp != nil {
				ex.relayResponse(resp, nil, nil)
				return resp, nil
			}
			return nil, err
		}
		if resp != nil {
			_ = resp.Body.Close()
		}
		ex.a.Done(time.Now())
		s.log.Warn("retry", "request_id", ex.requestID(), "from", m.B.Name, "to", next.Backend.Name, "attempt", ex.retries+2, "err", err)
		s.metrics.retries.Inc()
		ex.assign(next)
		ex.retries++
	}
}

// relayResponse makes resp the response the client gets: its status is the
// request's outcome (unless the client leaves first), the router's headers
// name the backend (for a tenant that may see them), and its body is
// relayed through the exchange. head and
// headErr are what firstByte read.
func (ex *exchange) relayResponse(resp *http.Response, head []byte, headErr error) {
	if ex.tenant.reveal {
		resp.Header.Set(headerBackend, ex.target.B.Name)
		if ex.a != nil && ex.a.Reason != "" {
			resp.Header.Set(headerReason, ex.a.Reason)
		}
	}
	if ex.entry != nil {
		// The client has the request's id already (an engine such as
		// vLLM with --enable-request-id-headers echoes it): once.
		resp.Header.Del(headerRequestID)
	}
	ex.status = resp.StatusCode
	ex.relay = newRelay(ex, resp, head, headErr)
	resp.Body = ex.relay
}

// proxyError answers when no backend produced a response: the reverse
// proxy's ErrorHandler.
func (ex *exchange) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		ex.status = statusClientGone // nobody to answer
		return
	}
	status, code, msg := failureStatus(err)
	ex.status = status
	if ex.retries > 0 {
		msg += " (after " + strconv.Itoa(ex.retries) + " retries)"
	}
	// The client gets a generic message: the cause names the backend's
	// address (a dial error's ip:port), which stays in the log.
	ex.s.log.Warn("proxy error", "request_id", ex.requestID(), "backend", ex.target.B.Name, "status", status, "retries", ex.retries, "err", err)
	openai.WriteError(w, status, openai.TypeServer, code, msg, 0)
}

// failureStatus is the status, error code and client message of a
// request that no backend answered: 504 for a timeout, else 502.
func failureStatus(err error) (int, string, string) {
	if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
		return http.StatusGatewayTimeout, "backend_timeout", "the backend did not answer in time"
	}
	return http.StatusBadGateway, "backend_error", "the backend failed to answer"
}

// settleDeferred settles the exchange when its handler returns, and also
// when the reverse proxy aborts the response (it panics with
// http.ErrAbortHandler when the body breaks after the headers were sent),
// re-raising the panic once the request is counted.
func (ex *exchange) settleDeferred() {
	if p := recover(); p != nil {
		if ex.status == 0 {
			ex.status = http.StatusBadGateway
		}
		ex.settle()
		panic(p)
	}
	ex.settle()
}

// settle ends the exchange: it feeds the body's end to the breaker,
// releases the assignment and wakes the admission queue, counts the
// request and records its decision. settleDeferred, the handler's one
// deferred call, is its only caller, which makes it run exactly once.
func (ex *exchange) settle() {
	s := ex.s
	now := time.Now()
	if ex.status == 0 {
		// The handler returned without an outcome: the client left
		// before one was known.
		ex.status = statusClientGone
	}
	if rl := ex.relay; rl != nil {
		switch {
		case rl.broken != nil:
			// The backend broke the response after it started; the client
			// saw a truncated body. Never retried.
			s.set.Failed(ex.target, rl.broken)
			s.log.Warn("response broken after first byte", "request_id", ex.requestID(), "backend", ex.target.B.Name, "err", rl.broken)
		case rl.complete && ex.status/100 == 2 && ex.view != nil:
			s.set.Succeeded(ex.target, false)
		}
	}
	if ex.a != nil {
		ex.a.Done(now)
		s.adm.Wake()
	}
	s.bodies.give(ex.held)
	ex.rememberTokens()
	policy := s.policyName()
	if ex.target != nil { // a request the router answered itself has none
		ex.target.Count(policy, ex.model, ex.status)
		if ex.view != nil && !ex.passthrough {
			ex.target.ObserveE2E(ex.model, now.Sub(ex.start))
		}
		if rl := ex.relay; rl != nil && rl.counted && rl.complete {
			in, out := ex.tokens()
			ex.target.CountTokens(ex.model, in, out)
		}
	} else {
		s.metrics.requests.WithLabelValues(noBackend, policy, ex.model, strconv.Itoa(ex.status)).Inc()
	}
	ex.record()
	ex.settleAccess()
	ex.endTrace()
}

// tokens are the request's input and output tokens: the response's usage
// when it reported one, else the router's estimate of the prompt and the
// stream's token chunks.
func (ex *exchange) tokens() (in, out int) {
	if ex.view != nil {
		in = ex.view.PromptTokens
	}
	if rl := ex.relay; rl != nil && rl.counted {
		if u := rl.tally.usage; u != nil {
			in = u.PromptTokens
		}
		out = rl.tally.output()
	}
	return in, out
}

// requestID is the request's X-Request-Id, "" outside the access log's
// handler.
func (ex *exchange) requestID() string {
	if ex.entry == nil {
		return ""
	}
	return ex.entry.id
}

// errorOf is e as an error, nil for none.
func errorOf(e *openai.Error) error {
	if e == nil {
		return nil
	}
	return e
}

// routeError maps the scheduler's errors to client errors.
func routeError(err error, model string) *openai.Error {
	switch {
	case errors.Is(err, scheduler.ErrUnknownModel):
		return &openai.Error{Status: http.StatusNotFound, Type: openai.TypeNotFound, Code: "model_not_found",
			Message: "the model '" + model + "' does not exist on any backend"}
	case errors.Is(err, scheduler.ErrNoBackend):
		return &openai.Error{Status: http.StatusServiceUnavailable, Type: openai.TypeUnavailable, Code: "no_healthy_backend",
			Message: "no healthy backend serves the model '" + model + "'", RetryAfter: 1}
	}
	return &openai.Error{Status: http.StatusInternalServerError, Type: openai.TypeServer, Code: "routing_error", Message: err.Error()}
}

// reject writes a router-made error outside any exchange (the API key
// check, /v1/models) and counts it.
func (s *Server) reject(w http.ResponseWriter, e *openai.Error) {
	s.metrics.requests.WithLabelValues(noBackend, s.policyName(), "", strconv.Itoa(e.Status)).Inc()
	e.Write(w)
}

// rewrite prepares the outbound request. The target URL is set per attempt
// by RoundTrip, since a retry goes elsewhere.
func rewrite(pr *httputil.ProxyRequest) {
	for k := range pr.Out.Header {
		if strings.HasPrefix(k, headerPrefix) {
			delete(pr.Out.Header, k)
		}
	}
	prior := pr.In.Header.Values("X-Forwarded-For")
	pr.SetXForwarded()
	if len(prior) > 0 {
		pr.Out.Header.Set("X-Forwarded-For", strings.Join(prior, ", ")+", "+pr.Out.Header.Get("X-Forwarded-For"))
	}
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

// setBody makes body, read whole by the exchange, out's body.
func setBody(out *http.Request, body []byte) {
	out.ContentLength, out.TransferEncoding = int64(len(body)), nil
	if len(body) == 0 {
		out.Body, out.GetBody = http.NoBody, func() (io.ReadCloser, error) { return http.NoBody, nil }
		return
	}
	out.Body = io.NopCloser(bytes.NewReader(body))
	out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
}

var _ http.RoundTripper = (*exchange)(nil)
