package proxy

import (
	"context"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/kvroute/kvroute/internal/disagg"
	"github.com/kvroute/kvroute/internal/lifecycle"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/tracer"
)

// Response headers the router adds; client-sent headers with this prefix
// are stripped before forwarding so that a client cannot forge them
// towards a backend.
const (
	headerPrefix  = "X-Kvroute-"
	headerBackend = "X-Kvroute-Backend"
	headerReason  = "X-Kvroute-Reason"
	// headerPrefill names the engine that ran a split request's prefill
	// leg (X-Kvroute-Backend names the one that answered: the decode
	// engine); absent for a request served whole.
	headerPrefill = "X-Kvroute-Prefill-Backend"
)

// statusClientGone labels requests whose client went away before the
// response started (nginx's convention).
const statusClientGone = lifecycle.StatusClientGone

// exchange is the HTTP front of one client request's lifecycle
// (lifecycle.Request, which it embeds): it reads and parses the body,
// hands the request to the lifecycle's Route, forwards it with the
// standard library's reverse proxy, whose transport is the lifecycle's
// attempt loop (RoundTrip) and whose error handler its Fail, relays the
// response body (relay.go) and, in its handler's one deferred call, has
// the lifecycle settle the request (Settle), after which it writes its
// own records: the access log entry, the trace, the body's budget.
//
// Its life, top to bottom:
//
//	read body, parse, check context            (serveCompletion)
//	tokenize, admit, route                     (lifecycle: Route)
//	attempt ─▶ first byte? ─no─▶ reroute ─┐    (lifecycle: RoundTrip, at most
//	   ▲                                  │     retry.attempts retries)
//	   └──────────────────────────────────┘
//	relay the body                             (relay)
//	settle                                     (lifecycle: Settle, then Settled)
type exchange struct {
	lifecycle.Request
	s *Server
	w http.ResponseWriter
	r *http.Request
	// tokenized is the tokenizer's answer behind Keys, cached at settle
	// if the engine accepted the request (precise.go).
	tokenized tokenized
	// relay is the response body being relayed, nil before one was chosen.
	relay *relay
	// client controls the client's response (its write deadline, see
	// relay); nil without limits.client_write_timeout.
	client *http.ResponseController
	// held is the room taken for the body in the budget of buffered
	// bodies, given back by settle.
	held int64
	// tenant is who sent the request (tenant.go): whether it sees the
	// decision headers, and its prefix salt.
	tenant tenant

	// entry is the request's access log line (accesslog.go); nil
	// outside the access log's handler.
	entry *accessEntry

	// The exchange's trace (tracing.go): its context and span, the
	// current routing decision's span, the current attempt's span and
	// its first byte's; nil with tracing off.
	ctx                                   context.Context
	span, routing, attempt, firstByteSpan trace.Span
	// legs are the spans of a split request's legs (tracing.go), legCtx
	// the context of the leg being run, parent of its attempts' spans.
	legs   []legSpan
	legCtx context.Context
	// op is the request's GenAI operation (gen_ai.operation.name), ""
	// for none.
	op string
}

// newExchange starts the exchange of r, answered on w.
func (s *Server) newExchange(w http.ResponseWriter, r *http.Request, op string, passthrough bool) (*exchange, *http.Request) {
	ex := &exchange{s: s, w: unwrapStatus(w)}
	ex.Init(time.Now(), ex, ex)
	ex.Passthrough = passthrough
	r = ex.begin(r, op)
	ex.r = r
	if ex.entry != nil {
		ex.ID = ex.entry.id
	}
	ex.tenant = s.tenantOf(r)
	return ex, r
}

// newPlane builds what every request's lifecycle shares, once the
// members, the admission queue and the decision log are.
func (s *Server) newPlane() *lifecycle.Plane {
	return &lifecycle.Plane{
		Sched: s.sched, Set: s.set, Upstream: s.upstream, Log: s.log,
		Attempts:          s.cfg.Retry.Attempts,
		HeaderTimeout:     s.cfg.Upstream.ResponseHeaderTimeout,
		FirstTokenTimeout: s.cfg.Upstream.FirstTokenTimeout,
		StreamIdleTimeout: s.cfg.Upstream.StreamIdleTimeout,
		ResendDrained:     true,
		DrainGrace:        s.cfg.Fleet.DrainGrace,
		Wake:              s.adm.Wake,
		Routed:            s.metrics.routed,
		Retried:           s.metrics.retries.Inc,
		Unrouted: func(policy, model string, status int) {
			s.metrics.requests.WithLabelValues(noBackend, policy, model, strconv.Itoa(status)).Inc()
		},
		Decisions: recorder(s.decisions),
		Bind:      s.bind,
		Split:     s.metrics.pd.observe,
		Attained:  s.metrics.slo.record,
		Reading: lifecycle.Reading{Options: s.parse, RejectOverContext: s.cfg.Limits.RejectOverContext,
			MaxBytesPerToken: s.cfg.Limits.MaxBytesPerToken},
	}
}

// serveCompletion serves POST /v1/chat/completions and /v1/completions.
func (s *Server) serveCompletion(kind request.Kind, w http.ResponseWriter, r *http.Request) {
	ex, r := s.newExchange(w, r, tracer.Operation(kind), false)
	defer ex.settleDeferred()
	if r.Method != http.MethodPost {
		ex.w.Header().Set("Allow", http.MethodPost)
		ex.Reject(&openai.Error{Status: http.StatusMethodNotAllowed, Type: openai.TypeInvalidRequest, Code: "method_not_allowed", Message: r.Method + " is not allowed on " + r.URL.Path + "; use POST"})
		return
	}
	body, e := ex.readBody(ex.w, r)
	if e != nil {
		ex.Reject(e)
		return
	}
	e = s.read(r, ex.tenant, &ex.Request, kind, body)
	if ex.View != nil {
		ex.viewSpan()
	}
	if e != nil {
		ex.Reject(e)
		return
	}
	s.split(ex)
	if s.plane.Route(&ex.Request) {
		ex.forward()
	}
}

// sessionHeader is the session key r's headers carry: session.header's,
// else the first of session.headers' (the agents' session headers).
func (s *Server) sessionHeader(r *http.Request) string {
	if h := s.cfg.Session.Header; h != "" {
		if v := r.Header.Get(h); v != "" {
			return v
		}
	}
	for _, h := range s.cfg.Session.Headers {
		if v := r.Header.Get(h); v != "" {
			return v
		}
	}
	return ""
}

// setView makes v the request's routing view and body its body.
func (ex *exchange) setView(v *request.View, body []byte) {
	ex.View, ex.Body, ex.Model = v, body, ex.s.set.ModelLabel(v.Model)
	ex.viewSpan()
}

// forward hands the request to the reverse proxy, with the lifecycle's
// attempt loop as its transport and its Fail as its error handler.
func (ex *exchange) forward() {
	if ex.s.cfg.Limits.ClientWriteTimeout > 0 {
		ex.client = http.NewResponseController(ex.w)
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
	rp.ServeHTTP(ex.w, ex.r)
}

// RoundTrip is the reverse proxy's transport: the lifecycle's legs and
// their attempt loops.
func (ex *exchange) RoundTrip(req *http.Request) (*http.Response, error) {
	return ex.s.plane.RoundTrip(&ex.Request, req)
}

// proxyError is the reverse proxy's ErrorHandler: no backend produced a
// response.
func (ex *exchange) proxyError(_ http.ResponseWriter, r *http.Request, err error) {
	ex.s.plane.Fail(&ex.Request, r.Context().Err() != nil, err)
}

// Admit waits for the request's admission (lifecycle.Front), in a span of
// its own.
func (ex *exchange) Admit(r *lifecycle.Request) (func(), *openai.Error) {
	_, span := ex.child("admission", trace.SpanKindInternal)
	var cost func() time.Duration
	if !ex.Passthrough {
		cost = ex.s.costOf(r.View, r.Hashes)
	}
	release, e := ex.s.admit(ex.r, r.View.Model, cost, r.View.Objective.TTFT)
	tracer.End(span, errorOf(e))
	return release, e
}

// Tokenize returns the precise index's keys of the prompt
// (lifecycle.Front).
func (ex *exchange) Tokenize(r *lifecycle.Request) []uint64 {
	return ex.tokenKeys(ex.r.Context(), r.View, r.Body)
}

// WriteError writes a router-made error (lifecycle.Front): in
// Anthropic's shape on the Messages API's paths, else OpenAI's.
func (ex *exchange) WriteError(e *openai.Error) {
	if anthropicPath(ex.r.URL.Path) {
		e.WriteAnthropic(ex.w)
		return
	}
	e.Write(ex.w)
}

// anthropicPath reports whether path is one of the Messages API's, whose
// clients read errors in Anthropic's shape.
func anthropicPath(path string) bool {
	return path == "/v1/messages" || strings.HasPrefix(path, "/v1/messages/")
}

// Respond makes resp the response the client gets (lifecycle.Front): the
// router's headers name the backend (for a tenant that may see them), and
// its body is relayed through the exchange. head and headErr are what the
// lifecycle read of its body.
func (ex *exchange) Respond(l *lifecycle.Leg, resp *http.Response, head []byte, headErr error) {
	if ex.tenant.reveal {
		resp.Header.Set(headerBackend, l.Target.B.Name)
		if p := prefillBackend(&ex.Request); p != "" {
			resp.Header.Set(headerPrefill, p)
		}
		if reason := ex.Reason(); reason != "" {
			resp.Header.Set(headerReason, reason)
		}
	}
	if ex.entry != nil {
		// The client has the request's id already (an engine such as
		// vLLM with --enable-request-id-headers echoes it): once.
		resp.Header.Del(headerRequestID)
	}
	ex.relay = newRelay(ex, l, resp, head, headErr)
	resp.Body = ex.relay
}

// Hold takes room for n bytes the lifecycle buffers (a prefill answer) in
// the budget of buffered bodies (lifecycle.Front), given back by Settled
// with the body's.
func (ex *exchange) Hold(n int64) bool {
	if !ex.s.bodies.take(n) {
		return false
	}
	ex.held += n
	return true
}

// prefillBackend is the engine that ran the request's prefill leg, ""
// when it has none or the leg was skipped (the request was served whole).
func prefillBackend(r *lifecycle.Request) string {
	for i := range r.Legs {
		l := &r.Legs[i]
		if l.Role == disagg.RolePrefill && l.Target != nil && !l.Skipped() {
			return l.Target.B.Name
		}
	}
	return ""
}

// Ended is how the relayed body ended (lifecycle.Front).
func (ex *exchange) Ended() lifecycle.BodyEnd {
	rl := ex.relay
	switch {
	case rl == nil:
		return lifecycle.BodyEnd{}
	case !rl.counted:
		in, _ := ex.tokens()
		return lifecycle.BodyEnd{Complete: rl.complete, Broken: rl.broken, In: in}
	}
	in, _ := ex.tokens()
	end := rl.tally.End(rl.complete, rl.broken, in)
	if rl.mover.trailOf() != "" {
		// Its chunks came from several engines, with a move's gap among
		// them: no engine's decode speed.
		end.Decoding = 0
	}
	return end
}

// Settled writes the exchange's own records once the lifecycle settled
// (lifecycle.Front): the body's budget, the tokenizer's cache, the access
// log entry and the trace.
func (ex *exchange) Settled(r *lifecycle.Request) {
	ex.rememberResponse()
	ex.s.bodies.give(ex.held)
	ex.rememberTokens()
	ex.settleAccess()
	ex.endTrace()
}

// settleDeferred settles the exchange when its handler returns, and also
// when the reverse proxy aborts the response (it panics with
// http.ErrAbortHandler when the body breaks after the headers were sent),
// re-raising the panic once the request is counted.
func (ex *exchange) settleDeferred() {
	if p := recover(); p != nil {
		ex.s.plane.Settle(&ex.Request, true)
		panic(p)
	}
	ex.s.plane.Settle(&ex.Request, false)
}

// tokens are the request's input and output tokens: the response's usage
// when it reported one, else the router's estimate of the prompt and the
// stream's token chunks.
func (ex *exchange) tokens() (in, out int) {
	if rl := ex.relay; rl != nil && rl.counted {
		return tokensOf(ex.View, &rl.tally)
	}
	return tokensOf(ex.View, nil)
}

// tokensOf are a request's input and output tokens: its answer's usage
// when it reported one, else the router's estimate of v's prompt and t's
// token chunks; t is nil for an answer not counted (not a 2xx).
func tokensOf(v *request.View, t *lifecycle.Tally) (in, out int) {
	if v != nil {
		in = v.PromptTokens
	}
	if t != nil {
		if u := t.Usage(); u != nil {
			in = u.PromptTokens
		}
		out = t.Output()
	}
	return in, out
}

// errorOf is e as an error, nil for none.
func errorOf(e *openai.Error) error {
	if e == nil {
		return nil
	}
	return e
}

// reject writes a router-made error to r outside any exchange (the API
// key check, /v1/models) and counts it; in Anthropic's shape on the
// Messages API's paths.
func (s *Server) reject(w http.ResponseWriter, r *http.Request, e *openai.Error) {
	s.metrics.requests.WithLabelValues(noBackend, s.policyName(), "", strconv.Itoa(e.Status)).Inc()
	if anthropicPath(r.URL.Path) {
		e.WriteAnthropic(w)
		return
	}
	e.Write(w)
}

// rewrite prepares the outbound request. The target URL is set per attempt
// by RoundTrip, since a retry goes elsewhere. The router's own headers and
// the engines' routing headers (disagg.Headers: a data-parallel rank the
// router did not choose) are the router's to send, never a client's.
func rewrite(pr *httputil.ProxyRequest) {
	for k := range pr.Out.Header {
		if strings.HasPrefix(k, headerPrefix) {
			delete(pr.Out.Header, k)
		}
	}
	for _, k := range disagg.Headers {
		pr.Out.Header.Del(k)
	}
	prior := pr.In.Header.Values("X-Forwarded-For")
	pr.SetXForwarded()
	if len(prior) > 0 {
		pr.Out.Header.Set("X-Forwarded-For", strings.Join(prior, ", ")+", "+pr.Out.Header.Get("X-Forwarded-For"))
	}
}

var (
	_ http.RoundTripper = (*exchange)(nil)
	_ lifecycle.Front   = (*exchange)(nil)
	_ lifecycle.Trace   = (*exchange)(nil)
)
