package tracer

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvroute/kvroute/internal/lifecycle"
	"github.com/kvroute/kvroute/internal/request"
	"github.com/kvroute/kvroute/internal/scheduler"
)

// Names and attributes follow OpenTelemetry's semantic conventions. A
// request's span is the generative AI operation as the client sees it,
// retries included: named "{gen_ai.operation.name} {gen_ai.request.model}"
// ("chat llama", "text_completion llama", "embeddings e5") once its model
// is read, "{method} {path}" before (a request refused unread) and for
// other endpoints; kind SERVER, with gen_ai.operation.name,
// gen_ai.request.model, gen_ai.response.model, gen_ai.usage.input_tokens
// and gen_ai.usage.output_tokens, and the HTTP server's
// http.request.method, url.path, http.response.status_code,
// server.address, server.port and client.address. Its children are each
// routing decision ("route") and, for a split request, each leg (named
// for its role); the kvroute.* attributes are the router's own.

// The GenAI operations (gen_ai.operation.name) of the endpoints.
const (
	OpChat           = "chat"
	OpTextCompletion = "text_completion"
	OpEmbeddings     = "embeddings"
)

// Operation is the GenAI operation of a completion endpoint.
func Operation(k request.Kind) string {
	if k == request.Completion {
		return OpTextCompletion
	}
	return OpChat
}

// PassOperation is the GenAI operation of another endpoint than the
// completions (a passthrough): only embeddings has one.
func PassOperation(path string) string {
	if path == "/v1/embeddings" {
		return OpEmbeddings
	}
	return ""
}

// Begin starts the span of the request r carries at start, continuing the
// W3C traceparent of its headers: kind server, named "{method} {path}"
// until Name names it for its operation op ("" for none), with r's HTTP
// attributes and attrs. It returns the context carrying the span.
func (t *Tracer) Begin(r *http.Request, op string, start time.Time, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	attrs = append(attrs, attribute.String("http.request.method", r.Method), attribute.String("url.path", r.URL.Path))
	if host, port, ok := SplitHostPort(r.Host); ok {
		attrs = append(attrs, attribute.String("server.address", host), attribute.Int("server.port", port))
	}
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		attrs = append(attrs, attribute.String("client.address", host))
	}
	if op != "" {
		attrs = append(attrs, attribute.String("gen_ai.operation.name", op))
	}
	return t.tracer.Start(t.Extract(r.Context(), r.Header), r.Method+" "+r.URL.Path, trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(start),
		trace.WithAttributes(attrs...))
}

// Name names a request's span for its GenAI operation once its model is
// known; a request without either keeps its "{method} {path}".
func Name(sp trace.Span, op, model string) {
	if sp == nil || op == "" || model == "" {
		return
	}
	sp.SetName(op + " " + model)
	sp.SetAttributes(attribute.String("gen_ai.request.model", model))
}

// SplitHostPort splits a Host header or URL host into its name and port (80
// when it has none).
func SplitHostPort(h string) (string, int, bool) {
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

// End ends sp, marking it failed when err is not nil; a nil sp is none.
func End(sp trace.Span, err error) {
	if sp == nil {
		return
	}
	if err != nil {
		sp.RecordError(err)
		sp.SetStatus(codes.Error, err.Error())
	}
	sp.End()
}

// StartRoute starts a routing decision's span, a child of the span in
// parent (lifecycle.Trace's RouteStart: a retry's decision is traced as
// the first one).
func (t *Tracer) StartRoute(parent context.Context) trace.Span {
	_, sp := t.tracer.Start(parent, "route", trace.WithSpanKind(trace.SpanKindInternal))
	return sp
}

// EndRoute ends a routing decision's span with what was decided
// (lifecycle.Trace's RouteEnd): the policy, and the backend, the tokens
// predicted cached there, the estimated TTFT and the reason.
func EndRoute(sp trace.Span, policy string, a *scheduler.Assignment, err error) {
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
	End(sp, err)
}

// StartLeg starts the span of a leg of a split request, named for its
// role ("prefill", "decode"), a child of the request's span in parent
// (lifecycle.Trace's LegStart).
func (t *Tracer) StartLeg(parent context.Context, l *lifecycle.Leg) (context.Context, trace.Span) {
	return t.tracer.Start(parent, l.Role, trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(attribute.String("kvroute.leg.role", l.Role)))
}

// EndLeg ends a leg's span at end (now when zero) with its backend, its
// attempts and, for a skipped leg, why.
func EndLeg(sp trace.Span, l *lifecycle.Leg, end time.Time) {
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

// Usage is what a counted answer said of its tokens, and the model it
// named ("" for none).
type Usage struct {
	In, Out int
	Model   string
}

// Finish ends a request's span with settled r's outcome: the status the
// client got (an error status for a 5xx), its retries, the router's error
// code, and the tokens of its counted answer (u, nil for none).
func Finish(sp trace.Span, r *lifecycle.Request, u *Usage) {
	sp.SetAttributes(attribute.Int("http.response.status_code", r.Status), attribute.Int("kvroute.retries", r.Retries()))
	if u != nil {
		sp.SetAttributes(attribute.Int("gen_ai.usage.input_tokens", u.In), attribute.Int("gen_ai.usage.output_tokens", u.Out))
		if u.Model != "" {
			sp.SetAttributes(attribute.String("gen_ai.response.model", u.Model))
		}
	}
	if r.Status >= 500 {
		sp.SetStatus(codes.Error, http.StatusText(r.Status))
	}
	if r.Code != "" {
		sp.SetAttributes(attribute.String("kvroute.error_code", r.Code))
	}
	sp.End()
}
