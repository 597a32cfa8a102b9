package proxy

import (
	"bufio"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"golang.org/x/time/rate"
	"google.golang.org/protobuf/proto"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/version"
)

const (
	clientTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	clientSpanID  = "00f067aa0ba902b7"
	traceparent   = "00-" + clientTraceID + "-" + clientSpanID + "-01"
)

// TestTracingSpans: with tracing on, a request is one span continuing the
// client's traceparent, named and attributed by OpenTelemetry's GenAI and
// HTTP conventions ("chat {model}", kind server), with children for
// admission, each routing decision (a retry's too) and what it decided,
// each upstream attempt (an HTTP client span "POST", a failed one marked
// so, a retry with its resend count) and the first byte; the backend
// receives a traceparent of the same trace whose parent is the attempt's
// span.
func TestTracingSpans(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	old := newTraceExporter
	newTraceExporter = func(context.Context, config.Tracing) (sdktrace.SpanExporter, error) { return exp, nil }
	t.Cleanup(func() { newTraceExporter = old })
	r := newRig(t, "round-robin", 2, func(c *config.Config) { c.Tracing.Enabled = true })
	r.backends[0].setMode(mode500)
	// Round robin: a request that meets the failing backend first is
	// retried on the other.
	for range 2 {
		if res := r.post("/v1/chat/completions", chat("shared", true, "traced"), "traceparent", traceparent); res.status != 200 {
			t.Fatalf("status %d", res.status)
		}
	}
	if err := r.srv.tracing.tp.ForceFlush(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := exp.GetSpans()
	byName := map[string][]tracetest.SpanStub{}
	for _, s := range spans {
		if got := s.SpanContext.TraceID().String(); got != clientTraceID {
			t.Errorf("span %s in trace %s, want the client's %s", s.Name, got, clientTraceID)
		}
		byName[s.Name] = append(byName[s.Name], s)
	}
	for name, want := range map[string]int{"chat shared": 2, "admission": 2} {
		if len(byName[name]) != want {
			t.Errorf("%d %q spans, want %d", len(byName[name]), name, want)
		}
	}
	attrs := func(s tracetest.SpanStub) map[string]string {
		m := map[string]string{}
		for _, kv := range s.Attributes {
			m[string(kv.Key)] = kv.Value.String()
		}
		return m
	}
	_, routerPort, _ := strings.Cut(r.srv.Addr(), ":")
	for _, s := range byName["chat shared"] {
		if s.Parent.SpanID().String() != clientSpanID {
			t.Errorf("request span's parent %s, want the client's %s", s.Parent.SpanID(), clientSpanID)
		}
		if s.SpanKind != trace.SpanKindServer {
			t.Errorf("request span kind %v, want server", s.SpanKind)
		}
		a := attrs(s)
		want := map[string]string{"gen_ai.operation.name": "chat", "gen_ai.request.model": "shared", "gen_ai.response.model": "m",
			"gen_ai.usage.output_tokens": "4", "http.request.method": "POST", "url.path": "/v1/chat/completions",
			"http.response.status_code": "200", "server.address": "127.0.0.1", "server.port": routerPort, "client.address": "127.0.0.1"}
		for k, v := range want {
			if a[k] != v {
				t.Errorf("request span %s = %q, want %q (all: %v)", k, a[k], v, a)
			}
		}
		if a["gen_ai.usage.input_tokens"] == "" || a["gen_ai.usage.input_tokens"] == "0" {
			t.Errorf("request span gen_ai.usage.input_tokens = %q", a["gen_ai.usage.input_tokens"])
		}
	}
	for _, s := range byName["route"] {
		a := attrs(s)
		if a["kvroute.policy"] != "round-robin" || a["kvroute.backend"] == "" || !strings.HasPrefix(a["kvroute.reason"], "policy=round-robin") {
			t.Errorf("route span attributes %v", a)
		}
	}
	failed, resent := 0, 0
	upstreamIDs := map[string]bool{}
	for _, s := range byName["POST"] {
		upstreamIDs[s.SpanContext.SpanID().String()] = true
		a := attrs(s)
		if s.SpanKind != trace.SpanKindClient || a["http.request.method"] != "POST" || a["server.address"] != "127.0.0.1" ||
			a["server.port"] == "" || !strings.HasSuffix(a["url.full"], "/v1/chat/completions") {
			t.Errorf("attempt span kind %v, attributes %v: want an HTTP client span to the backend", s.SpanKind, a)
		}
		if s.Status.Code == codes.Error {
			failed++
			if a["kvroute.backend"] != "b0" {
				t.Errorf("failed attempt on %s, want b0", a["kvroute.backend"])
			}
		}
		if a["http.request.resend_count"] == "1" {
			resent++
		}
	}
	// Each request has one successful attempt, after its failed ones;
	// every attempt was routed in a route span of its own, and each retry
	// says it is one.
	if failed == 0 || resent != failed || len(byName["POST"]) != 2+failed || len(byName["first_byte"]) != 2+failed || len(byName["route"]) != 2+failed {
		t.Errorf("%d attempt spans (%d failed, %d resent), %d first_byte and %d route spans, want one more each than failed per request",
			len(byName["POST"]), failed, resent, len(byName["first_byte"]), len(byName["route"]))
	}
	h := r.backends[1].lastHeader.Load()
	if h == nil {
		t.Fatal("b1 got no request")
	}
	tp := strings.Split(h.Get("traceparent"), "-")
	if len(tp) != 4 || tp[1] != clientTraceID || !upstreamIDs[tp[2]] {
		t.Errorf("backend got traceparent %q, want trace %s with an upstream span as parent", h.Get("traceparent"), clientTraceID)
	}
}

// TestTracingOff: without tracing, the client's traceparent reaches the
// backend untouched and the router makes no tracer.
func TestTracingOff(t *testing.T) {
	r := newRig(t, "round-robin", 1, nil)
	if r.srv.tracing != nil {
		t.Fatal("a tracer with tracing off")
	}
	if res := r.post("/v1/chat/completions", chat("shared", false, "x"), "traceparent", traceparent); res.status != 200 {
		t.Fatalf("status %d", res.status)
	}
	if got := (*r.backends[0].lastHeader.Load()).Get("traceparent"); got != traceparent {
		t.Errorf("backend got traceparent %q, want the client's %q", got, traceparent)
	}
}

// TestTracingOTLP exports to an OTLP/HTTP receiver on loopback and reads
// the spans back from the protobuf it received.
func TestTracingOTLP(t *testing.T) {
	var mu sync.Mutex
	var got []*collectortrace.ExportTraceServiceRequest
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		if req.URL.Path != "/v1/traces" || req.Header.Get("Content-Type") != "application/x-protobuf" {
			http.Error(w, "unexpected "+req.URL.Path+" "+req.Header.Get("Content-Type"), http.StatusBadRequest)
			return
		}
		var m collectortrace.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &m); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		got = append(got, &m)
		mu.Unlock()
		out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	defer recv.Close()
	r := newRig(t, "kvroute", 1, func(c *config.Config) {
		c.Tracing = config.Tracing{Enabled: true, Endpoint: recv.URL, Protocol: config.ProtocolHTTP, SampleRatio: 1, ServiceName: "kvroute-test"}
	})
	if res := r.post("/v1/chat/completions", chat("shared", true, "otlp"), "traceparent", traceparent); res.status != 200 {
		t.Fatalf("status %d", res.status)
	}
	if err := r.srv.tracing.tp.ForceFlush(context.Background()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	names := map[string]bool{}
	service, serviceVersion := "", ""
	for _, m := range got {
		for _, rs := range m.ResourceSpans {
			for _, a := range rs.GetResource().GetAttributes() {
				switch a.Key {
				case "service.name":
					service = a.GetValue().GetStringValue()
				case "service.version":
					serviceVersion = a.GetValue().GetStringValue()
				}
			}
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					if hex.EncodeToString(s.TraceId) != clientTraceID {
						t.Errorf("span %s in trace %x", s.Name, s.TraceId)
					}
					names[s.Name] = true
				}
			}
		}
	}
	for _, n := range []string{"chat shared", "admission", "route", "POST", "first_byte"} {
		if !names[n] {
			t.Errorf("the receiver got no %q span (got %v)", n, names)
		}
	}
	if service != "kvroute-test" {
		t.Errorf("service.name %q", service)
	}
	if serviceVersion == "" || serviceVersion != version.Get().Version {
		t.Errorf("service.version %q, want the build's %q", serviceVersion, version.Get().Version)
	}
}

// TestTracingLogs: with tracing on, a startup line says where spans go,
// and the OpenTelemetry library's errors reach the router's own log
// (JSON, not the library's plain text on stderr), at most one per
// interval with the count of those left out.
func TestTracingLogs(t *testing.T) {
	old := newTraceExporter
	newTraceExporter = func(context.Context, config.Tracing) (sdktrace.SpanExporter, error) {
		return tracetest.NewInMemoryExporter(), nil
	}
	t.Cleanup(func() { newTraceExporter = old; otel.SetErrorHandler(otel.ErrorHandlerFunc(func(error) {})) })
	t.Setenv("OTEL_SERVICE_NAME", "")
	r, logs := newLoggedRig(t, 1, func(c *config.Config) {
		c.Tracing = config.Tracing{Enabled: true, Endpoint: "http://collector.example:4318", Protocol: config.ProtocolHTTP, SampleRatio: 0.5, ServiceName: "kvroute-logs"}
	})
	_ = r
	var start map[string]any
	sc := bufio.NewScanner(strings.NewReader(logs.String()))
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil && m["msg"] == "tracing on" {
			start = m
		}
	}
	if start == nil || start["endpoint"] != "http://collector.example:4318" || start["protocol"] != config.ProtocolHTTP ||
		start["sample_ratio"] != 0.5 || start["service_name"] != "kvroute-logs" {
		t.Errorf("startup line %v, want the endpoint, protocol, ratio and service name", start)
	}

	// The handler newTracing installed: three errors in a row give one
	// line; the next allowed one counts the two left out.
	var buf lockedBuffer
	h := newOtelErrors(slog.New(slog.NewJSONHandler(&buf, nil)), time.Hour)
	for range 3 {
		h.Handle(errors.New("export failed: connection refused"))
	}
	lines := strings.Count(buf.String(), "\n")
	if lines != 1 || !strings.Contains(buf.String(), `"err":"export failed: connection refused"`) {
		t.Errorf("three errors logged as %d lines:\n%s", lines, buf.String())
	}
	h.limit.SetLimit(rate.Inf)
	h.Handle(errors.New("again"))
	if !strings.Contains(buf.String(), `"suppressed_since_last":2`) {
		t.Errorf("the next line does not count the 2 left out:\n%s", buf.String())
	}
	// And the global handler is the router's: an error the library
	// reports lands in the router's log.
	otel.Handle(errors.New("from the library"))
	if !strings.Contains(logs.String(), `"err":"from the library"`) {
		t.Errorf("the library's error is not in the router's log:\n%s", logs.String())
	}
}
