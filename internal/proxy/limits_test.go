package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/clocktest"
	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/request"
)

func TestLimits(t *testing.T) {
	r := newRig(t, "kvroute", 2, func(c *config.Config) {
		c.Limits.MaxHeaderBytes = 4 << 10
		c.Limits.MaxMessages = 3
	})
	// At least 4097 tokens whatever the tokenizer: over the fakes' 4096.
	long := words("long", 4097*request.MaxBytesPerToken)
	tests := []struct {
		name   string
		body   string
		hdr    []string
		status int
		typ    string
		code   string
	}{
		{"headers over the limit", chat("shared", false, "hi"), []string{"X-Big", strings.Repeat("a", 16<<10)}, http.StatusRequestHeaderFieldsTooLarge, "", ""},
		{"too many messages", chat("shared", false, "a", "b", "c", "d"), nil, http.StatusBadRequest, openai.TypeInvalidRequest, "too_many_messages"},
		{"as many messages as allowed", chat("shared", false, "a", "b", "c"), nil, http.StatusOK, "", ""},
		{"prompt over every context", chat("shared", false, long), nil, http.StatusBadRequest, openai.TypeInvalidRequest, "context_length_exceeded"},
		{"prompt within the context", chat("shared", false, long[:8000]), nil, http.StatusOK, "", ""},
		// About 5000 tokens at 4 bytes a token, but text of more bytes a
		// token is fewer: only the engine can tell, so it is forwarded.
		{"prompt over the estimate, not the bound", chat("shared", false, long[:20000]), nil, http.StatusOK, "", ""},
		// own-b0 has no max_model_len in /v1/models: the router does not guess.
		{"unknown context", chat("own-b0", false, long), nil, http.StatusOK, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := r.backends[0].hits.Load() + r.backends[1].hits.Load()
			res := r.post("/v1/chat/completions", tt.body, tt.hdr...)
			if tt.typ == "" {
				if res.status != tt.status {
					t.Fatalf("status %d, want %d: %.200s", res.status, tt.status, res.body)
				}
				return
			}
			checkErrorShape(t, res, tt.status, tt.typ)
			if !strings.Contains(string(res.body), tt.code) {
				t.Errorf("code %s missing from %s", tt.code, res.body)
			}
			if after := r.backends[0].hits.Load() + r.backends[1].hits.Load(); after != before {
				t.Errorf("a rejected request reached a backend")
			}
		})
	}
	res := r.post("/v1/chat/completions", chat("shared", false, long))
	if want := "maximum context length is 4096 tokens"; !strings.Contains(string(res.body), want) {
		t.Errorf("context error %s lacks vLLM's wording %q", res.body, want)
	}
}

// A configured max_model_len bounds every model of the backend, and wins
// over what its /v1/models says (4096 for "shared" on the fakes).
func TestContextFromConfig(t *testing.T) {
	tests := []struct {
		name     string
		discover bool
		model    string
	}{
		{"without discovery", false, "anything"},
		{"over the discovered length", true, "shared"},
		{"over an unknown length", true, "own-b0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, "kvroute", 1, func(c *config.Config) {
				c.Backends[0].MaxModelLen = 1000
				c.Upstream.DiscoverModels = tt.discover
			})
			if res := r.post("/v1/chat/completions", chat(tt.model, false, words("x", 1001*request.MaxBytesPerToken))); res.status != http.StatusBadRequest {
				t.Errorf("status %d, want 400: %s", res.status, res.body)
			}
			if res := r.post("/v1/chat/completions", chat(tt.model, false, words("x", 2000))); res.status != http.StatusOK {
				t.Errorf("status %d, want 200: %s", res.status, res.body)
			}
		})
	}
}

// dial opens a raw connection to the router.
func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// A client that sends its headers too slowly is disconnected.
func TestSlowHeaders(t *testing.T) {
	r := newRig(t, "kvroute", 1, func(c *config.Config) { c.Limits.ReadHeaderTimeout = 200 * time.Millisecond })
	c := dial(t, r.srv.Addr())
	if _, err := io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: "); err != nil {
		t.Fatal(err)
	}
	clock := clocktest.Start(t)
	start := time.Now()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := io.ReadAll(c) // the server closes the connection
	if err != nil {
		t.Fatalf("connection not closed by the router: %v", err)
	}
	if d := time.Since(start); !clock.Within(t, d, 2*time.Second, "closing a connection with half-sent headers") {
		t.Errorf("closed after %v, want about 200ms (%s)", d, clock)
	}
	if r.backends[0].hits.Load() != 0 {
		t.Error("a backend saw the request")
	}
}

// A client that sends its body too slowly gets 408 and never holds a
// backend: the body is read in full before routing.
func TestSlowBody(t *testing.T) {
	r := newRig(t, "kvroute", 1, func(c *config.Config) { c.Limits.BodyTimeout = 300 * time.Millisecond })
	body := chat("shared", false, "hello")
	clock := clocktest.Start(t)
	c := dial(t, r.srv.Addr())
	_, err := io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "+
		itoa(len(body))+"\r\n\r\n"+body[:10])
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to a slow body: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	checkErrorShape(t, result{status: resp.StatusCode, header: resp.Header, body: b}, http.StatusRequestTimeout, openai.TypeInvalidRequest)
	// Never routed: no decision names a backend, and none saw it.
	if r.backends[0].hits.Load() != 0 {
		t.Error("a backend saw the slow request")
	}
	for _, d := range r.srv.decisions.Last(r.srv.decisions.Cap()) {
		if d.Backend != "" || len(d.Legs) != 0 {
			t.Errorf("a half-sent request was routed: %+v", d)
		}
	}
	// The connection is closed at once, not kept for the rest of the body.
	start := time.Now()
	_, err = io.ReadAll(c)
	if d := time.Since(start); err != nil || !clock.Within(t, d, 2*time.Second, "closing the connection after the 408") {
		t.Errorf("connection not closed after the 408: %v after %v (%s)", err, d, clock)
	}
}

// The body deadline ends with the body: a stream that lasts longer than
// limits.body_timeout is not cut.
func TestBodyDeadlineSparesLongStreams(t *testing.T) {
	r := newRig(t, "kvroute", 1, func(c *config.Config) { c.Limits.BodyTimeout = 100 * time.Millisecond })
	r.backends[0].gap = 80 * time.Millisecond
	r.backends[0].events = 6 // about 400ms of stream
	res := r.post("/v1/chat/completions", chat("shared", true, "tell me"))
	want := strings.Join(streamEvents("b0", 6), "")
	if res.status != 200 || res.readErr != nil || string(res.body) != want {
		t.Fatalf("status %d, err %v, body %q", res.status, res.readErr, res.body)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
