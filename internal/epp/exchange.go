package epp

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/kvroute/kvroute/internal/disagg"
	"github.com/kvroute/kvroute/internal/lifecycle"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/tracer"
)

// exchange is one stream, one request: the picker's front of its
// lifecycle (lifecycle.Request, which it embeds). It reads the stream's
// messages in order on the stream's goroutine, which drives every step of
// the request, and answers each as the protocol asks:
//
//	request_headers             kept (lowercase keys), the subset hint read
//	request_body (to its end)   buffered within limits.max_body_bytes
//	  end of the body           read, split, admitted, routed: the decision
//	                            (headers response, then the body passed back),
//	                            or an immediate response (an OpenAI error)
//	response_headers            Served (envoy.lb metadata), Status
//	response_body               FirstByte, the tally; passed back
//	  end of the body           Settle
//	end of the stream           Settle, if not yet (the client or the data
//	                            plane left, or never sent the response)
type exchange struct {
	lifecycle.Request
	s      *Server
	stream extprocv3.ExternalProcessor_ProcessServer
	ctx    context.Context
	// in is the request as the gateway carried it (headers, its address,
	// the stream's context), for the read and admission rules.
	in *http.Request
	// path is the request's :path, "" when the data plane sent none.
	path string
	// subset is the subset hint's endpoints, nil for none (hinted is
	// set when a hint was given, even empty).
	subset []string
	hinted bool
	// body is the request's body so far; held its room in the budget of
	// buffered bodies.
	body []byte
	held int64
	// read is set once the request's body ended and the lifecycle took
	// it (its settle then counts it, routed or answered by the router);
	// routed once it was routed (the decision sent); settled once Settle
	// ran.
	read, routed, settled bool
	// The response: its tally (2xx only), whether its body began, ended
	// complete, or was cut.
	tally    lifecycle.Tally
	counted  bool
	began    bool
	complete bool
	broken   error
	// rejection is the router's error answer, set by WriteError.
	rejection *openai.Error
	// newID is set when the request id is the router's (the client sent
	// none): the decision hands it to the engine.
	newID bool
	// remember caches the prompt's token ids at settle (Router.TokenizeFor).
	remember func(status int)
	// refused is the immediate response that answered the request, nil
	// for none.
	refused *openai.Error
	// The request's trace (trace.go): its context and span, and the
	// current routing decision's span; nil with tracing off.
	tctx          context.Context
	span, routing trace.Span
}

func newExchange(s *Server, stream extprocv3.ExternalProcessor_ProcessServer) *exchange {
	x := &exchange{s: s, stream: stream, ctx: stream.Context()}
	var t lifecycle.Trace = noTrace{}
	if s.p.Tracer != nil {
		t = x
	}
	x.Init(time.Now(), x, t)
	x.in = (&http.Request{Method: http.MethodPost, Header: http.Header{}, URL: nilURL()}).WithContext(x.ctx)
	if p, ok := peer.FromContext(x.ctx); ok && p.Addr != nil {
		x.in.RemoteAddr = p.Addr.String()
	}
	return x
}

// run reads the stream until it ends.
func (x *exchange) run() error {
	for {
		req, err := x.stream.Recv()
		if err == io.EOF || status.Code(err) == codes.Canceled || errors.Is(err, context.Canceled) {
			return nil
		}
		if err != nil {
			return err
		}
		done, err := x.handle(req)
		if err != nil || done {
			return err
		}
	}
}

// handle answers one message; done reports the request answered for good
// (an immediate response: the data plane ends the stream).
func (x *exchange) handle(req *extprocv3.ProcessingRequest) (done bool, err error) {
	switch m := req.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		x.headers(m.RequestHeaders.GetHeaders(), req.GetMetadataContext())
		if m.RequestHeaders.GetEndOfStream() {
			return x.decide()
		}
		return false, nil
	case *extprocv3.ProcessingRequest_RequestBody:
		chunk := m.RequestBody.GetBody()
		if int64(len(x.body)+len(chunk)) > x.s.p.MaxBody {
			return true, x.immediate(tooLarge(x.s.p.MaxBody))
		}
		if !x.hold(len(chunk)) {
			return true, x.immediate(&openai.Error{Status: http.StatusServiceUnavailable, Type: openai.TypeUnavailable,
				Code: "router_busy", Message: "the router holds too many request bodies; retry", RetryAfter: 1})
		}
		if x.body == nil {
			x.body = x.buffer()
		}
		x.body = append(x.body, chunk...)
		if m.RequestBody.GetEndOfStream() {
			return x.decide()
		}
		return false, nil
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return false, x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{
			RequestTrailers: &extprocv3.TrailersResponse{}}})
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		x.s.reports.Store(true)
		x.responseHeaders(m.ResponseHeaders.GetHeaders(), req.GetMetadataContext())
		if m.ResponseHeaders.GetEndOfStream() {
			x.finish(true)
		}
		return false, x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
			ResponseHeaders: &extprocv3.HeadersResponse{}}})
	case *extprocv3.ProcessingRequest_ResponseBody:
		x.s.reports.Store(true)
		x.responseBody(m.ResponseBody.GetBody(), m.ResponseBody.GetEndOfStream())
		return false, x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{
			ResponseBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
				Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{
					Body: m.ResponseBody.GetBody(), EndOfStream: m.ResponseBody.GetEndOfStream()}}}}}}})
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		x.finish(x.began || x.Leg().Status() != 0)
		return false, x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{
			ResponseTrailers: &extprocv3.TrailersResponse{}}})
	}
	return false, nil
}

// headers keeps the request's headers (lowercase keys, raw_value or
// value) and its subset hint.
func (x *exchange) headers(h *corev3.HeaderMap, md *corev3.Metadata) {
	for _, hv := range h.GetHeaders() {
		k, v := strings.ToLower(hv.GetKey()), headerValue(hv)
		switch k {
		case ":path":
			x.path = v
			if u, err := url.ParseRequestURI(v); err == nil {
				x.in.URL = u
			}
		case ":method":
			x.in.Method = v
		case ":authority":
			x.in.Host = v
		}
		if !strings.HasPrefix(k, ":") {
			x.in.Header.Add(k, v)
		}
	}
	x.subset, x.hinted = subsetOf(md)
	x.beginTrace()
}

// hold takes room for n more body bytes in the router's budget.
func (x *exchange) hold(n int) bool {
	if n == 0 {
		return true
	}
	if !x.s.p.Router.HoldBody(int64(n)) {
		return false
	}
	x.held += int64(n)
	return true
}

// decide reads, splits, admits and routes the buffered request and sends
// the decision, or the error that answers it.
func (x *exchange) decide() (done bool, err error) {
	if len(x.body) == 0 {
		return x.bodiless()
	}
	x.read = true
	x.ID, x.newID = x.s.p.Router.BeginAccess(x.in, Front)
	if passthrough(x.in.URL.Path) {
		// Another endpoint (embeddings, rerank...): routed by its model,
		// as the HTTP front routes it.
		if e := x.s.p.Router.ReadPassFor(x.in, &x.Request, x.body); e != nil {
			x.Reject(e)
			return true, x.immediate(e)
		}
		x.nameTrace(tracer.PassOperation(x.in.URL.Path))
	} else {
		kind := kindOf(x.path, x.body)
		if e := x.s.p.Router.ReadFor(x.in, &x.Request, kind, x.body); e != nil {
			x.Reject(e)
			return true, x.immediate(e)
		}
		x.nameTrace(tracer.Operation(kind))
		x.s.p.Router.SplitFor(&x.Request)
	}
	if x.hinted {
		exclude := x.outsideSubset()
		for i := range x.Legs {
			x.Legs[i].Tried = append(x.Legs[i].Tried, exclude...)
		}
	}
	if !x.s.plane.Route(&x.Request) {
		e := x.rejection
		if e == nil { // the client left (499): nobody to answer
			return true, nil
		}
		return true, x.immediate(e)
	}
	x.routed = true
	x.s.plane.Forwarded(&x.Request)
	return false, x.sendDecision()
}

// bodiless answers a request without a body (GET /v1/models through the
// gateway, say): nothing to route on and no completion's load, so it goes
// to the least loaded healthy engine (within the subset hint), neither
// admitted nor accounted, as the reference picker sends such a request to
// any endpoint; 503 when there is none.
func (x *exchange) bodiless() (done bool, err error) {
	pick := fallbacks(x.s.p.Members, &request.View{}, nil, x.subset, x.hinted, 1)
	if len(pick) == 0 {
		return true, x.immediate(&openai.Error{Status: http.StatusServiceUnavailable, Type: openai.TypeUnavailable,
			Code: "no_healthy_backend", Message: "no healthy backend in the pool", RetryAfter: 1})
	}
	dest := pick[0].URL.Host
	return false, x.send(&extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
			Response: &extprocv3.CommonResponse{ClearRouteCache: true,
				HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{header(HeaderDestination, dest)}}},
		}},
		DynamicMetadata: decisionMetadata(dest),
	})
}

// outsideSubset are the IDs of the backends outside the subset hint.
func (x *exchange) outsideSubset() []int {
	in := make(map[string]bool, len(x.subset))
	for _, a := range x.subset {
		in[a] = true
	}
	var out []int
	for _, m := range x.s.p.Members.All() {
		if !in[m.B.URL.Host] {
			out = append(out, m.B.ID)
		}
	}
	return out
}

// sendDecision sends the decision: the headers response with the
// destination (and the prefill engine of a split request), the same value
// in the dynamic metadata, then the body, passed back as it will be sent.
func (x *exchange) sendDecision() error {
	l := x.Leg()
	dest := l.Target.B.URL.Host
	if n := x.s.p.Config.Fallbacks; n > 0 {
		for _, b := range fallbacks(x.s.p.Members, x.View, l.Target.B, x.subset, x.hinted, n) {
			dest += "," + b.URL.Host
		}
	}
	set := []*corev3.HeaderValueOption{header(HeaderDestination, dest)}
	if len(x.Legs) > 1 {
		if pre := &x.Legs[0]; pre.Target != nil && !pre.Skipped() {
			set = append(set, header(HeaderPrefiller, pre.Target.B.URL.Host))
		}
	}
	if len(x.Body) != len(x.body) {
		// The split protocols' members were stripped: the body the
		// engine gets is shorter than the client's.
		set = append(set, header("content-length", strconv.Itoa(len(x.Body))))
	}
	if x.newID {
		set = append(set, header(headerRequestID, x.ID))
	}
	remove := []string{strings.ToLower(disagg.Headers[0])}
	err := x.send(&extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
			Response: &extprocv3.CommonResponse{ClearRouteCache: true,
				HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: set, RemoveHeaders: remove}},
		}},
		DynamicMetadata: decisionMetadata(dest),
	})
	if err != nil {
		return err
	}
	return x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
		Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
			StreamedResponse: &extprocv3.StreamedBodyResponse{Body: x.Body, EndOfStream: true}}}}}}})
}

// responseHeaders reads the served endpoint and the status.
func (x *exchange) responseHeaders(h *corev3.HeaderMap, md *corev3.Metadata) {
	if !x.routed || x.settled {
		return
	}
	pick := true
	if addr := servedOf(md); addr != "" {
		if b := backendAt(x.s.p.Members, addr); b != nil {
			pick = x.s.plane.Served(&x.Request, b)
		}
	}
	code, sse := 0, false
	for _, hv := range h.GetHeaders() {
		switch strings.ToLower(hv.GetKey()) {
		case ":status", "status":
			code, _ = strconv.Atoi(headerValue(hv))
		case "content-type":
			sse = strings.HasPrefix(strings.ToLower(headerValue(hv)), "text/event-stream")
		}
	}
	if code < 100 || code > 999 {
		code = http.StatusOK // a data plane that names no status forwarded an answer
	}
	x.s.plane.Status(&x.Request, code)
	x.traceHeaders(code, pick)
	if code/100 == 2 {
		l := x.Leg()
		x.counted = true
		x.tally.SSE = sse
		x.tally.Agent = x.View.Kind == request.Responses || x.View.Kind == request.Messages
		x.tally.ITL = l.Target.ITL(x.Model)
		x.tally.ModelSeen = true
	}
}

// responseBody reads a chunk of the answer.
func (x *exchange) responseBody(p []byte, end bool) {
	if !x.routed || x.settled {
		return
	}
	if len(p) > 0 && !x.began {
		x.began = true
		x.s.plane.FirstByte(&x.Request)
		x.traceEvent(eventFirstByte)
	}
	if x.counted && len(p) > 0 {
		var now time.Time
		if x.tally.SSE {
			now = time.Now()
		}
		x.tally.Note(p, now)
	}
	if end {
		x.finish(true)
	}
}

// finish settles the request once its answer ended (complete) or its
// stream did.
func (x *exchange) finish(complete bool) {
	if !x.routed || x.settled {
		return
	}
	x.traceEvent(eventEnd, attribute.Bool("kvroute.complete", complete))
	if complete && !x.complete {
		x.complete = true
		if x.counted {
			x.tally.Finish()
		}
	}
	x.settled = true
	x.s.plane.Settle(&x.Request, false)
}

// end ends the exchange when its stream ends: a request read and not
// settled settles now (one the router answered itself, counted as the
// HTTP front counts it; one routed whose data plane or client left, or
// whose data plane sends no response phase), and the body's room is
// given back.
//
// A routed request whose stream ended before any answer, from a data
// plane that has never reported one (it takes the decision and leaves),
// keeps its load for its predicted length (lifecycle.Plane.Unreported)
// before it settles, so that the next picks see the work it is doing.
func (x *exchange) end() {
	if x.routed && !x.settled && !x.s.reports.Load() {
		if d := x.s.plane.Unreported(&x.Request, time.Now()); d > 0 {
			x.settled = true
			if x.held > 0 {
				x.s.p.Router.GiveBody(x.held)
				x.held = 0
			}
			// The body stays with the request (its view may read it)
			// rather than going back to the pool.
			x.endUnsettled(nil, true)
			x.s.holdUnreported(x, d)
			return
		}
	}
	if x.read && !x.settled {
		x.settled = true
		x.s.plane.Settle(&x.Request, false)
	}
	if !x.read {
		x.endUnsettled(x.refused, false)
	}
	if x.held > 0 {
		x.s.p.Router.GiveBody(x.held)
		x.held = 0
	}
	if x.body != nil && cap(x.body) <= maxPooled {
		b := x.body[:0]
		x.body, x.Body = nil, nil
		buffers.Put(&b)
	}
}

// buffers recycles the bodies' buffers: a fresh buffer of a large body is
// fresh memory the kernel maps and zeroes, which at 200 KB cost more
// than the decision itself.
var buffers = sync.Pool{New: func() any { b := make([]byte, 0, 64<<10); return &b }}

// maxPooled bounds the buffers kept for reuse.
const maxPooled = 1 << 20

// buffer is a buffer for the request's body, with room for its
// content-length when the data plane sent one within the body limit.
func (x *exchange) buffer() []byte {
	b := (*buffers.Get().(*[]byte))[:0]
	if n, err := strconv.ParseInt(x.in.Header.Get("Content-Length"), 10, 64); err == nil && n > int64(cap(b)) && n <= x.s.p.MaxBody {
		b = make([]byte, 0, n)
	}
	return b
}

// immediate answers the request with e, in OpenAI's error shape.
func (x *exchange) immediate(e *openai.Error) error {
	if e.Status == lifecycle.StatusClientGone {
		return nil
	}
	x.refused = e
	return x.send(immediateResponse(e))
}

// send sends one response on the stream.
func (x *exchange) send(r *extprocv3.ProcessingResponse) error {
	if err := x.stream.Send(r); err != nil {
		return status.Errorf(codes.Unavailable, "send to the data plane: %v", err)
	}
	return nil
}

// Admit waits for the request's admission (lifecycle.Front), by the HTTP
// front's rules.
func (x *exchange) Admit(r *lifecycle.Request) (func(), *openai.Error) {
	return x.s.p.Router.AdmitFor(x.in, r)
}

// Tokenize returns the precise index's keys of the prompt
// (lifecycle.Front), got as the HTTP front gets them.
func (x *exchange) Tokenize(r *lifecycle.Request) []uint64 {
	keys, remember := x.s.p.Router.TokenizeFor(x.in, r)
	x.remember = remember
	return keys
}

// WriteError keeps the router's error answer for the immediate response
// (lifecycle.Front).
func (x *exchange) WriteError(e *openai.Error) { x.rejection = e }

// Respond is never called: the data plane forwards (lifecycle.Front).
func (x *exchange) Respond(*lifecycle.Leg, *http.Response, []byte, error) {
	panic("epp: the lifecycle handed a response to a forwarding front")
}

// Hold takes room in the budget of buffered bodies (lifecycle.Front).
func (x *exchange) Hold(n int64) bool { return x.hold(int(n)) }

// Ended is how the answer's body ended (lifecycle.Front): its tally's
// end for a 2xx answer.
func (x *exchange) Ended() lifecycle.BodyEnd {
	prompt := 0
	if x.View != nil {
		prompt = x.View.PromptTokens
	}
	if x.counted {
		return x.tally.End(x.complete, x.broken, prompt)
	}
	return lifecycle.BodyEnd{Complete: x.complete, In: prompt}
}

// Settled gives the body's room back, caches the prompt's token ids if
// its engine accepted it and writes the access log line
// (lifecycle.Front).
func (x *exchange) Settled(r *lifecycle.Request) {
	var tally *lifecycle.Tally
	if x.counted {
		tally = &x.tally
	}
	x.s.p.Router.EndAccess(x.in, r, Front, tally)
	x.endTrace(r)
	if x.remember != nil {
		x.remember(r.Status)
		x.remember = nil
	}
	if x.held > 0 {
		x.s.p.Router.GiveBody(x.held)
		x.held = 0
	}
}

var _ lifecycle.Front = (*exchange)(nil)
