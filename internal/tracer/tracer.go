// Package tracer is the router's OpenTelemetry tracer, as every front of
// the request lifecycle writes with it: the provider built from the
// tracing section (the OTLP exporter, the resource, the parent-based
// sampler), the W3C trace context propagation, and the spans and
// attributes both fronts share (the request's server span continuing the
// client's traceparent and named for its GenAI operation, the routing
// decision's span, a split request's leg spans, the request's end), so
// that the HTTP data plane (package proxy) and the Endpoint Picker
// (package epp) trace a request alike.
//
// It must not decide anything of a request: it reads what the lifecycle
// decided (package lifecycle) and writes spans.
package tracer

import (
	"context"
	"log/slog"
	"net/http"
	"net/url"
	"os"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/version"
)

// Tracer is the router's tracer (tracing.* keys), built once by the
// composition root and shared by the fronts; nil with tracing off.
type Tracer struct {
	provider *sdktrace.TracerProvider
	tracer   trace.Tracer
	prop     propagation.TextMapPropagator
}

// NewExporter builds the OTLP exporter from the section and the
// OTEL_EXPORTER_OTLP_* variables, which the exporters read themselves.
// Stubbed in tests (an in-memory exporter).
var NewExporter = func(ctx context.Context, c config.Tracing) (sdktrace.SpanExporter, error) {
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

// New returns the tracer of section c exporting to exp; a line on log
// says where spans go. The caller installs the OpenTelemetry library's
// error handler (it is the process's).
func New(c config.Tracing, exp sdktrace.SpanExporter, log *slog.Logger) (*Tracer, error) {
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
	proto, endpoint := destination(c)
	log.Info("tracing on", "endpoint", endpoint, "protocol", proto, "sample_ratio", c.SampleRatio,
		"service_name", serviceName(res, c.ServiceName))
	return &Tracer{provider: tp, tracer: tp.Tracer("github.com/kvroute/kvroute", trace.WithInstrumentationVersion(version.Get().Version)),
		prop: propagation.TraceContext{}}, nil
}

// destination is where the exporter sends, for the startup line: the
// protocol and endpoint from the section, else the variables the
// exporters read, else their defaults.
func destination(c config.Tracing) (proto, endpoint string) {
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

// Provider is the tracer's provider (to flush it).
func (t *Tracer) Provider() *sdktrace.TracerProvider { return t.provider }

// Shutdown flushes the spans still buffered; a nil tracer has none.
func (t *Tracer) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	return t.provider.Shutdown(ctx)
}

// Start starts a span, a child of the one in ctx.
func (t *Tracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	return t.tracer.Start(ctx, name, opts...)
}

// Extract is ctx with the trace context h carries (its traceparent), as
// the parent of the spans started from it; ctx when h has none.
func (t *Tracer) Extract(ctx context.Context, h http.Header) context.Context {
	return t.prop.Extract(ctx, propagation.HeaderCarrier(h))
}

// Inject puts the trace context of ctx on h (traceparent), for the next
// hop.
func (t *Tracer) Inject(ctx context.Context, h http.Header) {
	t.prop.Inject(ctx, propagation.HeaderCarrier(h))
}
