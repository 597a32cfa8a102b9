package proxy

import (
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/kvroute/kvroute/internal/config"
)

const (
	clientTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	clientSpanID  = "00f067aa0ba902b7"
	traceparent   = "00-" + clientTraceID + "-" + clientSpanID + "-01"
)

// TestTracingSpans: with tracing on, a request is one span continuing the
// client's traceparent, with children for admission, the routing decision
// (and what it decided), each upstream attempt (a failed one marked so)
// and the first byte; the backend receives a traceparent of the same trace
// whose parent is the attempt's span.
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
	for name, want := range map[string]int{"kvroute.request": 2, "admission": 2, "route": 2} {
		if len(byName[name]) != want {
			t.Errorf("%d %q spans, want %d", len(byName[name]), name, want)
		}
	}
	for _, s := range byName["kvroute.request"] {
		if s.Parent.SpanID().String() != clientSpanID {
			t.Errorf("request span's parent %s, want the client's %s", s.Parent.SpanID(), clientSpanID)
		}
	}
	attrs := func(s tracetest.SpanStub) map[string]string {
		m := map[string]string{}
		for _, kv := range s.Attributes {
			m[string(kv.Key)] = kv.Value.String()
		}
		return m
	}
	for _, s := range byName["route"] {
		a := attrs(s)
		if a["kvroute.policy"] != "round-robin" || a["kvroute.backend"] == "" || !strings.HasPrefix(a["kvroute.reason"], "policy=round-robin") {
			t.Errorf("route span attributes %v", a)
		}
	}
	failed := 0
	upstreamIDs := map[string]bool{}
	for _, s := range byName["upstream"] {
		upstreamIDs[s.SpanContext.SpanID().String()] = true
		if s.Status.Code == codes.Error {
			failed++
			if attrs(s)["kvroute.backend"] != "b0" {
				t.Errorf("failed attempt on %s, want b0", attrs(s)["kvroute.backend"])
			}
		}
	}
	// Each request has one successful attempt, after its failed ones.
	if failed == 0 || len(byName["upstream"]) != 2+failed || len(byName["first_byte"]) != 2+failed {
		t.Errorf("%d upstream spans (%d failed) and %d first_byte spans, want one more each than failed per request", len(byName["upstream"]), failed, len(byName["first_byte"]))
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
	service := ""
	for _, m := range got {
		for _, rs := range m.ResourceSpans {
			for _, a := range rs.GetResource().GetAttributes() {
				if a.Key == "service.name" {
					service = a.GetValue().GetStringValue()
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
	for _, n := range []string{"kvroute.request", "admission", "route", "upstream", "first_byte"} {
		if !names[n] {
			t.Errorf("the receiver got no %q span (got %v)", n, names)
		}
	}
	if service != "kvroute-test" {
		t.Errorf("service.name %q", service)
	}
}
