package epp_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/slo"
	"github.com/kvroute/kvroute/internal/tracer"
)

// series sums the samples of family name on the router's /metrics page
// whose labels include the given name, value pairs (a histogram's count).
func series(t *testing.T, rg *rig, name string, labels ...string) float64 {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(metrics(t, rg)))
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, m := range fams[name].GetMetric() {
		if hasLabels(m, labels) {
			sum += m.GetCounter().GetValue() + float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum
}

func hasLabels(m *dto.Metric, labels []string) bool {
	have := map[string]string{}
	for _, l := range m.GetLabel() {
		have[l.GetName()] = l.GetValue()
	}
	for i := 0; i+1 < len(labels); i += 2 {
		if have[labels[i]] != labels[i+1] {
			return false
		}
	}
	return true
}

// TestObjectives: the picker's requests with latency objectives are
// recorded in kvroute_slo_* as the HTTP front's are, from what the data
// plane reports: a streamed answer whose first byte and usage came
// within generous objectives is met (both, its two output tokens
// goodput, its TTFT's prediction error observed); one with an objective
// no engine meets is served (standard: best effort) and counted missed;
// a sheddable one no engine can serve in time is refused at once and
// counted shed; a request without objectives is not counted.
func TestObjectives(t *testing.T) {
	rg := newRig(t, 1, nil)
	serve := func(headers map[string]string) {
		t.Helper()
		st := rg.open(t, context.Background())
		body := chat("s", "hello there", true)
		envoy{raw: true, pseudo: true, headers: headers}.sendRequest(t, st, body)
		d := readDecision(t, st)
		if d.immediate != nil {
			t.Fatalf("immediate response %d: %s", d.immediate.GetStatus().GetCode(), d.immediate.GetBody())
		}
		forward(t, st, d.dest, "", body, true) // settled once the picker answered its end
		closeStream(t, st)
	}
	serve(map[string]string{"x-kvroute-slo-ttft-ms": "60000", "x-kvroute-slo-tpot-ms": "60000"})
	serve(map[string]string{"x-kvroute-slo-ttft-ms": "0.001"})
	serve(nil)

	st := rg.open(t, context.Background())
	envoy{raw: true, pseudo: true, headers: map[string]string{"x-kvroute-slo-ttft-ms": "0.001", "x-kvroute-criticality": "sheddable"}}.
		sendRequest(t, st, chat("s", "hello there", true))
	checkImmediate(t, readDecision(t, st), 429)
	if _, err := st.Recv(); err != io.EOF { // the stream ends once the request settled
		t.Fatalf("after the immediate response: %v", err)
	}

	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"kvroute_slo_requests_total", []string{"model", "m", "criticality", "standard"}, 2},
		{"kvroute_slo_requests_total", []string{"criticality", "sheddable"}, 1},
		{"kvroute_slo_shed_total", []string{"model", "m", "criticality", "sheddable"}, 1},
		{"kvroute_slo_met_total", []string{"criticality", "standard", "objective", "both"}, 1},
		{"kvroute_slo_met_total", []string{"criticality", "standard", "objective", "ttft"}, 1},
		{"kvroute_slo_met_total", []string{"criticality", "standard", "objective", "itl"}, 2},
		{"kvroute_slo_goodput_tokens_total", []string{"model", "m", "criticality", "standard"}, 2},
		{"kvroute_slo_prediction_ratio", []string{"backend", "e0", "latency", "ttft"}, 2},
	} {
		if got := series(t, rg, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v: %v, want %v", c.name, c.labels, got, c.want)
		}
	}
}

// TestObjectivesUnreported: a request with objectives whose data plane
// never reports its answer (it takes the decision and leaves) is neither
// met nor missed: once it settled (its access log line written) it is
// counted among the requests (status 499) but not in kvroute_slo_*.
func TestObjectivesUnreported(t *testing.T) {
	var logs logBuffer
	rg := newRigLog(t, 1, func(c *config.Config) { c.Log.Access = true },
		slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})))
	st := rg.open(t, context.Background())
	// One output token: held for a moment only.
	envoy{headers: map[string]string{"x-kvroute-slo-ttft-ms": "60000"}}.
		sendRequest(t, st, `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"hi there"}]}`)
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	readDecision(t, st)
	if _, err := st.Recv(); err != io.EOF {
		t.Fatalf("after the decision: %v, want the end of the stream", err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for len(logs.access(t)) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the held request never settled")
		}
		time.Sleep(time.Millisecond)
	}
	if got := series(t, rg, "kvroute_requests_total", "status", "499"); got != 1 {
		t.Errorf("kvroute_requests_total{status=499}: %v, want the request counted once", got)
	}
	if got := series(t, rg, "kvroute_slo_requests_total"); got != 0 {
		t.Errorf("kvroute_slo_requests_total: %v, want an unreported request not recorded", got)
	}
}

// keep is an in-memory exporter whose spans outlive the router's
// shutdown (which flushes them).
type keep struct{ *tracetest.InMemoryExporter }

func (keep) Shutdown(context.Context) error { return nil }

// TestTracing: with tracing on, the picker writes one span per request,
// kind server, continuing the gateway's traceparent (in the request's
// headers, else in the stream's gRPC metadata, where Envoy puts its own
// ext_proc call's), named for its operation and model; a child "route"
// span with the decision's attributes (the HTTP front's: policy, backend,
// predicted cached tokens, estimated TTFT, reason); the response's phases
// as events; and its outcome (status, backend, tokens) when it ends.
func TestTracing(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	old := tracer.NewExporter
	tracer.NewExporter = func(context.Context, config.Tracing) (sdktrace.SpanExporter, error) { return keep{exp}, nil }
	t.Cleanup(func() { tracer.NewExporter = old })
	rg := newRig(t, 2, func(c *config.Config) { c.Tracing.Enabled = true })
	const headerTrace, grpcTrace, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "0af7651916cd43dd8448eb211c80319c", "00f067aa0ba902b7"
	body := chat("s", "hello there", true)
	st := rg.open(t, context.Background())
	envoy{raw: true, pseudo: true, headers: map[string]string{"traceparent": "00-" + headerTrace + "-" + parentID + "-01",
		slo.HeaderTTFT: "60000"}}.sendRequest(t, st, body)
	d := readDecision(t, st)
	forward(t, st, d.dest, "", body, true)
	closeStream(t, st)
	// No traceparent among the headers: the one in the stream's metadata.
	st = rg.open(t, metadata.AppendToOutgoingContext(context.Background(), "traceparent", "00-"+grpcTrace+"-"+parentID+"-01"))
	envoy{raw: true, pseudo: true}.sendRequest(t, st, body)
	forward(t, st, readDecision(t, st).dest, "", body, true)
	closeStream(t, st)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := rg.srv.Shutdown(ctx); err != nil { // flushes the spans
		t.Fatal(err)
	}

	spans := map[string]tracetest.SpanStub{} // by trace and name
	for _, s := range exp.GetSpans() {
		spans[s.SpanContext.TraceID().String()+" "+s.Name] = s
	}
	if req, ok := spans[grpcTrace+" chat m"]; !ok || req.Parent.SpanID().String() != parentID {
		t.Errorf("no request span under the stream metadata's traceparent (got %v)", spans)
	}
	req, ok := spans[headerTrace+" chat m"]
	if !ok {
		t.Fatalf("no request span named %q in the headers' trace (got %v)", "chat m", spans)
	}
	route := spans[headerTrace+" route"]
	attrs := func(kv []attribute.KeyValue) map[string]string {
		m := map[string]string{}
		for _, a := range kv {
			m[string(a.Key)] = a.Value.String()
		}
		return m
	}
	ra, qa := attrs(route.Attributes), attrs(req.Attributes)
	served := rg.byAddr[d.dest].name
	switch {
	case req.Parent.SpanID().String() != parentID:
		t.Errorf("request span under %s, want the gateway's %s", req.Parent.SpanID(), parentID)
	case req.SpanKind != trace.SpanKindServer:
		t.Errorf("request span kind %v", req.SpanKind)
	case route.Parent.SpanID() != req.SpanContext.SpanID():
		t.Errorf("the route span is not the request span's child")
	case ra["kvroute.policy"] != "kvroute" || ra["kvroute.backend"] != served || ra["kvroute.reason"] == "" ||
		ra["kvroute.predicted_cached_tokens"] == "" || ra["kvroute.estimated_ttft_seconds"] == "":
		t.Errorf("route span attributes %v, want the decision (backend %s)", ra, served)
	case qa["gen_ai.operation.name"] != "chat" || qa["gen_ai.request.model"] != "m" || qa["http.response.status_code"] != "200" ||
		qa["kvroute.backend"] != served || qa["gen_ai.usage.output_tokens"] != "2" || qa["kvroute.front"] != "epp" ||
		qa["server.address"] != "gw":
		t.Errorf("request span attributes %v", qa)
	}
	var events []string
	for _, e := range req.Events {
		events = append(events, e.Name)
	}
	if got := strings.Join(events, ","); got != "response_headers,first_byte,response_end" {
		t.Errorf("events %s, want the response's phases", got)
	}
}
