package epp_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/kvroute/kvroute/internal/config"
)

// logBuffer is a log's output, safe for the router's goroutines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// access are the access log lines written so far.
func (b *logBuffer) access(t *testing.T) []map[string]any {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(b.buf.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if m["msg"] == "access" {
			out = append(out, m)
		}
	}
	return out
}

// TestAccessLog: a request the picker routed gets the HTTP front's access
// log line, written by the same code once it settled: the same fields,
// its front named, its request id (the client's), the backend that
// served, the decision's reason, its status, TTFT and tokens.
func TestAccessLog(t *testing.T) {
	var logs logBuffer
	rg := newRigLog(t, 2, func(c *config.Config) { c.Log.Access = true },
		slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})))
	body := chat("s1", "hello there", true)

	req, _ := http.NewRequest(http.MethodPost, "http://"+rg.srv.Addr()+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", "via-http")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var sink bytes.Buffer
	_, _ = sink.ReadFrom(resp.Body)
	resp.Body.Close()
	rg.waitIdle(t)

	served := rg.pick(t, body, map[string]string{"x-request-id": "via-epp"})

	// Without the client's id, the router makes one and the decision
	// hands it to the engine; the line carries it.
	st := rg.open(t, t.Context())
	envoy{raw: true, pseudo: true, chunk: 4096}.sendRequest(t, st, body)
	d := readDecision(t, st)
	if d.requestID == "" {
		t.Error("a request without x-request-id got none with its decision")
	}
	forward(t, st, d.dest, "", body, true)
	closeStream(t, st)

	lines := map[string]map[string]any{}
	for _, m := range logs.access(t) {
		lines[m["request_id"].(string)] = m
	}
	h, e := lines["via-http"], lines["via-epp"]
	if h == nil || e == nil {
		t.Fatalf("access lines %v: want via-http's and via-epp's", lines)
	}
	for k := range h {
		if _, ok := e[k]; !ok && k != "time" {
			t.Errorf("the picker's line has no %s (the HTTP front's: %v)", k, h[k])
		}
	}
	want := map[string]any{"front": "epp", "status": 200.0, "backend": served.name, "model": "m",
		"path": "/v1/chat/completions", "method": "POST", "attempts": 1.0, "tokens_in": 5.0, "tokens_out": 2.0}
	for k, v := range want {
		if e[k] != v {
			t.Errorf("the picker's line: %s = %v, want %v", k, e[k], v)
		}
	}
	if m := lines[d.requestID]; m == nil || m["front"] != "epp" {
		t.Errorf("no picker's line with the router's request id %q: %v", d.requestID, m)
	}
	if h["front"] != "http" {
		t.Errorf("the HTTP front's line: front = %v", h["front"])
	}
	if r, _ := e["reason"].(string); !strings.HasPrefix(r, "policy=") || !strings.Contains(r, "est_ttft=") {
		t.Errorf("the picker's line: reason %q (the HTTP front's: %q)", r, h["reason"])
	}
	t.Logf("HTTP front: %v\npicker: %v", h, e)
	if ttft, _ := e["ttft_ms"].(float64); ttft <= 0 {
		t.Errorf("the picker's line: ttft_ms %v, want the reported first byte's", e["ttft_ms"])
	}
}
