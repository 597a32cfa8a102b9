package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/version"
)

// accessLines are the access log lines in logs, each as its JSON fields.
func accessLines(t *testing.T, logs *lockedBuffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(logs.String()))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("log line %q: %v", sc.Text(), err)
		}
		if m["msg"] == "access" {
			out = append(out, m)
		}
	}
	return out
}

// accessLine waits for the access log line of the request with id (it is
// written once the handler returns, which may be just after the client
// read its response).
func accessLine(t *testing.T, logs *lockedBuffer, id string) map[string]any {
	t.Helper()
	deadline := time.Now().Add(patience)
	for {
		for _, m := range accessLines(t, logs) {
			if m["request_id"] == id {
				return m
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no access line for request %s in:\n%s", id, logs.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// checkFields compares a line's fields with want; a want of "*" asks only
// that the field be there and not empty or zero.
func checkFields(t *testing.T, what string, m map[string]any, want map[string]any) {
	t.Helper()
	for k, v := range want {
		got, ok := m[k]
		switch {
		case !ok:
			t.Errorf("%s: no field %s in %v", what, k, m)
		case v == "*":
			if got == "" || got == 0.0 || got == nil {
				t.Errorf("%s: %s = %v, want a value", what, k, got)
			}
		case got != v:
			t.Errorf("%s: %s = %v (%T), want %v", what, k, got, got, v)
		}
	}
}

// TestAccessLog: one info line per request, whatever its outcome, with
// the request's id, client, method, path, model, status, backend,
// attempts, TTFT and duration in milliseconds, tokens in and out, the
// routing reason or the router's error code, and the client's trace id.
func TestAccessLog(t *testing.T) {
	r, logs := newLoggedRig(t, 2, func(c *config.Config) {
		c.Policy = "round-robin"
		c.Retry.Attempts = 1
		c.Limits.MaxBodyBytes = 64 << 10
		c.Health.EjectAfter = 100 // b0's 500s must not eject it
	})
	const tp = traceparent // the client's; tracing is off

	// Served: a stream from b0 (round robin starts there) without usage:
	// its 4 token chunks are its tokens out; the prompt is the router's
	// estimate.
	res := r.post("/v1/chat/completions", chat("shared", true, "served"), "traceparent", tp, "X-Request-Id", "client-id-1")
	if res.status != 200 {
		t.Fatalf("served: status %d", res.status)
	}
	m := accessLine(t, logs, "client-id-1")
	checkFields(t, "served stream", m, map[string]any{
		"level": "INFO", "method": "POST", "path": "/v1/chat/completions", "model": "shared", "status": 200.0, "backend": "b0",
		"attempts": 1.0, "tokens_out": 4.0, "tokens_in": "*", "ttft_ms": "*", "duration_ms": "*", "reason": "*", "trace_id": clientTraceID,
		"client": "*",
	})
	if ttft, d := m["ttft_ms"].(float64), m["duration_ms"].(float64); ttft > d || d > 10_000 {
		t.Errorf("ttft_ms %v, duration_ms %v: want milliseconds, TTFT within the duration", ttft, d)
	}
	if !strings.HasPrefix(m["client"].(string), "127.0.0.1:") {
		t.Errorf("client %v, want the loopback address", m["client"])
	}

	// Served as JSON by b1: the usage gives the tokens.
	res = r.post("/v1/chat/completions", chat("shared", false, "json"), "X-Request-Id", "client-id-2")
	m = accessLine(t, logs, "client-id-2")
	checkFields(t, "served JSON", m, map[string]any{"status": 200.0, "backend": "b1", "tokens_in": 3.0, "tokens_out": 2.0, "attempts": 1.0})
	if _, ok := m["trace_id"]; ok {
		t.Errorf("served JSON: a trace id without a traceparent: %v", m)
	}

	// Retried: b0 fails with a 500, the request goes to b1: two attempts,
	// and a retry line at warn with the same request id.
	r.backends[0].setMode(mode500)
	res = r.post("/v1/chat/completions", chat("shared", false, "retried"), "X-Request-Id", "client-id-3")
	if res.status != 200 {
		t.Fatalf("retried: status %d", res.status)
	}
	m = accessLine(t, logs, "client-id-3")
	checkFields(t, "retried", m, map[string]any{"status": 200.0, "backend": "b1", "attempts": 2.0, "tokens_out": 2.0})
	retry := false
	sc := bufio.NewScanner(strings.NewReader(logs.String()))
	for sc.Scan() {
		var l map[string]any
		_ = json.Unmarshal(sc.Bytes(), &l)
		if l["msg"] == "retry" && l["request_id"] == "client-id-3" {
			retry = true
			checkFields(t, "retry line", l, map[string]any{"level": "WARN", "from": "b0", "to": "b1", "attempt": 2.0})
		}
	}
	if !retry {
		t.Errorf("no retry line for client-id-3 in:\n%s", logs.String())
	}
	r.backends[0].setMode(modeOK)

	// Refused by the router, in the exchange and outside it.
	refused := []struct {
		name, path, body string
		want             map[string]any
	}{
		{"bad JSON", "/v1/chat/completions", `{"model":`, map[string]any{"status": 400.0, "error": "invalid_json", "model": "", "backend": "", "attempts": 0.0}},
		{"unknown model", "/v1/chat/completions", chat("nope", false, "x"), map[string]any{"status": 404.0, "error": "model_not_found", "model": "nope", "backend": ""}},
		{"too large", "/v1/chat/completions", chat("shared", false, words("big", 70<<10)), map[string]any{"status": 413.0, "error": "request_too_large"}},
		{"no route", "/nowhere", "x", map[string]any{"status": 404.0, "path": "/nowhere", "model": ""}},
	}
	for i, tt := range refused {
		id := "refused-" + string(rune('a'+i))
		res := r.post(tt.path, tt.body, "X-Request-Id", id)
		if res.status != int(tt.want["status"].(float64)) {
			t.Errorf("%s: status %d", tt.name, res.status)
		}
		checkFields(t, tt.name, accessLine(t, logs, id), tt.want)
	}
}

// TestAccessLogOff: log.access false writes no access line.
func TestAccessLogOff(t *testing.T) {
	r, logs := newLoggedRig(t, 1, func(c *config.Config) { c.Log.Access = false })
	if res := r.post("/v1/chat/completions", chat("shared", false, "x"), "X-Request-Id", "quiet"); res.status != 200 {
		t.Fatalf("status %d", res.status)
	}
	// The line would follow the response, from the handler: once the
	// server has shut down, every handler has returned.
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if err := r.srv.Server.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if l := accessLines(t, logs); len(l) != 0 {
		t.Errorf("access lines with log.access off: %v", l)
	}
}

// TestRequestID: a client's valid X-Request-Id reaches the engine and
// comes back, once although the engine echoes it; a missing or unsafe one
// is replaced by one the router makes, which the engine and the client
// see alike.
func TestRequestID(t *testing.T) {
	old := newRequestID
	n := 0
	newRequestID = func() string { n++; return "generated-" + string(rune('0'+n)) }
	t.Cleanup(func() { newRequestID = old })
	r := newRig(t, "round-robin", 1, nil)
	tests := []struct {
		name, sent, want string
	}{
		{"kept", "req-42_a.b:c/d+e=f@g", "req-42_a.b:c/d+e=f@g"},
		{"none", "", "generated-1"},
		{"unsafe characters", "a b<script>", "generated-2"},
		{"too long", strings.Repeat("x", maxRequestID+1), "generated-3"},
		{"longest kept", strings.Repeat("y", maxRequestID), strings.Repeat("y", maxRequestID)},
	}
	for _, tt := range tests {
		var hdr []string
		if tt.sent != "" {
			hdr = []string{"X-Request-Id", tt.sent}
		}
		res := r.post("/v1/chat/completions", chat("shared", false, "id"), hdr...)
		if res.status != 200 {
			t.Fatalf("%s: status %d", tt.name, res.status)
		}
		if got := res.header.Values("X-Request-Id"); len(got) != 1 || got[0] != tt.want {
			t.Errorf("%s: client got X-Request-Id %q, want %q once (the engine echoes it too)", tt.name, got, tt.want)
		}
		if got := r.backends[0].lastHeader.Load().Get("X-Request-Id"); got != tt.want {
			t.Errorf("%s: engine got X-Request-Id %q, want %q", tt.name, got, tt.want)
		}
	}
	// A refusal carries the id too.
	if res := r.post("/v1/chat/completions", `{"model":`, "X-Request-Id", "bad-body"); res.header.Get("X-Request-Id") != "bad-body" {
		t.Errorf("a 400 came back with X-Request-Id %q", res.header.Get("X-Request-Id"))
	}
}

// TestMetricsFromStartup: before any request, and with admission off,
// /metrics already has every family a dashboard panel reads, at zero:
// the queue's, the per-model latency and token families of each
// backend's models, and kvroute_build_info at 1 with the build's labels.
func TestMetricsFromStartup(t *testing.T) {
	r := newRig(t, "round-robin", 1, nil)
	if r.srv.adm != nil {
		t.Fatal("admission is on; the test wants it off")
	}
	body := string(r.get("/metrics").body)
	v := version.Get()
	for _, want := range []string{
		"kvroute_queue_length 0",
		`kvroute_queue_rejections_total{reason="full"} 0`,
		`kvroute_queue_wait_seconds_count{outcome="admitted"} 0`,
		"kvroute_queue_admitted_total 0",
		`kvroute_ttft_seconds_count{backend="b0",model="shared"} 0`,
		`kvroute_e2e_seconds_count{backend="b0",model="shared"} 0`,
		`kvroute_inter_token_latency_seconds_count{backend="b0",model="shared"} 0`,
		`kvroute_input_tokens_total{backend="b0",model="shared"} 0`,
		`kvroute_output_tokens_total{backend="b0",model="shared"} 0`,
		fmt.Sprintf(`kvroute_build_info{goversion=%q,revision=%q,version=%q} 1`, v.GoVersion, v.Revision, v.Version),
	} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("/metrics has no line %s", want)
		}
	}
}

// TestTokenMetrics: a served stream counts its tokens (the usage chunk's
// when it has one, else its token chunks) under its backend and model,
// and observes one inter-token gap fewer than its token chunks.
func TestTokenMetrics(t *testing.T) {
	r := newRig(t, "round-robin", 1, nil)
	if res := r.post("/v1/chat/completions", chat("shared", true, "tokens")); res.status != 200 {
		t.Fatalf("status %d", res.status)
	}
	if res := r.post("/v1/chat/completions", chat("shared", false, "tokens")); res.status != 200 {
		t.Fatalf("status %d", res.status)
	}
	m := r.srv.metrics
	events := r.backends[0].events
	waitFor(t, "both answers' output tokens", func() bool {
		return counterValue(m.tokensOut.WithLabelValues("b0", "shared")) >= float64(events+2)
	})
	if got := counterValue(m.tokensOut.WithLabelValues("b0", "shared")); got != float64(events+2) {
		t.Errorf("output tokens %v, want %d (the stream's chunks) + 2 (the JSON answer's usage)", got, events)
	}
	if got := counterValue(m.tokensIn.WithLabelValues("b0", "shared")); got <= 3 {
		t.Errorf("input tokens %v, want the stream's estimate + 3", got)
	}
	if n := histogramCount(t, m.itl, "b0", "shared"); n != uint64(events-1) {
		t.Errorf("%d inter-token gaps observed, want %d", n, events-1)
	}
}

// histogramCount is the observation count of vec's child with labels.
func histogramCount(t *testing.T, vec *prometheus.HistogramVec, labels ...string) uint64 {
	t.Helper()
	var pb dto.Metric
	if err := vec.WithLabelValues(labels...).(prometheus.Metric).Write(&pb); err != nil {
		t.Fatal(err)
	}
	return pb.GetHistogram().GetSampleCount()
}

// TestAccessLogRefusals: the refusals made before or instead of routing
// are logged too, with their status: 503 with no healthy backend, 401 and
// 429 from the API key check and its limiter.
func TestAccessLogRefusals(t *testing.T) {
	t.Setenv("KVROUTE_TEST_ACCESS_KEYS", "good-key")
	r, logs := newLoggedRig(t, 1, func(c *config.Config) {
		c.Auth.APIKeysEnv = "KVROUTE_TEST_ACCESS_KEYS"
		c.Limits.AuthFailuresPerMinute = 1
		c.Health.EjectAfter = 1
	})
	body := chat("shared", false, "x")
	r.backends[0].health.Store(false)
	deadline := time.Now().Add(patience)
	for i := 0; ; i++ {
		id := fmt.Sprintf("unhealthy-%d", i)
		res := r.post("/v1/chat/completions", body, "X-Request-Id", id, "Authorization", "Bearer good-key")
		if res.status == 503 {
			checkFields(t, "503", accessLine(t, logs, id), map[string]any{"status": 503.0, "error": "no_healthy_backend", "model": "shared", "backend": ""})
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still status %d with the only backend failing its health checks", res.status)
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.backends[0].health.Store(true)

	// The limiter blocks the address for the rest of the minute: last.
	if res := r.post("/v1/chat/completions", body, "X-Request-Id", "bad-key-1", "Authorization", "Bearer nope"); res.status != 401 {
		t.Fatalf("bad key: status %d", res.status)
	}
	checkFields(t, "401", accessLine(t, logs, "bad-key-1"), map[string]any{"status": 401.0, "backend": "", "attempts": 0.0})
	if res := r.post("/v1/chat/completions", body, "X-Request-Id", "bad-key-2", "Authorization", "Bearer nope"); res.status != 429 {
		t.Fatalf("second bad key: status %d", res.status)
	}
	checkFields(t, "429", accessLine(t, logs, "bad-key-2"), map[string]any{"status": 429.0, "backend": ""})
}
