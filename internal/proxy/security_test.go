package proxy

import (
	"bufio"
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/openai"
)

// lockedBuffer is a log sink safe for concurrent writers.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// newLoggedRig is newRig with the router's debug log captured.
func newLoggedRig(t *testing.T, n int, mod func(*config.Config)) (*rig, *lockedBuffer) {
	t.Helper()
	logs := &lockedBuffer{}
	r := newRigLog(t, config.Default().Policy, n, mod, slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	return r, logs
}

func TestForwardedHeaders(t *testing.T) {
	r := newRig(t, "kvroute", 2, nil)
	res := r.post("/v1/chat/completions", chat("shared", false, "hi"),
		"Connection", "X-Hop, keep-alive",
		"X-Hop", "must not pass",
		"Keep-Alive", "timeout=5",
		"Proxy-Connection", "keep-alive",
		"Te", "gzip",
		"X-Forwarded-For", "203.0.113.7",
		"X-Kvroute-Backend", "b1",
		"X-Kvroute-Reason", "forged",
		"Authorization", "Bearer sk-client-key",
	)
	if res.status != 200 {
		t.Fatalf("status %d: %s", res.status, res.body)
	}
	name := res.header.Get(headerBackend)
	var seen http.Header
	for _, f := range r.backends {
		if f.name == name {
			seen = *f.lastHeader.Load()
		}
	}
	if seen == nil {
		t.Fatalf("X-Kvroute-Backend %q names no backend", name)
	}
	for _, h := range []string{"X-Hop", "Keep-Alive", "Proxy-Connection", "Te", "X-Kvroute-Backend", "X-Kvroute-Reason"} {
		if v := seen.Get(h); v != "" {
			t.Errorf("%s reached the backend: %q", h, v)
		}
	}
	if got := seen.Get("X-Forwarded-For"); got != "203.0.113.7, 127.0.0.1" {
		t.Errorf("X-Forwarded-For %q, want the client's list with the peer appended", got)
	}
	if got := seen.Get("Authorization"); got != "Bearer sk-client-key" {
		t.Errorf("Authorization %q did not reach the backend unchanged", got)
	}
	// Response side: the router's own headers name the backend that
	// answered, whatever the client forged.
	if !strings.Contains(string(res.body), "from "+name) || res.header.Get(headerReason) == "forged" {
		t.Errorf("response headers %v do not match the answer %s", res.header, res.body)
	}
}

// counter is an HTTP server that no request may reach.
type counter struct {
	srv  *httptest.Server
	hits atomic.Int64
}

func newCounter(t *testing.T) *counter {
	t.Helper()
	c := &counter{}
	c.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.hits.Add(1)
		_, _ = io.WriteString(w, "evil")
	}))
	t.Cleanup(c.srv.Close)
	return c
}

// No request, however its target, Host or path is written, reaches a host
// the configuration does not name.
func TestNoOpenProxy(t *testing.T) {
	r := newRig(t, "kvroute", 1, nil)
	evil := newCounter(t)
	host := strings.TrimPrefix(evil.srv.URL, "http://")
	body := chat("shared", false, "hi")
	reqs := []string{
		"GET http://" + host + "/v1/models HTTP/1.1\r\nHost: " + host + "\r\n\r\n",
		"GET http://" + host + "/anything HTTP/1.1\r\nHost: " + host + "\r\n\r\n",
		"POST http://" + host + "/v1/chat/completions HTTP/1.1\r\nHost: " + host + "\r\nContent-Length: " + itoa(len(body)) + "\r\n\r\n" + body,
		"GET /v1/models HTTP/1.1\r\nHost: " + host + "\r\n\r\n",
		"GET /v1/echo HTTP/1.1\r\nHost: " + host + "\r\nX-Forwarded-Host: " + host + "\r\n\r\n",
		"CONNECT " + host + " HTTP/1.1\r\nHost: " + host + "\r\n\r\n",
		"GET /v1/../admin HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /v1/..%2f..%2f" + host + "/x HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /v1/%2e%2e/%2e%2e/x HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET //" + host + "/v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /v1/@" + host + "/x HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /v1/echo?url=http://" + host + "/ HTTP/1.1\r\nHost: x\r\n\r\n",
	}
	for _, raw := range reqs {
		c := dial(t, r.srv.Addr())
		if _, err := io.WriteString(c, raw); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		status := 0
		if err == nil {
			status = resp.StatusCode
			b, _ := io.ReadAll(resp.Body)
			if string(b) == "evil" {
				t.Errorf("%q: answered by the unconfigured host", firstLine(raw))
			}
		}
		t.Logf("%-60q -> %d", firstLine(raw), status)
	}
	if n := evil.hits.Load(); n != 0 {
		t.Fatalf("%d requests reached an unconfigured host", n)
	}
	if res := r.post("/v1/chat/completions", body); res.status != 200 {
		t.Fatalf("router unwell after the probes: %d", res.status)
	}
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\r\n")
	return l
}

// The client's Authorization header reaches the backend unchanged and is
// never logged, even at debug level and on errors.
func TestAuthorizationNeverLogged(t *testing.T) {
	const secret = "sk-very-secret-0123456789"
	r, logs := newLoggedRig(t, 2, nil)
	for _, m := range []mode{modeOK, mode500, modeClose} {
		for _, f := range r.backends {
			f.setMode(m)
		}
		r.post("/v1/chat/completions", chat("shared", true, "hi"), "Authorization", "Bearer "+secret)
		r.post("/v1/echo", "x", "Authorization", "Bearer "+secret)
	}
	seen := false
	for _, f := range r.backends {
		if h := f.lastHeader.Load(); h != nil {
			seen = true
			if got := h.Get("Authorization"); got != "Bearer "+secret {
				t.Errorf("backend %s saw Authorization %q", f.name, got)
			}
		}
	}
	if !seen {
		t.Fatal("no request reached a backend")
	}
	out := logs.String()
	if !strings.Contains(out, `"msg":"access"`) || !strings.Contains(out, `"msg":"retry"`) {
		t.Fatalf("no access or retry line captured: the test would prove nothing")
	}
	if strings.Contains(out, secret) {
		t.Errorf("the API key appears in the log:\n%s", out)
	}
}

func TestAPIKeys(t *testing.T) {
	t.Setenv("KVROUTE_TEST_API_KEYS", "key-one, key-two")
	r := newRig(t, "kvroute", 1, func(c *config.Config) { c.Auth.APIKeysEnv = "KVROUTE_TEST_API_KEYS" })
	body := chat("shared", false, "hi")
	tests := []struct {
		name, method, path, auth string
		apiKey                   string // x-api-key, as Anthropic's clients send the key
		status                   int
	}{
		{"no key", "POST", "/v1/chat/completions", "", "", 401},
		{"wrong key", "POST", "/v1/chat/completions", "Bearer key-three", "", 401},
		{"prefix of a key", "POST", "/v1/chat/completions", "Bearer key-on", "", 401},
		{"not bearer", "POST", "/v1/chat/completions", "Basic key-one", "", 401},
		{"first key", "POST", "/v1/chat/completions", "Bearer key-one", "", 200},
		{"x-api-key", "POST", "/v1/chat/completions", "", "key-one", 200},
		{"wrong x-api-key", "POST", "/v1/chat/completions", "", "key-three", 401},
		{"second key", "POST", "/v1/chat/completions", "bearer key-two", "", 200},
		{"models need a key", "GET", "/v1/models", "", "", 401},
		{"healthz exempt", "GET", "/healthz", "", "", 200},
		{"readyz exempt", "GET", "/readyz", "", "", 200},
		{"metrics exempt", "GET", "/metrics", "", "", 200},
		{"dot-dot out of an exempt path", "GET", "/healthz/../v1/models", "", "", 401},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := dial(t, r.srv.Addr())
			raw := tt.method + " " + tt.path + " HTTP/1.1\r\nHost: x\r\n"
			if tt.auth != "" {
				raw += "Authorization: " + tt.auth + "\r\n"
			}
			if tt.apiKey != "" {
				raw += "X-Api-Key: " + tt.apiKey + "\r\n"
			}
			if tt.method == "POST" {
				raw += "Content-Length: " + itoa(len(body)) + "\r\n\r\n" + body
			} else {
				raw += "\r\n"
			}
			if _, err := io.WriteString(c, raw); err != nil {
				t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			if tt.status == 401 {
				checkErrorShape(t, result{status: resp.StatusCode, body: b}, 401, openai.TypeAuthentication)
				if resp.Header.Get("WWW-Authenticate") == "" {
					t.Error("401 without WWW-Authenticate")
				}
				return
			}
			if resp.StatusCode != tt.status {
				t.Errorf("status %d, want %d: %s", resp.StatusCode, tt.status, b)
			}
		})
	}
	if got := r.backends[0].lastHeader.Load(); got == nil || (*got).Get("Authorization") != "bearer key-two" {
		t.Error("the key did not reach the backend unchanged")
	}
}

// A configured but unreadable key source stops the router from starting
// rather than leaving it open.
func TestAPIKeysMisconfigured(t *testing.T) {
	cfg := config.Default()
	cfg.Backends = []config.Backend{{URL: "http://127.0.0.1:1", Models: []string{"m"}}}
	cfg.Auth.APIKeysFile = t.TempDir() + "/missing"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if _, err := newRouter(cfg, nil); err == nil {
		t.Fatal("New accepted a missing api_keys_file")
	}
}
