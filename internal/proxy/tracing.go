package proxy

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"golang.org/x/time/rate"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/lifecycle"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/scheduler"
	"github.com/kvroute/kvroute/internal/version"
)

// tracing is the router's OpenTelemetry tracer (tracing.* keys). Each
// exchange is one span, continuing the client's W3C traceparent, with a
// child span for its admission wait, one for each routing decision (a
// retry is routed again), and one for each upstream attempt (whose own
// traceparent the engine receives) with its first byte. With tracing off
// the Server has none, and an exchange does nothing for it but a nil
// check.
//
// Names and attributes follow OpenTelemetry's semantic conventions. The
// exchange's span is the generative AI operation as the client sees it,
// retries included: named "{gen_ai.operation.name} {gen_ai.request.model}"
// ("chat llama", "text_completion llama", "embeddings e5") once its model
// is read, "{method} {path}" before (a request refused unread) and for
// other endpoints; kind SERVER, with gen_ai.operation.name,
// gen_ai.request.model, gen_ai.response.model, gen_ai.usage.input_tokens
// and gen_ai.usage.output_tokens, and the HTTP server's
// http.request.method, url.path, http.response.status_code,
// server.address, server.port and client.address. An attempt is an HTTP
// client span named by its method ("POST"), with http.request.method,
// server.address and server.port of the backend, url.full,
// http.response.status_code and, on a retry, http.request.resend_count.
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

// newTracing returns the tracer, or nil when tracing is off. The
// OpenTelemetry library's own errors (a collector out of reach) go to log,
// at most one a minute with the count of those left out; a line says
// where spans go.
func newTracing(c config.Tracing, log *slog.Logger) (*tracing, error) {
	if !c.Enabled {
		return nil, nil
	}
	exp, err := newTraceExporter(context.Background(), c)
	if err != nil {
		return nil, err
	}
	otel.SetErrorHandler(newOtelErrors(log, time.Minute))
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attribute.String("service.name", c.ServiceName),
		attribute.String("service.version", version.Get().Version)))
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
	proto, endpoint := traceDestination(c)
	log.Info("tracing on", "endpoint", endpoint, "protocol", proto, "sample_ratio", c.SampleRatio,
		"service_name", serviceName(res, c.ServiceName))
	return &tracing{tp: tp, tracer: tp.Tracer("github.com/kvroute/kvroute", trace.WithInstrumentationVersion(version.Get().Version)),
		prop: propagation.TraceContext{}}, nil
}

// traceDestination is where the exporter sends, for the startup line: the
// protocol and endpoint from the section, else the variables the
// exporters read, else their defaults.
func traceDestination(c config.Tracing) (proto, endpoint string) {
	proto = c.Protocol
	for _, v := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if proto == "" {
			proto = os.Getenv(v)
		}
	}
	if proto == "" {
		proto = config.ProtocolHTTP
	}
	endpoint = c.Endpoint
	for _, v := range []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"} {
		if endpoint == "" {
			endpoint = os.Getenv(v)
		}
	}
	if endpoint == "" {
		endpoint = "https://localhost:4318 (the exporter's default)"
		if proto == config.ProtocolGRPC {
			endpoint = "https://localhost:4317 (the exporter's default)"
		}
	}
	return proto, endpoint
}

// serviceName is the resource's service.name (OTEL_SERVICE_NAME wins over
// the section's).
func serviceName(res *resource.Resource, fallback string) string {
	if v, ok := res.Set().Value("service.name"); ok {
		return v.AsString()
	}
	return fallback
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

// shutdown flushes the spans still buffered.
func (t *tracing) shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	return t.tp.Shutdown(ctx)
}

// The GenAI operations (gen_ai.operation.name) of the endpoints.
const (
	opChat           = "chat"
	opTextCompletion = "text_completion"
	opEmbeddings     = "embeddings"
)

// operationOf is the GenAI operation of a completion endpoint.
func operationOf(k request.Kind) string {
	if k == request.Completion {
		return opTextCompletion
	}
	return opChat
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
	attrs := []attribute.KeyValue{attribute.String("http.request.method", r.Method), attribute.String("url.path", r.URL.Path)}
	if host, port, ok := splitHostPort(r.Host); ok {
		attrs = append(attrs, attribute.String("server.address", host), attribute.Int("server.port", port))
	}
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		attrs = append(attrs, attribute.String("client.address", host))
	}
	if op != "" {
		attrs = append(attrs, attribute.String("gen_ai.operation.name", op))
	}
	ctx := t.prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	ctx, ex.span = t.tracer.Start(ctx, r.Method+" "+r.URL.Path, trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(ex.Start),
		trace.WithAttributes(attrs...))
	ex.ctx = ctx
	return r.WithContext(ctx)
}

// splitHostPort splits a Host header or URL host into its name and port (80
// when it has none).
func splitHostPort(h string) (string, int, bool) {
	if h == "" {
		return "", 0, false
	}
	host, p, err := net.SplitHostPort(h)
	if err != nil {
		return h, 80, true
	}
	port, err := strconv.Atoi(p)
	return host, port, err == nil
}

// viewSpan names the exchange's span for its GenAI operation once the
// request's model is known.
func (ex *exchange) viewSpan() {
	if ex.span == nil || ex.op == "" || ex.View.Model == "" {
		return
	}
	ex.span.SetName(ex.op + " " + ex.View.Model)
	ex.span.SetAttributes(attribute.String("gen_ai.request.model", ex.View.Model))
}

// child starts a child span of the exchange's (of the current leg's, for a
// split request); nil when tracing is off.
func (ex *exchange) child(name string, kind trace.SpanKind) (context.Context, trace.Span) {
	if ex.span == nil {
		return nil, nil
	}
	parent := ex.ctx
	if ex.legCtx != nil {
		parent = ex.legCtx
	}
	return ex.s.tracing.tracer.Start(parent, name, trace.WithSpanKind(kind))
}

// legSpan is the span of one leg of a split request.
type legSpan struct {
	leg  *lifecycle.Leg
	span trace.Span
	ctx  context.Context
}

// LegStart starts the span of a leg of a split request, named for its role
// ("prefill", "decode"), a child of the exchange's (lifecycle.Trace): the
// attempts of a leg run in turn are its children (a Beside leg, sent with
// the next one, has none).
func (ex *exchange) LegStart(l *lifecycle.Leg) {
	if ex.span == nil {
		return
	}
	ctx, sp := ex.s.tracing.tracer.Start(ex.ctx, l.Role, trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(attribute.String("kvroute.leg.role", l.Role)))
	ex.legs = append(ex.legs, legSpan{leg: l, span: sp, ctx: ctx})
	if !l.Beside {
		ex.legCtx = ctx
	}
}

// LegEnd ends a leg's span with what became of the leg, and the span of
// its last attempt (lifecycle.Trace).
func (ex *exchange) LegEnd(l *lifecycle.Leg) {
	endSpan(ex.firstByteSpan, nil)
	if ex.attempt != nil {
		if st := l.Status(); st != 0 {
			ex.attempt.SetAttributes(attribute.Int("http.response.status_code", st))
		}
		endSpan(ex.attempt, nil)
	}
	ex.firstByteSpan, ex.attempt = nil, nil
	for i := range ex.legs {
		if ls := &ex.legs[i]; ls.leg == l && ls.span != nil {
			endLeg(ls.span, l, time.Time{})
			ls.span = nil
			if ex.legCtx == ls.ctx {
				ex.legCtx = nil
			}
		}
	}
}

// endLeg ends a leg's span at end (now when zero) with its backend, its
// attempts and, for a skipped leg, why.
func endLeg(sp trace.Span, l *lifecycle.Leg, end time.Time) {
	attrs := []attribute.KeyValue{attribute.Int("kvroute.attempts", l.Attempts())}
	if l.Target != nil {
		attrs = append(attrs, attribute.String("kvroute.backend", l.Target.B.Name))
	}
	if l.Retries > 0 {
		attrs = append(attrs, attribute.Int("kvroute.retries", l.Retries))
	}
	sp.SetAttributes(attrs...)
	if l.Skipped() || l.A == nil {
		sp.SetAttributes(attribute.Bool("kvroute.leg.skipped", true))
		sp.SetStatus(codes.Error, "leg skipped")
	}
	if end.IsZero() {
		sp.End()
		return
	}
	sp.End(trace.WithTimestamp(end))
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

// RouteStart starts a routing decision's span (lifecycle.Trace): a
// retry's decision is traced as the first one.
func (ex *exchange) RouteStart() {
	_, ex.routing = ex.child("route", trace.SpanKindInternal)
}

// RouteEnd ends the routing decision's span (lifecycle.Trace).
func (ex *exchange) RouteEnd(a *scheduler.Assignment, err error) {
	if ex.routing != nil {
		routeSpan(ex.routing, ex.s.policyName(), a, err)
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
	if host, port, ok := splitHostPort(u.Host); ok {
		if u.Port() == "" && u.Scheme == "https" {
			port = 443
		}
		attrs = append(attrs, attribute.String("server.address", host), attribute.Int("server.port", port))
	}
	if l.Retries > 0 {
		attrs = append(attrs, attribute.Int("http.request.resend_count", l.Retries))
	}
	ex.attempt.SetAttributes(attrs...)
	_, ex.firstByteSpan = ex.s.tracing.tracer.Start(actx, "first_byte")
	ex.s.tracing.prop.Inject(actx, propagation.HeaderCarrier(out.Header))
}

// AttemptFailed ends the current attempt's spans with its error
// (lifecycle.Trace).
func (ex *exchange) AttemptFailed(err error) {
	endSpan(ex.firstByteSpan, err)
	endSpan(ex.attempt, err)
	ex.firstByteSpan, ex.attempt = nil, nil
}

// FirstByte ends the first-byte span (lifecycle.Trace).
func (ex *exchange) FirstByte() {
	endSpan(ex.firstByteSpan, nil)
	ex.firstByteSpan = nil
}

// endTrace ends the exchange's spans with its outcome.
func (ex *exchange) endTrace() {
	if ex.span == nil {
		return
	}
	status := attribute.Int("http.response.status_code", ex.Status)
	var err error
	if ex.relay != nil && ex.relay.broken != nil {
		err = ex.relay.broken
	}
	endSpan(ex.firstByteSpan, err)
	if ex.attempt != nil {
		ex.attempt.SetAttributes(status)
		endSpan(ex.attempt, err)
	}
	for i := range ex.legs {
		if ls := &ex.legs[i]; ls.span != nil {
			endLeg(ls.span, ls.leg, ls.leg.EndedAt()) // a Beside leg ended on its own
			ls.span = nil
		}
	}
	ex.span.SetAttributes(status, attribute.Int("kvroute.retries", ex.Retries()))
	if ex.op != "" && ex.relay != nil && ex.relay.counted {
		in, out := ex.tokens()
		ex.span.SetAttributes(attribute.Int("gen_ai.usage.input_tokens", in), attribute.Int("gen_ai.usage.output_tokens", out))
		if m := ex.relay.tally.Model(); m != "" {
			ex.span.SetAttributes(attribute.String("gen_ai.response.model", m))
		}
	}
	if ex.Status >= 500 {
		ex.span.SetStatus(codes.Error, http.StatusText(ex.Status))
	}
	if ex.Code != "" {
		ex.span.SetAttributes(attribute.String("kvroute.error_code", ex.Code))
	}
	ex.span.End()
}
