package proxy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/openai"
)

// patience bounds a wait for something the router does at once; it is
// generous, since the machine may be loaded, and only ever reached when
// the router does not do it at all.
const patience = 10 * time.Second

// limitHitsOf reads kvroute_client_limit_hits_total{limit=...} off the
// router's /metrics (0 when absent).
func (r *rig) limitHitsOf(limit string) float64 {
	r.t.Helper()
	res := r.get("/metrics")
	prefix := `kvroute_client_limit_hits_total{limit="` + limit + `"} `
	for line := range strings.SplitSeq(string(res.body), "\n") {
		if v, ok := strings.CutPrefix(line, prefix); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return 0
}

// waitFor polls cond until it holds, failing the test after patience.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("still waiting for %s after %v", what, patience)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// startBody opens a connection that sends a request's headers declaring
// length body bytes, then the first sent of them, and waits.
func startBody(t *testing.T, r *rig, length, sent int, hdr ...string) net.Conn {
	t.Helper()
	c := dial(t, r.srv.Addr())
	var b strings.Builder
	fmt.Fprintf(&b, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n", length)
	for i := 0; i+1 < len(hdr); i += 2 {
		fmt.Fprintf(&b, "%s: %s\r\n", hdr[i], hdr[i+1])
	}
	b.WriteString("\r\n")
	b.WriteString(strings.Repeat(" ", sent))
	if _, err := io.WriteString(c, b.String()); err != nil {
		t.Fatal(err)
	}
	return c
}

// readAnswer reads one response off c within patience.
func readAnswer(t *testing.T, c net.Conn) result {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(patience))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer within %v: %v", patience, err)
	}
	defer resp.Body.Close()
	b, rerr := io.ReadAll(resp.Body)
	return result{status: resp.StatusCode, header: resp.Header, body: b, readErr: rerr}
}

// TestDeclaredLengthOverLimit (finding 4): a body declared over
// limits.max_body_bytes gets 413 at once, before its bytes arrive (net/http
// used to wait for 256 KiB of it, or the body timeout, before answering).
func TestDeclaredLengthOverLimit(t *testing.T) {
	r := newRig(t, "round-robin", 1, func(c *config.Config) {
		c.Limits.MaxBodyBytes = 1 << 20
		c.Limits.BodyTimeout = time.Hour
	})
	c := startBody(t, r, 1<<20+1, 1)
	res := readAnswer(t, c)
	checkErrorShape(t, res, http.StatusRequestEntityTooLarge, openai.TypeInvalidRequest)
	if !strings.Contains(string(res.body), "request_too_large") {
		t.Errorf("body %s lacks request_too_large", res.body)
	}
	if r.backends[0].hits.Load() != 0 {
		t.Error("the backend saw the request")
	}
}

// TestIdleBodiesHoldNoBudget (finding 4): connections that declare the
// largest body, send a byte and wait hold a first buffer each, not their
// declared length, so the budget of buffered bodies still serves everyone
// else (they used to take all of it until body_timeout).
func TestIdleBodiesHoldNoBudget(t *testing.T) {
	const body = 1 << 20
	r := newRig(t, "round-robin", 1, func(c *config.Config) {
		c.Limits.MaxBodyBytes = body
		c.Limits.MaxBufferedBytes = 8 * body
		c.Limits.MaxBufferedBytesPerClient = 8 * body // the attack alone, without shares
		c.Limits.BodyTimeout = time.Hour
		c.Limits.MinBodyRate = 0
	})
	for range 8 {
		startBody(t, r, body, 1)
	}
	// Each holds its first buffer (16 KiB), or more.
	waitFor(t, "the 8 bodies to be read", func() bool { return r.srv.bodies.used.Load() >= 8*(16<<10) })
	for i := range 3 {
		if res := r.post("/v1/completions", `{"model":"shared","prompt":"hi"}`); res.status != http.StatusOK {
			t.Fatalf("request %d while 8 clients stall: status %d %s (%d bytes of bodies held)", i, res.status, res.body, r.srv.bodies.used.Load())
		}
	}
}

// TestBodyShares (finding 4): one client's bodies still arriving hold at
// most limits.max_buffered_bytes_per_client; past it that client gets 429
// while another client (another API key) is still served.
func TestBodyShares(t *testing.T) {
	const body = 64 << 10
	t.Setenv("KVROUTE_TEST_API_KEYS", "key-a,key-b")
	t.Setenv(config.AdminTokenEnv, "")
	r := newRig(t, "round-robin", 1, func(c *config.Config) {
		c.Auth.APIKeysEnv = "KVROUTE_TEST_API_KEYS"
		c.Limits.MaxBodyBytes = body
		c.Limits.MaxBufferedBytes = 8 * body
		c.Limits.MaxBufferedBytesPerClient = 2 * body
		c.Limits.BodyTimeout = time.Hour
		c.Limits.MinBodyRate = 0
	})
	// Client A sends two whole bodies but their last byte: its share.
	for range 2 {
		startBody(t, r, body, body-1, "Authorization", "Bearer key-a")
	}
	waitFor(t, "client A's bodies to arrive", func() bool { return r.srv.bodies.used.Load() >= 2*body })
	c := startBody(t, r, body, body-1, "Authorization", "Bearer key-a")
	res := readAnswer(t, c)
	checkErrorShape(t, res, http.StatusTooManyRequests, openai.TypeRateLimit)
	if res := r.post("/v1/completions", `{"model":"shared","prompt":"hi"}`, "Authorization", "Bearer key-b"); res.status != http.StatusOK {
		t.Errorf("client B while A's share is full: status %d %s", res.status, res.body)
	}
	if n := r.limitHitsOf("buffered_bytes_per_client"); n != 1 {
		t.Errorf("share hits counted: %v, want 1", n)
	}
}

// TestMinBodyRate (finding 4): a body that trickles in under
// limits.min_body_rate is cut with 408 after the grace, long before
// body_timeout.
func TestMinBodyRate(t *testing.T) {
	r := newRig(t, "round-robin", 1, func(c *config.Config) {
		c.Limits.BodyTimeout = time.Hour
		c.Limits.MinBodyRate = 1 << 10
		c.Limits.BodyRateGrace = 50 * time.Millisecond
	})
	c := startBody(t, r, 1000, 10)
	res := readAnswer(t, c)
	checkErrorShape(t, res, http.StatusRequestTimeout, openai.TypeInvalidRequest)
	if !strings.Contains(string(res.body), "min_body_rate") {
		t.Errorf("408 %s does not name the rate", res.body)
	}
	if n := r.limitHitsOf("min_body_rate"); n != 1 {
		t.Errorf("rate hits counted: %v, want 1", n)
	}
	if r.backends[0].hits.Load() != 0 {
		t.Error("the backend saw the request")
	}
}

// TestHeaderLimitDefault (finding 9): headers over 64 KiB get 431 by
// default (the limit was 1 MiB), counted as a limit hit.
func TestHeaderLimitDefault(t *testing.T) {
	r := newRig(t, "round-robin", 1, nil)
	res := r.post("/v1/completions", `{"model":"shared","prompt":"hi"}`, "X-Big", strings.Repeat("a", 100<<10))
	if res.status != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("100 KiB of headers: status %d, want 431", res.status)
	}
	if n := r.limitHitsOf("max_header_bytes"); n != 1 {
		t.Errorf("header hits counted: %v, want 1", n)
	}
}

// TestMaxConnections (finding 9): past limits.max_connections a new
// connection waits, counted and logged, until a place frees; an idle
// keep-alive connection is closed to make room, a busy one is not.
func TestMaxConnections(t *testing.T) {
	r := newRig(t, "round-robin", 1, func(c *config.Config) { c.Limits.MaxConnections = 2 })
	// One connection busy sending its headers, one idle after a request.
	busy := dial(t, r.srv.Addr())
	if _, err := io.WriteString(busy, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"); err != nil {
		t.Fatal(err)
	}
	idle := &http.Client{Transport: &http.Transport{}}
	defer idle.CloseIdleConnections()
	resp, err := idle.Get(r.base + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	// A third client: the idle connection makes room for it.
	third := dial(t, r.srv.Addr())
	if _, err := io.WriteString(third, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if res := readAnswer(t, third); res.status != http.StatusOK {
		t.Fatalf("third connection: status %d", res.status)
	}
	// A fourth takes the place of the third, idle after its answer.
	fourth := dial(t, r.srv.Addr())
	if _, err := io.WriteString(fourth, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if res := readAnswer(t, fourth); res.status != http.StatusOK {
		t.Fatalf("fourth connection: status %d", res.status)
	}
	// A fifth, sending its headers, takes the fourth's place; a sixth
	// then waits, both places busy with a request, until the first is
	// closed.
	fifth := dial(t, r.srv.Addr())
	if _, err := io.WriteString(fifth, "GET /healthz HTTP/1.1\r\n"); err != nil {
		t.Fatal(err)
	}
	sixth := dial(t, r.srv.Addr())
	if _, err := io.WriteString(sixth, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	// A lower bound: a loaded machine only makes an answer later.
	_ = sixth.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if n, err := sixth.Read(make([]byte, 1)); n > 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("sixth connection: read %d bytes (%v) while both places were busy, want it to wait", n, err)
	}
	_ = busy.Close()
	if res := readAnswer(t, sixth); res.status != http.StatusOK {
		t.Fatalf("sixth connection: status %d", res.status)
	}
	// /metrics needs a connection too: the third, now idle, is closed for it.
	if n := r.limitHitsOf("max_connections"); n < 1 {
		t.Errorf("connection limit hits counted: %v, want at least 1", n)
	}
	if n := r.limitHitsOf("idle_closed"); n < 1 {
		t.Errorf("idle connections closed for room: %v, want at least 1", n)
	}
}

// TestLoopDetected (finding 9): a backend URL that leads back to the
// router is answered 508 loop_detected at the second pass instead of
// looping; forwarded requests carry the router's Via.
func TestLoopDetected(t *testing.T) {
	var hops atomic.Int64
	var routerURL atomic.Pointer[url.URL]
	// A plain reverse proxy in front of the router, as a misconfigured
	// load balancer would be; it gives up after 20 hops so that a router
	// without hop detection fails the test instead of looping on.
	mirror := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path == "/v1/completions" && hops.Add(1) > 20 {
			http.Error(w, "too many hops", http.StatusInternalServerError)
			return
		}
		httputil.NewSingleHostReverseProxy(routerURL.Load()).ServeHTTP(w, req)
	}))
	defer mirror.Close()
	r := newRig(t, "round-robin", 1, func(c *config.Config) {
		c.Retry.Attempts = 0
		c.Backends = append(c.Backends, config.Backend{URL: mirror.URL, Name: "mirror", Models: []string{"looped"}})
	})
	u, _ := url.Parse(r.base)
	routerURL.Store(u)
	res := r.post("/v1/completions", `{"model":"looped","prompt":"hi"}`)
	checkErrorShape(t, res, http.StatusLoopDetected, openai.TypeServer)
	if !strings.Contains(string(res.body), "loop_detected") {
		t.Errorf("body %s lacks loop_detected", res.body)
	}
	if n := hops.Load(); n != 1 {
		t.Errorf("the request went %d times through the loop, want 1", n)
	}
	if res := r.post("/v1/completions", `{"model":"shared","prompt":"hi"}`); res.status != http.StatusOK {
		t.Fatalf("a request to a real backend: status %d", res.status)
	}
	h := r.backends[0].lastHeader.Load()
	if h == nil || !strings.HasPrefix(h.Get("Via"), "1.1 kvroute-") {
		t.Errorf("the forwarded request's Via: %v", h)
	}
}

// TestOneContinue (finding 9): a client that sends Expect: 100-continue
// gets one 100 Continue, not the router's and then its backend's.
func TestOneContinue(t *testing.T) {
	r := newRig(t, "round-robin", 1, nil)
	body := `{"model":"shared","prompt":"hi"}`
	c := dial(t, r.srv.Addr())
	_, err := fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n", len(body))
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(patience))
	br := bufio.NewReader(c)
	continues := 0
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("after %d 100 Continue: %v", continues, err)
		}
		if resp.StatusCode == http.StatusContinue {
			if continues++; continues == 1 {
				if _, err := io.WriteString(c, body); err != nil {
					t.Fatal(err)
				}
			}
			continue
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Errorf("status %d", resp.StatusCode)
		}
		break
	}
	if continues != 1 {
		t.Errorf("%d 100 Continue responses, want 1", continues)
	}
}

// FuzzVia reads fuzzed Via headers: no panic; a header that does not
// hold the router's name is never a loop, and one with the entry the
// router adds (alone or after others) always is.
func FuzzVia(f *testing.F) {
	s := &Server{via: viaName()}
	for _, seed := range []string{"", "1.1 proxy", "1.0 fred, 1.1 p.example.net", "HTTP/1.1 " + s.via + " (kvroute)", ",,,", "1.1\t" + s.via} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, v string) {
		got := s.looped(http.Header{"Via": {v}})
		if got && !strings.Contains(v, s.via) {
			t.Fatalf("%q taken for a loop", v)
		}
		for _, h := range []http.Header{{"Via": {v + ", 1.1 " + s.via}}, {"Via": {v, "1.1 " + s.via}}} {
			if !s.looped(h) {
				t.Fatalf("%q with the router's entry not taken for a loop", h["Via"])
			}
		}
	})
}

// TestStreamEndOpenAISDK (finding 9): the OpenAI Python SDK reading a
// stream the router ends (stream idle timeout) raises an APIError with the
// router's message, not a connection error. Skipped where the SDK is not
// installed.
func TestStreamEndOpenAISDK(t *testing.T) {
	if err := exec.Command("python3", "-c", "import openai").Run(); err != nil {
		t.Skip("the OpenAI Python SDK is not installed (python3 -c 'import openai' fails)")
	}
	r := newRig(t, "round-robin", 1, func(c *config.Config) {
		c.Upstream.StreamIdleTimeout = 300 * time.Millisecond
		c.Retry.Attempts = 0
	})
	r.backends[0].setMode(modeGated) // the first event, then nothing
	script := `
import sys, openai
c = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="x", max_retries=0, timeout=30)
try:
    for _ in c.chat.completions.create(model="shared", messages=[{"role": "user", "content": "hi"}], stream=True):
        pass
    print("no error")
except openai.APIConnectionError as e:
    print("connection error:", type(e).__name__, e)
except openai.APIError as e:
    print("api error:", e.message)
`
	out, err := exec.Command("python3", "-c", script, r.base).CombinedOutput()
	if err != nil {
		t.Fatalf("python: %v: %s", err, out)
	}
	if !strings.HasPrefix(string(out), "api error:") || !strings.Contains(string(out), "stream idle timeout") {
		t.Errorf("the SDK reported %q, want an APIError with the router's message", out)
	}
}
