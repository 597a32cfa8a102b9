package proxy

import (
	"bytes"
	"context"
	"io"
	"mime/multipart"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/openai"
)

// TestMissingModel: a body with no model, or a null one, matched every
// backend whatever pool it serves; it is a 400 now, before any backend.
func TestMissingModel(t *testing.T) {
	r := newRig(t, "round-robin", 2, func(c *config.Config) {
		c.Backends[0].Models = []string{"a"}
		c.Backends[1].Models = []string{"b"}
	})
	tests := []struct{ name, path, body string }{
		{"chat without model", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`},
		{"chat with null model", "/v1/chat/completions", `{"model":null,"messages":[{"role":"user","content":"hi"}]}`},
		{"chat with empty model", "/v1/chat/completions", `{"model":"","messages":[{"role":"user","content":"hi"}]}`},
		{"completion without model", "/v1/completions", `{"prompt":"hi"}`},
		{"completion with null model", "/v1/completions", `{"model":null,"prompt":"hi"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := r.post(tt.path, tt.body)
			checkErrorShape(t, res, http.StatusBadRequest, openai.TypeInvalidRequest)
			if !strings.Contains(string(res.body), "missing_model") {
				t.Errorf("body %s lacks missing_model", res.body)
			}
		})
	}
	if h := r.backends[0].hits.Load() + r.backends[1].hits.Load(); h != 0 {
		t.Errorf("%d requests without a model reached a backend", h)
	}
	if res := r.post("/v1/chat/completions", chat("b", false, "hi")); res.status != 200 || res.header.Get(headerBackend) != "b1" {
		t.Errorf("model b: status %d backend %q", res.status, res.header.Get(headerBackend))
	}
}

// send sends method to path with body (of unknown length when chunked)
// and reads the answer.
func (r *rig) send(method, path, contentType string, body io.Reader, length int64) result {
	r.t.Helper()
	req, err := http.NewRequest(method, r.base+path, body)
	if err != nil {
		r.t.Fatal(err)
	}
	req.ContentLength = length
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return result{readErr: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return result{status: resp.StatusCode, header: resp.Header, body: b, readErr: err}
}

// TestPassthroughRouting: passed-through endpoints go only to healthy
// backends that serve the body's model (they went to the least loaded
// backend, whatever it served), and are counted in its load.
func TestPassthroughRouting(t *testing.T) {
	r := newRig(t, "round-robin", 2, func(c *config.Config) {
		c.Backends[0].Models = []string{"a"}
		c.Backends[1].Models = []string{"b"}
	})
	for i := 0; i < 10; i++ {
		res := r.post("/v1/embeddings", `{"input":"x","model":"b"}`)
		if res.status != 200 || res.header.Get(headerBackend) != "b1" {
			t.Fatalf("embeddings for model b: status %d backend %q, want b1", res.status, res.header.Get(headerBackend))
		}
	}
	if d := r.srv.decisions.Last(1); len(d) != 1 || d[0].Model != "b" || d[0].Backend != "b1" || d[0].Status != 200 {
		t.Errorf("decision log after a passthrough request: %+v", d)
	}
	var form bytes.Buffer
	mw := multipart.NewWriter(&form)
	_ = mw.WriteField("model", "a")
	fw, _ := mw.CreateFormFile("file", "a.wav")
	_, _ = fw.Write(bytes.Repeat([]byte{0, 1, 2}, 1000))
	_ = mw.Close()
	res := r.send(http.MethodPost, "/v1/audio/transcriptions", mw.FormDataContentType(), bytes.NewReader(form.Bytes()), int64(form.Len()))
	if res.status != 200 || res.header.Get(headerBackend) != "b0" {
		t.Errorf("transcription for model a: status %d backend %q, want b0", res.status, res.header.Get(headerBackend))
	}
	for _, tt := range []struct {
		body   string
		status int
		code   string
	}{
		{`{"input":"x","model":"c"}`, 404, "model_not_found"},
		{`{"input":"x"}`, 400, "missing_model"},
		{`{"input":"x","model":null}`, 400, "missing_model"},
		{`{"input":"x","model":"b"`, 400, "invalid_json"},
	} {
		if res := r.post("/v1/embeddings", tt.body); res.status != tt.status || !strings.Contains(string(res.body), tt.code) {
			t.Errorf("%s: status %d %s, want %d %s", tt.body, res.status, res.body, tt.status, tt.code)
		}
	}
	// Counted in load while in flight.
	r.backends[1].mode.Store(int32(modeHang))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.base+"/v1/embeddings", strings.NewReader(`{"model":"b","input":"x"}`))
		if resp, err := r.client.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	b1 := r.srv.Fleet().Snapshot().All[1]
	deadline := time.Now().Add(3 * time.Second)
	for b1.Load().InFlight != 1 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if l := b1.Load().InFlight; l != 1 {
		t.Errorf("a passthrough request in flight: b1 in flight %d, want 1", l)
	}
	cancel()
	<-done
	r.backends[1].mode.Store(int32(modeOK))
}

// TestPassthroughPaths: only the allowed endpoints and methods pass
// through, and a path whose encoded form means another once decoded is
// refused: uvicorn decodes /v1/chat%2Fcompletions into a chat completion
// that skipped every check of the router.
func TestPassthroughPaths(t *testing.T) {
	r := newRig(t, "round-robin", 1, nil)
	body := `{"model":"shared","messages":[{"role":"user","content":"hi"}],"input":"x"}`
	tests := []struct {
		method, path string
		status       int
		code         string
	}{
		{"POST", "/v1/chat%2Fcompletions", 400, "invalid_path"},
		{"POST", "/v1/chat%2fcompletions", 400, "invalid_path"},
		{"POST", "/v1/%65mbeddings", 400, "invalid_path"},
		{"POST", "/v1/x/%2e%2e/embeddings", 400, "invalid_path"},
		{"POST", "/v1/load_lora_adapter", 404, "not_found"},
		{"POST", "/v1/unload_lora_adapter", 404, "not_found"},
		{"GET", "/v1/embeddings", 405, "method_not_allowed"},
		{"DELETE", "/v1/embeddings", 405, "method_not_allowed"},
		{"POST", "/v1/echo", 404, "not_found"},
		{"POST", "/v1/embeddings", 200, ""},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			before := r.backends[0].hits.Load()
			req, err := http.NewRequest(tt.method, r.base+"/", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			req.URL.Opaque = tt.path // sent as written
			resp, err := r.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.status || !strings.Contains(string(b), tt.code) {
				t.Fatalf("status %d %s, want %d %s", resp.StatusCode, b, tt.status, tt.code)
			}
			if hit := r.backends[0].hits.Load() != before; hit != (tt.status == 200) {
				t.Errorf("reached the backend: %v", hit)
			}
		})
	}
}

// TestPassthroughBodyLimit: an oversized passthrough body (it was streamed
// 32 MiB deep into the backend, then answered 502 blaming it) gets 413
// before a byte leaves, with or without a length, and the backend is not
// counted as failing.
func TestPassthroughBodyLimit(t *testing.T) {
	r := newRig(t, "round-robin", 1, func(c *config.Config) { c.Limits.MaxBodyBytes = 1 << 20 })
	big := `{"model":"shared","input":"` + strings.Repeat("x", 2<<20) + `"}`
	for _, chunked := range []bool{false, true} {
		length := int64(len(big))
		var body io.Reader = strings.NewReader(big)
		if chunked {
			length, body = -1, io.MultiReader(strings.NewReader(big)) // hides the length
		}
		res := r.send(http.MethodPost, "/v1/embeddings", "application/json", body, length)
		if res.status != http.StatusRequestEntityTooLarge || !strings.Contains(string(res.body), "request_too_large") {
			t.Errorf("chunked %v: status %d %.200s, want 413", chunked, res.status, res.body)
		}
	}
	if h := r.backends[0].hits.Load(); h != 0 {
		t.Errorf("an oversized body reached the backend %d times", h)
	}
	if b := r.srv.set.All()[0].Breaker(); b.Fails != 0 {
		t.Errorf("the backend was blamed: %+v", b)
	}
	if res := r.post("/v1/embeddings", `{"model":"shared","input":"x"}`); res.status != 200 {
		t.Errorf("a small body after: status %d", res.status)
	}
}

// TestBodyBudget: the bodies held at once are bounded by
// limits.max_buffered_bytes; one more gets 503 server_busy with
// Retry-After before its body is read, and the room comes back when the
// requests end. Room is taken as bytes arrive (TestIdleBodiesHoldNoBudget),
// so the two clients that fill it send all of their bodies but the last
// byte.
func TestBodyBudget(t *testing.T) {
	const body = 1 << 20
	r := newRig(t, "round-robin", 1, func(c *config.Config) {
		c.Limits.MaxBodyBytes = body
		c.Limits.MaxBufferedBytes = 2 * body
		c.Limits.MaxBufferedBytesPerClient = 2 * body
	})
	// Two slow clients, each announcing a 1 MiB body and sending all of
	// it but its last byte.
	var writers []*io.PipeWriter
	var wg sync.WaitGroup
	for range 2 {
		pr, pw := io.Pipe()
		writers = append(writers, pw)
		wg.Go(func() { r.send(http.MethodPost, "/v1/completions", "application/json", pr, body) })
		go func() { _, _ = pw.Write(make([]byte, body-1)) }()
	}
	deadline := time.Now().Add(3 * time.Second)
	for r.srv.bodies.used.Load() < 2*body && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	res := r.post("/v1/completions", `{"model":"shared","prompt":"hi"}`)
	checkErrorShape(t, res, http.StatusServiceUnavailable, openai.TypeUnavailable)
	if !strings.Contains(string(res.body), "server_busy") || res.header.Get("Retry-After") != "1" {
		t.Errorf("over the budget: %s, Retry-After %q", res.body, res.header.Get("Retry-After"))
	}
	for _, pw := range writers {
		_ = pw.CloseWithError(io.ErrUnexpectedEOF)
	}
	wg.Wait()
	deadline = time.Now().Add(3 * time.Second)
	for r.srv.bodies.used.Load() != 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if u := r.srv.bodies.used.Load(); u != 0 {
		t.Errorf("%d bytes still held after every request ended", u)
	}
	if res := r.post("/v1/completions", `{"model":"shared","prompt":"hi"}`); res.status != 200 {
		t.Errorf("after: status %d %s", res.status, res.body)
	}
}
