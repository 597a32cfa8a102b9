package proxy

import (
	"context"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"golang.org/x/time/rate"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/lifecycle"
	"github.com/kvroute/kvroute/internal/scheduler"
	"github.com/kvroute/kvroute/internal/tracer"
)

// tracing is the data plane's side of the router's tracer (package
// tracer, which names the spans and their attributes). Each exchange is
// one span, continuing the client's W3C traceparent, with a child span
// for its admission wait, one for each routing decision (a retry is
// routed again), and one for each upstream attempt (whose own traceparent
// the engine receives) with its first byte. With tracing off the Server
// has none, and an exchange does nothing for it but a nil check.
//
// An attempt is an HTTP client span named by its method ("POST"), with
// http.request.method, server.address and server.port of the backend,
// url.full, http.response.status_code and, on a retry,
// http.request.resend_count.
type tracing struct {
	*tracer.Tracer
	// tp is the tracer's provider, flushed by the tests.
	tp *sdktrace.TracerProvider
}

// newTraceExporter builds the OTLP exporter (tracer.NewExporter). Stubbed
// in tests.
var newTraceExporter = func(ctx context.Context, c config.Tracing) (sdktrace.SpanExporter, error) {
	return tracer.NewExporter(ctx, c)
}

// newTracing returns the router's tracer, or nil when tracing is off. The
// OpenTelemetry library's own errors (a collector out of reach) go to log,
// at most one a minute with the count of those left out.
func newTracing(c config.Tracing, log *slog.Logger) (*tracer.Tracer, error) {
	if !c.Enabled {
		return nil, nil
	}
	exp, err := newTraceExporter(context.Background(), c)
	if err != nil {
		return nil, err
	}
	otel.SetErrorHandler(newOtelErrors(log, time.Minute))
	return tracer.New(c, exp, log)
}

// tracingOf is the data plane's side of t, nil for none.
func tracingOf(t *tracer.Tracer) *tracing {
	if t == nil {
		return nil
	}
	return &tracing{Tracer: t, tp: t.Provider()}
}

// otelErrors logs the OpenTelemetry library's errors through the router's
// logger, at most one per interval (an unreachable collector fails every
// export), with the count of those it left out.
type otelErrors struct {
	log     *slog.Logger
	limit   *rate.Limiter
	dropped atomic.Int64
}

func newOtelErrors(log *slog.Logger, every time.Duration) *otelErrors {
	return &otelErrors{log: log, limit: rate.NewLimiter(rate.Every(every), 1)}
}

func (o *otelErrors) Handle(err error) {
	if !o.limit.Allow() {
		o.dropped.Add(1)
		return
	}
	o.log.Warn("tracing: OpenTelemetry error", "err", err, "suppressed_since_last", o.dropped.Swap(0))
}

// begin takes the request's access log entry and starts the exchange's
// span, continuing the client's traceparent, and returns the request
// carrying it. op is the request's GenAI operation, "" for none.
func (ex *exchange) begin(r *http.Request, op string) *http.Request {
	ex.entry = accessOf(r.Context())
	t := ex.s.tracing
	if t == nil {
		return r
	}
	ex.op = op
	ex.ctx, ex.span = t.Begin(r, op, ex.Start)
	return r.WithContext(ex.ctx)
}

// viewSpan names the exchange's span for its GenAI operation once the
// request's model is known.
func (ex *exchange) viewSpan() {
	if ex.span != nil {
		tracer.Name(ex.span, ex.op, ex.View.Model)
	}
}

// parent is the context of the spans of the exchange's steps: the
// current leg's of a split request, else the exchange's.
func (ex *exchange) parent() context.Context {
	if ex.legCtx != nil {
		return ex.legCtx
	}
	return ex.ctx
}

// child starts a child span of the exchange's (of the current leg's, for a
// split request); nil when tracing is off.
func (ex *exchange) child(name string, kind trace.SpanKind) (context.Context, trace.Span) {
	if ex.span == nil {
		return nil, nil
	}
	return ex.s.tracing.Start(ex.parent(), name, trace.WithSpanKind(kind))
}

// legSpan is the span of one leg of a split request.
type legSpan struct {
	leg  *lifecycle.Leg
	span trace.Span
	ctx  context.Context
}

// LegStart starts the span of a leg of a split request (lifecycle.Trace):
// the attempts of a leg run in turn are its children (a Beside leg, sent
// with the next one, has none).
func (ex *exchange) LegStart(l *lifecycle.Leg) {
	if ex.span == nil {
		return
	}
	ctx, sp := ex.s.tracing.StartLeg(ex.ctx, l)
	ex.legs = append(ex.legs, legSpan{leg: l, span: sp, ctx: ctx})
	if !l.Beside {
		ex.legCtx = ctx
	}
}

// LegEnd ends a leg's span with what became of the leg, and the span of
// its last attempt (lifecycle.Trace).
func (ex *exchange) LegEnd(l *lifecycle.Leg) {
	tracer.End(ex.firstByteSpan, nil)
	if ex.attempt != nil {
		if st := l.Status(); st != 0 {
			ex.attempt.SetAttributes(attribute.Int("http.response.status_code", st))
		}
		tracer.End(ex.attempt, nil)
	}
	ex.firstByteSpan, ex.attempt = nil, nil
	for i := range ex.legs {
		if ls := &ex.legs[i]; ls.leg == l && ls.span != nil {
			tracer.EndLeg(ls.span, l, time.Time{})
			ls.span = nil
			if ex.legCtx == ls.ctx {
				ex.legCtx = nil
			}
		}
	}
}

// RouteStart starts a routing decision's span (lifecycle.Trace): a
// retry's decision is traced as the first one.
func (ex *exchange) RouteStart() {
	if ex.span != nil {
		ex.routing = ex.s.tracing.StartRoute(ex.parent())
	}
}

// RouteEnd ends the routing decision's span (lifecycle.Trace).
func (ex *exchange) RouteEnd(a *scheduler.Assignment, err error) {
	if ex.routing != nil {
		tracer.EndRoute(ex.routing, ex.s.policyName(), a, err)
		ex.routing = nil
	}
}

// Attempt starts an upstream attempt's span and its first-byte span, and
// puts the attempt's traceparent on out for the engine (lifecycle.Trace).
func (ex *exchange) Attempt(_ *lifecycle.Request, l *lifecycle.Leg, out *http.Request) {
	if ex.span == nil {
		return
	}
	var actx context.Context
	actx, ex.attempt = ex.child(out.Method, trace.SpanKindClient)
	u := l.Target.B.URL
	attrs := []attribute.KeyValue{attribute.String("http.request.method", out.Method), attribute.String("url.full", out.URL.Redacted()),
		attribute.String("kvroute.backend", l.Target.B.Name), attribute.Int("kvroute.attempt", l.Retries+1)}
	if host, port, ok := tracer.SplitHostPort(u.Host); ok {
		if u.Port() == "" && u.Scheme == "https" {
			port = 443
		}
		attrs = append(attrs, attribute.String("server.address", host), attribute.Int("server.port", port))
	}
	if l.Retries > 0 {
		attrs = append(attrs, attribute.Int("http.request.resend_count", l.Retries))
	}
	ex.attempt.SetAttributes(attrs...)
	_, ex.firstByteSpan = ex.s.tracing.Start(actx, "first_byte")
	ex.s.tracing.Inject(actx, out.Header)
}

// AttemptFailed ends the current attempt's spans with its error
// (lifecycle.Trace).
func (ex *exchange) AttemptFailed(err error) {
	tracer.End(ex.firstByteSpan, err)
	tracer.End(ex.attempt, err)
	ex.firstByteSpan, ex.attempt = nil, nil
}

// FirstByte ends the first-byte span (lifecycle.Trace).
func (ex *exchange) FirstByte() {
	tracer.End(ex.firstByteSpan, nil)
	ex.firstByteSpan = nil
}

// endTrace ends the exchange's spans with its outcome.
func (ex *exchange) endTrace() {
	if ex.span == nil {
		return
	}
	var err error
	if ex.relay != nil && ex.relay.broken != nil {
		err = ex.relay.broken
	}
	tracer.End(ex.firstByteSpan, err)
	if ex.attempt != nil {
		ex.attempt.SetAttributes(attribute.Int("http.response.status_code", ex.Status))
		tracer.End(ex.attempt, err)
	}
	for i := range ex.legs {
		if ls := &ex.legs[i]; ls.span != nil {
			tracer.EndLeg(ls.span, ls.leg, ls.leg.EndedAt()) // a Beside leg ended on its own
			ls.span = nil
		}
	}
	var u *tracer.Usage
	if ex.op != "" && ex.relay != nil && ex.relay.counted {
		in, out := ex.tokens()
		u = &tracer.Usage{In: in, Out: out, Model: ex.relay.tally.Model()}
	}
	tracer.Finish(ex.span, &ex.Request, u)
}
