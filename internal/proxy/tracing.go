package proxy

import (
	"context"
	"net/http"
	"net/url"
	"os"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/scheduler"
)

// tracing is the router's OpenTelemetry tracer (tracing.* keys). Each
// exchange is one span, continuing the client's W3C traceparent, with a
// child span for its admission wait, its routing decision, and each
// upstream attempt (whose own traceparent the engine receives) with its
// first byte. With tracing off the Server has none, and an exchange does
// nothing for it but a nil check.
type tracing struct {
	tp     *sdktrace.TracerProvider
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
}

// newTraceExporter builds the OTLP exporter from the section and the
// OTEL_EXPORTER_OTLP_* variables, which the exporters read themselves.
// Stubbed in tests.
var newTraceExporter = func(ctx context.Context, c config.Tracing) (sdktrace.SpanExporter, error) {
	proto := c.Protocol
	for _, v := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if proto == "" {
			proto = os.Getenv(v)
		}
	}
	if proto == config.ProtocolGRPC {
		var opts []otlptracegrpc.Option
		if c.Endpoint != "" {
			opts = append(opts, otlptracegrpc.WithEndpointURL(c.Endpoint))
		}
		return otlptracegrpc.New(ctx, opts...)
	}
	var opts []otlptracehttp.Option
	if c.Endpoint != "" {
		u, err := url.Parse(c.Endpoint)
		if err != nil {
			return nil, err
		}
		if u.Path == "" || u.Path == "/" {
			u.Path = "/v1/traces" // the signal's path, as the variables' endpoints get
		}
		opts = append(opts, otlptracehttp.WithEndpointURL(u.String()))
	}
	return otlptracehttp.New(ctx, opts...)
}

// newTracing returns the tracer, or nil when tracing is off.
func newTracing(c config.Tracing) (*tracing, error) {
	if !c.Enabled {
		return nil, nil
	}
	exp, err := newTraceExporter(context.Background(), c)
	if err != nil {
		return nil, err
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attribute.String("service.name", c.ServiceName)))
	if err != nil {
		return nil, err
	}
	// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win over the config.
	if env, err := resource.New(context.Background(), resource.WithFromEnv()); err == nil {
		if merged, err := resource.Merge(res, env); err == nil {
			res = merged
		}
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(c.SampleRatio))),
	)
	return &tracing{tp: tp, tracer: tp.Tracer("github.com/kvroute/kvroute"), prop: propagation.TraceContext{}}, nil
}

// shutdown flushes the spans still buffered.
func (t *tracing) shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	return t.tp.Shutdown(ctx)
}

// begin starts the exchange's span, continuing the client's traceparent,
// and returns the request carrying it.
func (ex *exchange) begin(r *http.Request, name string) *http.Request {
	t := ex.s.tracing
	if t == nil {
		return r
	}
	ctx := t.prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	ctx, ex.span = t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(ex.start),
		trace.WithAttributes(attribute.String("http.request.method", r.Method), attribute.String("url.path", r.URL.Path)))
	ex.ctx = ctx
	return r.WithContext(ctx)
}

// child starts a child span of the exchange's; nil when tracing is off.
func (ex *exchange) child(name string, kind trace.SpanKind) (context.Context, trace.Span) {
	if ex.span == nil {
		return nil, nil
	}
	return ex.s.tracing.tracer.Start(ex.ctx, name, trace.WithSpanKind(kind))
}

// endSpan ends sp, marking it failed when err is not nil.
func endSpan(sp trace.Span, err error) {
	if sp == nil {
		return
	}
	if err != nil {
		sp.RecordError(err)
		sp.SetStatus(codes.Error, err.Error())
	}
	sp.End()
}

// routeSpan ends the routing decision's span with what was decided.
func routeSpan(sp trace.Span, policy string, a *scheduler.Assignment, err error) {
	if sp == nil {
		return
	}
	sp.SetAttributes(attribute.String("kvroute.policy", policy))
	if a != nil {
		sp.SetAttributes(
			attribute.String("kvroute.backend", a.Backend.Name),
			attribute.Int("kvroute.predicted_cached_tokens", a.MatchedTokens),
			attribute.Float64("kvroute.estimated_ttft_seconds", a.EstTTFT),
			attribute.String("kvroute.reason", a.Reason),
		)
	}
	endSpan(sp, err)
}

// startAttempt starts an upstream attempt's span and its first-byte span,
// and puts the attempt's traceparent on out for the engine.
func (ex *exchange) startAttempt(out *http.Request) {
	if ex.span == nil {
		return
	}
	var actx context.Context
	actx, ex.attempt = ex.child("upstream", trace.SpanKindClient)
	ex.attempt.SetAttributes(attribute.String("kvroute.backend", ex.target.B.Name), attribute.Int("kvroute.attempt", ex.retries+1))
	_, ex.firstByteSpan = ex.s.tracing.tracer.Start(actx, "first_byte")
	ex.s.tracing.prop.Inject(actx, propagation.HeaderCarrier(out.Header))
}

// attemptFailed ends the current attempt's spans with its error.
func (ex *exchange) attemptFailed(err error) {
	endSpan(ex.firstByteSpan, err)
	endSpan(ex.attempt, err)
	ex.firstByteSpan, ex.attempt = nil, nil
}

// firstByteSeen ends the first-byte span.
func (ex *exchange) firstByteSeen() {
	endSpan(ex.firstByteSpan, nil)
	ex.firstByteSpan = nil
}

// endTrace ends the exchange's spans with its outcome.
func (ex *exchange) endTrace() {
	if ex.span == nil {
		return
	}
	status := attribute.Int("http.response.status_code", ex.status)
	var err error
	if ex.relay != nil && ex.relay.broken != nil {
		err = ex.relay.broken
	}
	endSpan(ex.firstByteSpan, err)
	if ex.attempt != nil {
		ex.attempt.SetAttributes(status)
		endSpan(ex.attempt, err)
	}
	ex.span.SetAttributes(status, attribute.Int("kvroute.retries", ex.retries))
	if ex.status >= 500 {
		ex.span.SetStatus(codes.Error, http.StatusText(ex.status))
	}
	if ex.rejected != "" {
		ex.span.SetAttributes(attribute.String("kvroute.error_code", ex.rejected))
	}
	ex.span.End()
}
