package proxy

// The stream timeouts (docs/reliability.md, Stream timeouts): a backend
// that goes silent mid-stream, a client that stops reading, and a backend
// that hangs every completion while its /health answers.

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/clocktest"
	"github.com/kvroute/kvroute/internal/config"
)

// TestStreamIdleTimeout: a backend that sends the first event of a stream
// and then nothing gets its stream ended after upstream.stream_idle_timeout
// with the router's error event (code stream_idle_timeout, no [DONE], and
// a clean end of the chunked body: it was cut before issue 28, which
// clients reported as a network error), its upstream request cancelled,
// and one failure on its
// breaker. A stream whose events come more often than the timeout is
// untouched: the timer counts silence, not the stream's length.
func TestStreamIdleTimeout(t *testing.T) {
	const idle = 300 * time.Millisecond
	r := newRig(t, "round-robin", 1, func(c *config.Config) {
		c.Upstream.StreamIdleTimeout = idle
		c.Retry.Attempts = 0
	})
	r.client.Timeout = 5 * idle
	f := r.backends[0]

	t.Run("silent", func(t *testing.T) {
		f.setMode(modeGated) // the first event, then the gate, which never opens
		start := time.Now()
		res := r.post("/v1/chat/completions", chat("shared", true, "silent"))
		took := time.Since(start)
		if res.status != http.StatusOK {
			t.Fatalf("status %d: %s", res.status, res.body)
		}
		first := streamEvents(f.name, f.events)[0]
		body := string(res.body)
		if !strings.HasPrefix(body, first) || strings.Contains(body, "[DONE]") ||
			!strings.Contains(body[len(first):], `data: {"error":`) || !strings.Contains(body, `"code":"`+streamIdleCode+`"`) {
			t.Errorf("body %q: want the first event, then the router's %s event", body, streamIdleCode)
		}
		if res.readErr != nil {
			t.Errorf("the cut stream's body did not end cleanly (%v): clients report a connection error, not the event", res.readErr)
		}
		if took < idle || took > 3*idle {
			t.Errorf("the stream ended after %v with a %v idle timeout", took, idle)
		}
		select {
		case <-f.cancelled:
		case <-time.After(time.Second):
			t.Error("the silent upstream request was not cancelled")
		}
		b := r.backendByName(f.name)
		if st := r.srv.set.Of(b).Breaker(); st.Fails != 1 {
			t.Errorf("breaker %+v: want one failure counted", st)
		}
	})

	t.Run("slow but alive", func(t *testing.T) {
		f.setMode(modeOK)
		f.gap = idle / 3 // 5 gaps of 100ms: a 500ms stream, never silent for 300ms
		defer func() { f.gap = 2 * time.Millisecond }()
		res := r.post("/v1/chat/completions", chat("shared", true, "slow"))
		if want := strings.Join(streamEvents(f.name, f.events), ""); res.status != http.StatusOK || res.readErr != nil || string(res.body) != want {
			t.Errorf("status %d, read error %v, body %q; want the whole stream", res.status, res.readErr, res.body)
		}
	})
}

// hogBackend streams 64 KiB events as fast as its client reads them, until
// the request is cancelled (signalled on cancelled) or 256 MiB went out;
// a request whose body does not contain "hog" gets the fake's short
// stream instead.
func hogBackend(t *testing.T, cancelled chan struct{}) *httptest.Server {
	t.Helper()
	event := []byte("data: " + strings.Repeat("x", 64<<10-8) + "\n\n")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !completionOnly(w, r) {
			return
		}
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		if !strings.Contains(string(body), "hog") {
			for _, ev := range streamEvents("hog", 2) {
				_, _ = io.WriteString(w, ev)
			}
			return
		}
		for range 256 << 20 / len(event) {
			if _, err := w.Write(event); err != nil {
				break
			}
			w.(http.Flusher).Flush()
		}
		<-r.Context().Done()
		signal(cancelled)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestClientStopsReading: a client that sends a streaming request and then
// never reads (its connection open, its receive window full) is cut off
// after limits.client_write_timeout. That cancels its upstream request and
// frees its backend slot: with admission at one request per backend, the
// next client is admitted and served while the first one's connection is
// still open.
func TestClientStopsReading(t *testing.T) {
	const writeTimeout = 300 * time.Millisecond
	cancelled := make(chan struct{}, 10)
	hog := hogBackend(t, cancelled)
	r := newRig(t, "round-robin", 0, func(c *config.Config) {
		c.Backends = []config.Backend{{URL: hog.URL, Name: "hog", Models: []string{"shared"}}}
		c.Limits.ClientWriteTimeout = writeTimeout
		c.Admission.MaxInFlightPerBackend = 1
		c.Admission.MaxWait = 5 * time.Second
		c.Engines.Enabled = false
	})
	r.client.Timeout = 8 * time.Second

	conn, err := net.Dial("tcp", r.srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.(*net.TCPConn).SetReadBuffer(4096)
	body := chat("shared", true, "hog")
	if _, err := fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: kvroute\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body); err != nil {
		t.Fatal(err)
	}
	// Read the status line only, then stop reading.
	if line, err := bufio.NewReader(conn).ReadString('\n'); err != nil || !strings.Contains(line, "200") {
		t.Fatalf("status line %q, %v", line, err)
	}
	start := time.Now()
	select {
	case <-cancelled:
		t.Logf("the upstream request of the client that stopped reading ended %v after its stream started", time.Since(start))
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream request of a client that stopped reading is still running after 5s")
	}
	res := r.post("/v1/chat/completions", chat("shared", true, "next"))
	if want := strings.Join(streamEvents("hog", 2), ""); res.status != http.StatusOK || string(res.body) != want {
		t.Errorf("the next client: status %d %.200s; want the whole stream", res.status, res.body)
	}
}

// TestFirstTokenTimeoutEjects: a backend that hangs every completion (with
// or without sending headers) while its /health answers, next to a good
// one, with the default 10-minute upstream.response_header_timeout and
// active checks every 20ms. upstream.first_token_timeout bounds each
// streaming attempt there: the request is retried on the good backend,
// and after health.eject_after such timeouts the breaker keeps the hung
// backend out, although every one of its health checks passed.
func TestFirstTokenTimeoutEjects(t *testing.T) {
	const timeout = 300 * time.Millisecond
	for _, afterHeaders := range []bool{false, true} {
		t.Run(map[bool]string{false: "no headers", true: "headers then nothing"}[afterHeaders], func(t *testing.T) {
			cancelled := make(chan struct{}, 100)
			hungName := "b0"
			r := newRig(t, "round-robin", 2, func(c *config.Config) {
				c.Upstream.FirstTokenTimeout = timeout
				c.Health.Cooldown = time.Minute
				c.Health.MaxCooldown = time.Minute
				if afterHeaders {
					hung := httptest.NewServer(hangAfterHeaders(cancelled))
					t.Cleanup(hung.Close)
					c.Backends[0] = config.Backend{URL: hung.URL, Name: "hung", Models: []string{"shared"}}
					hungName = "hung"
				}
			})
			if r.srv.cfg.Upstream.ResponseHeaderTimeout != config.DefaultHeaderTimeout || r.srv.cfg.Health.Path == "" {
				t.Fatal("the test needs the default header timeout and active checks")
			}
			if !afterHeaders {
				r.backends[0].setMode(modeHang)
				r.backends[0].cancelled = cancelled
			}
			// A client timeout a hundred times the first-token timeout
			// catches an attempt that is never cut (it would wait for the
			// 10-minute header timeout) on however busy a machine.
			clock := clocktest.Start(t)
			r.client.Timeout = 100 * timeout
			hb := r.backendByName(hungName)
			good := r.backends[1].name
			// A request met the hung backend if it was retried: a count, not
			// a time, so a slow machine cannot make a quick request look
			// like one that waited.
			var slow int
			for i := range 12 {
				retries := counterValue(r.srv.metrics.retries)
				res := r.post("/v1/chat/completions", chat("shared", true, fmt.Sprintf("hang %d", i)))
				if res.status == 0 {
					t.Fatalf("request %d got no answer within %v (%s)", i, r.client.Timeout, clock)
				}
				if want := strings.Join(streamEvents(good, 4), ""); res.status != http.StatusOK || string(res.body) != want {
					t.Errorf("request %d: status %d from %s: %.200s", i, res.status, res.header.Get("X-Kvroute-Backend"), res.body)
				}
				if counterValue(r.srv.metrics.retries) > retries {
					slow++
				}
			}
			if eject := config.DefaultEjectAfter; slow == 0 || slow > eject {
				t.Errorf("%d requests waited for the hung backend; want 1 to %d", slow, eject)
			}
			if st := r.srv.set.Of(hb).Breaker(); hb.Healthy() || st.State != "open" {
				t.Errorf("hung backend: healthy %v, breaker %s; want ejected", hb.Healthy(), st.State)
			}
			for i := range slow {
				select {
				case <-cancelled:
				case <-time.After(clock.Scale(time.Second)):
					t.Fatalf("hung upstream request %d of %d was not cancelled within %v (%s)", i+1, slow, clock.Scale(time.Second), clock)
				}
			}
			t.Logf("12 streaming requests complete; %d met the hung backend and were retried after %v, then its breaker was open", slow, timeout)
		})
	}
}
