package epp

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"

	"github.com/kvroute/kvroute/internal/lifecycle"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/scheduler"
	"github.com/kvroute/kvroute/internal/tracer"
)

// The picker's trace of a request (Parts.Tracer; nothing with tracing
// off): one span per stream, kind server, continuing the W3C traceparent
// of the request's headers (the client's), else the one in the stream's
// gRPC metadata (the gateway's ext_proc call's), named and attributed as
// the HTTP front's request span is (package tracer: "chat {model}",
// gen_ai.*, http.*, kvroute.front "epp"); a child span for each routing
// decision ("route", with the HTTP front's attributes: policy, backend,
// predicted cached tokens, estimated TTFT, reason); and the response's
// phases as the data plane reports them, as events: "response_headers"
// (its status, the backend that served, kvroute.fallback when that was
// not the pick), "first_byte", "response_end" (kvroute.complete). The
// span ends when the request settles, with its status, the backend that
// served and its tokens; a request whose answer the data plane never
// reports ends its span when its stream ends, marked kvroute.unreported.
//
// The data plane forwards the request itself: the picker has no attempt
// spans, and the gateway sends the engine its own traceparent.

// Event names of the response's phases.
const (
	eventHeaders   = "response_headers"
	eventFirstByte = "first_byte"
	eventEnd       = "response_end"
)

// beginTrace starts the request's span once its headers are read.
func (x *exchange) beginTrace() {
	t := x.s.p.Tracer
	if t == nil || x.span != nil {
		return
	}
	if x.in.Header.Get("traceparent") == "" {
		x.in = x.in.WithContext(t.Extract(x.in.Context(), gatewayTrace(x.ctx)))
	}
	x.tctx, x.span = t.Begin(x.in, "", x.Start, attribute.String("kvroute.front", Front))
	x.in = x.in.WithContext(x.tctx)
}

// gatewayTrace is the trace context in the stream's gRPC metadata, where
// Envoy sends its own ext_proc call's: a request whose client sent no
// traceparent still joins the gateway's trace.
func gatewayTrace(ctx context.Context) http.Header {
	h := http.Header{}
	md, _ := metadata.FromIncomingContext(ctx)
	for _, k := range []string{"traceparent", "tracestate"} {
		if v := md.Get(k); len(v) > 0 {
			h.Set(k, v[0])
		}
	}
	return h
}

// nameTrace names the request's span for its operation once its model is
// read.
func (x *exchange) nameTrace(op string) {
	if x.span == nil || x.View == nil {
		return
	}
	x.span.SetAttributes(attribute.String("gen_ai.operation.name", op))
	tracer.Name(x.span, op, x.View.Model)
}

// RouteStart starts a routing decision's span (lifecycle.Trace).
func (x *exchange) RouteStart() {
	if x.span != nil {
		x.routing = x.s.p.Tracer.StartRoute(x.tctx)
	}
}

// RouteEnd ends the routing decision's span (lifecycle.Trace).
func (x *exchange) RouteEnd(a *scheduler.Assignment, err error) {
	if x.routing != nil {
		tracer.EndRoute(x.routing, x.s.plane.Sched.Policy().Name(), a, err)
		x.routing = nil
	}
}

// Attempt, AttemptFailed and FirstByte are the router's own attempts
// (lifecycle.Trace), which the picker does not make: the data plane
// forwards, and reports its answer's phases (traceHeaders, traceEvent).
func (x *exchange) Attempt(*lifecycle.Request, *lifecycle.Leg, *http.Request) {}
func (x *exchange) AttemptFailed(error)                                       {}
func (x *exchange) FirstByte()                                                {}

// LegStart and LegEnd trace the legs the router runs (lifecycle.Trace):
// the gateway and the decode engine's sidecar run a split request's legs,
// so the picker traces its decisions only.
func (x *exchange) LegStart(*lifecycle.Leg) {}
func (x *exchange) LegEnd(*lifecycle.Leg)   {}

// traceEvent adds a response phase's event to the request's span.
func (x *exchange) traceEvent(name string, attrs ...attribute.KeyValue) {
	if x.span != nil {
		x.span.AddEvent(name, trace.WithAttributes(attrs...))
	}
}

// traceHeaders notes the response's headers: their status and the
// backend that served.
func (x *exchange) traceHeaders(status int, pick bool) {
	if x.span == nil {
		return
	}
	attrs := []attribute.KeyValue{attribute.Int("http.response.status_code", status)}
	if t := x.Leg().Target; t != nil {
		attrs = append(attrs, attribute.String("kvroute.backend", t.B.Name))
	}
	if !pick {
		attrs = append(attrs, attribute.Bool("kvroute.fallback", true))
	}
	x.traceEvent(eventHeaders, attrs...)
}

// endTrace ends the span of a settled request with its outcome.
func (x *exchange) endTrace(r *lifecycle.Request) {
	if x.span == nil {
		return
	}
	if t := r.Leg().Target; t != nil {
		x.span.SetAttributes(attribute.String("kvroute.backend", t.B.Name))
	}
	var u *tracer.Usage
	if end := x.Ended(); end.Counted {
		u = &tracer.Usage{In: end.In, Out: end.Out, Model: x.tally.Model()}
	}
	tracer.Finish(x.span, r, u)
	x.span = nil
}

// endUnsettled ends the span of a stream whose request does not settle
// now: one never read (answered at once, or without a body: e is its
// immediate response, nil for none), or one whose answer goes unreported.
func (x *exchange) endUnsettled(e *openai.Error, unreported bool) {
	if x.span == nil {
		return
	}
	if unreported {
		x.span.SetAttributes(attribute.Bool("kvroute.unreported", true))
	}
	if t := x.Leg().Target; t != nil {
		x.span.SetAttributes(attribute.String("kvroute.backend", t.B.Name))
	}
	if e != nil {
		x.span.SetAttributes(attribute.Int("http.response.status_code", e.Status), attribute.String("kvroute.error_code", e.Code))
		if e.Status >= 500 {
			x.span.SetStatus(codes.Error, http.StatusText(e.Status))
		}
	}
	x.span.End()
	x.span = nil
}

var _ lifecycle.Trace = (*exchange)(nil)
