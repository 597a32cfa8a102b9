package proxy

// Fault injection: engines that crash, hang or answer garbage, and clients
// that leave, each with a bounded number of requests on loopback and a
// verdict on what every client saw. docs/reliability.md (Faults) lists
// them with their last measured results. Related tests elsewhere:
// TestKillMidRun and TestCrashMovesOnlyDeadSessions (failover_test.go),
// TestClientDisconnect and TestGracefulShutdown (proxy_test.go), the
// reload-under-load tests (members_test.go), and the shutdown of the
// kvroute binary itself (cmd/kvroute/shutdown_test.go).

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/clocktest"
	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/racetest"
)

// emuBackend is an emulated vLLM engine behind a socket the test can cut.
type emuBackend struct {
	name string
	em   *emulator.Server
	srv  *httptest.Server
}

// newEmuBackend starts an emulated engine serving the model "shared" at
// time scale scale; it is closed at the end of the test.
func newEmuBackend(t *testing.T, name string, scale float64) *emuBackend {
	t.Helper()
	p, err := engine.LookupPreset("a100-llama3-8b")
	if err != nil {
		t.Fatal(err)
	}
	em, err := emulator.New(emulator.Config{Preset: p, TimeScale: scale, Model: "shared"})
	if err != nil {
		t.Fatal(err)
	}
	e := &emuBackend{name: name, em: em, srv: httptest.NewServer(em.Handler())}
	t.Cleanup(func() {
		e.srv.Close()
		_ = em.Close()
	})
	return e
}

// kill crashes the engine as seen from the network: the listener is gone
// and every open connection is reset, whatever its request was doing.
func (e *emuBackend) kill() {
	_ = e.srv.Listener.Close()
	e.srv.CloseClientConnections()
}

// newEmuRig is a router in front of n emulated engines.
func newEmuRig(t *testing.T, n int, scale float64, mod func(*config.Config)) (*rig, []*emuBackend) {
	t.Helper()
	var ems []*emuBackend
	for i := range n {
		ems = append(ems, newEmuBackend(t, fmt.Sprintf("e%d", i), scale))
	}
	r := newRig(t, "kvroute", 0, func(c *config.Config) {
		for _, e := range ems {
			c.Backends = append(c.Backends, config.Backend{URL: e.srv.URL, Name: e.name})
		}
		if mod != nil {
			mod(c)
		}
	})
	return r, ems
}

// sseOutcome is what a client made of one streamed response.
type sseOutcome int

const (
	sseComplete sseOutcome = iota // ended by data: [DONE], no error event
	sseCut                        // ended by the router's error event, no [DONE], and a clean end of the body
	sseBad                        // anything else
)

// judgeStream classifies a streamed body as its client sees it.
func judgeStream(body string, readErr error) sseOutcome {
	done := strings.HasSuffix(body, "data: [DONE]\n\n")
	events := strings.Split(strings.TrimRight(body, "\n"), "\n\n")
	last := events[len(events)-1]
	cut := strings.HasPrefix(last, "data: {\"error\":") && strings.Contains(last, `"code":"`+streamBrokenCode+`"`) && strings.Contains(last, `"type":"server_error"`)
	switch {
	case done && readErr == nil && !strings.Contains(body, `data: {"error"`):
		return sseComplete
	case cut && !strings.Contains(body, "[DONE]") && readErr == nil:
		return sseCut
	}
	return sseBad
}

// TestFaultEngineKilledUnderLoad crashes one of three emulated engines
// with 200 streams in flight, some streaming from it and some waiting for
// their first byte there. Every request that had not received a byte
// completes on another engine; the router stays up and its accounting
// returns to zero (newRig checks that). With migration off, every stream
// the crash cut ends with the router's error event and no [DONE]; with it
// on (the default), every stream completes, and each one that moved reads
// the very text the same request gets from an engine uninterrupted.
func TestFaultEngineKilledUnderLoad(t *testing.T) {
	t.Run("migration off", func(t *testing.T) { faultEngineKilled(t, false) })
	t.Run("migration on", func(t *testing.T) {
		racetest.Heavy(t, "200 streams, and the moved ones sent again to compare their text")
		faultEngineKilled(t, true)
	})
}

func faultEngineKilled(t *testing.T, moves bool) {
	const requests = 200
	r, ems := newEmuRig(t, 3, 20, func(c *config.Config) {
		// Round robin: this test is about failover, and it needs the victim
		// to surely hold streams and queued prefills when it dies (a
		// load-aware policy may steer away from it at just that moment).
		c.Policy = "round-robin"
		c.Health.Cooldown = time.Minute
		c.Health.MaxCooldown = time.Minute
		c.Retry.Attempts = 2
		if !moves {
			c.Migration.MaxAttempts = 0
		}
	})
	victim := ems[0]
	vb := r.backendByName(victim.name)
	// Every other request streams 600 tokens, long enough to be cut by the
	// crash even when the machine is slow to deliver it (of the five or
	// more streams the victim holds, one is long but for a 1-in-32
	// chance); the others 60, so that the survivors finish the load in
	// about a second even under the race detector.
	tokens := func(i int) int {
		if i%2 == 0 {
			return 600
		}
		return 60
	}

	// The load takes about 2 s under the race detector on a quiet
	// machine; its deadline stretches with the machine's load, and a
	// request that hangs still reaches it.
	clock := clocktest.Start(t)
	ctx, cancel := clock.Context(context.Background(), 9*time.Second)
	defer cancel()
	results := make([]streamResult, requests)
	gaps := make([]time.Duration, requests) // each stream's longest wait between two reads
	body := func(i int) string {
		return fmt.Sprintf(`{"model":"shared","stream":true,"max_tokens":%d,"ignore_eos":true,"messages":[{"role":"user","content":%q}]}`,
			tokens(i), words(fmt.Sprintf("kill-%d", i), 2000))
	}
	var wg sync.WaitGroup
	for i := range requests {
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.base+"/v1/chat/completions", strings.NewReader(body(i)))
			req.Header.Set("Content-Type", "application/json")
			resp, err := r.client.Do(req)
			if err != nil {
				results[i] = streamResult{err: err}
				return
			}
			defer resp.Body.Close()
			var b []byte
			var rerr error
			buf := make([]byte, 32<<10)
			var last time.Time
			for {
				n, err := resp.Body.Read(buf)
				b = append(b, buf[:n]...)
				if now := time.Now(); n > 0 {
					if !last.IsZero() {
						gaps[i] = max(gaps[i], now.Sub(last))
					}
					last = now
				}
				if err != nil {
					if err != io.EOF {
						rerr = err
					}
					break
				}
			}
			results[i] = streamResult{status: resp.StatusCode, backend: resp.Header.Get("X-Kvroute-Backend"), body: string(b), readErr: rerr}
		})
	}
	at := vb.Load()
	if !clock.Until(6*time.Second, func() bool { at = vb.Load(); return at.Decoding >= 5 && at.InFlight-at.Decoding >= 5 }) {
		cancel()
		wg.Wait()
		t.Fatalf("the victim never held both streams and requests waiting for their first byte: %+v (%s)", at, clock)
	}
	victim.kill()
	t.Logf("killed %s with %d streaming and %d waiting for their first byte", victim.name, at.Decoding, at.InFlight-at.Decoding)
	wg.Wait()

	// What went wrong is gathered first: a machine that fell far behind
	// the clock (a stream cut by a deadline it stretched past, a retry
	// that found every engine slow) skips saying so; a quiet one fails.
	var fails []string
	fail := func(format string, args ...any) { fails = append(fails, fmt.Sprintf(format, args...)) }
	var complete, cut, bad int
	for i, res := range results {
		switch {
		case res.err != nil:
			fail("request %d lost: %v (%v)", i, res.err, context.Cause(ctx))
			bad++
		case res.status != http.StatusOK:
			fail("request %d: status %d: %.200s", i, res.status, res.body)
			bad++
		default:
			switch judgeStream(res.body, res.readErr) {
			case sseComplete:
				if res.backend == victim.name {
					// Finished before the crash: possible, and fine.
					t.Logf("request %d completed on the victim before the crash", i)
				}
				complete++
			case sseCut:
				if moves {
					fail("request %d cut, though streams move: ...%q", i, tailOf(res.body, 300))
				}
				if res.backend != victim.name {
					fail("request %d cut, but it streamed from %s, which did not crash", i, res.backend)
				}
				cut++
			default:
				fail("request %d from %s: neither complete nor cleanly cut (read error %v): ...%q", i, res.backend, res.readErr, tailOf(res.body, 300))
				bad++
			}
		}
	}
	retries := counterValue(r.srv.metrics.retries)
	moved := counterValue(r.srv.metrics.mig.moves)
	t.Logf("%d requests: %d complete, %d cut with the error event, %d bad; %v retries, %v streams moved", requests, complete, cut, bad, retries, moved)
	// Short streams may finish between the look at the victim's load and
	// the crash; the long ones cannot.
	if !moves && cut == 0 {
		fail("no stream cut, but %d were streaming from the victim when it crashed", at.Decoding)
	}
	if moves {
		checkMoved(t, fail, ems[1].srv.URL, results, gaps, victim.name, body)
		if moved == 0 {
			fail("no stream moved, but %d were streaming from the victim when it crashed", at.Decoding)
		}
	}
	if retries < 1 {
		fail("no retry, yet the victim had requests waiting for their first byte")
	}
	if len(fails) > 0 {
		clock.SkipIfBehind(t, 2*time.Second, "%d failures, the first: %s", len(fails), fails[0])
		for _, f := range fails {
			t.Error(f)
		}
	}
	if vb.Healthy() {
		t.Error("the crashed engine is still routed to")
	}
	if res := r.get("/readyz"); res.status != http.StatusOK {
		t.Errorf("/readyz = %d after the crash", res.status)
	}
	for i := range 5 {
		res := r.post("/v1/chat/completions", fmt.Sprintf(`{"model":"shared","stream":true,"max_tokens":8,"messages":[{"role":"user","content":"after %d"}]}`, i))
		if res.status != http.StatusOK || judgeStream(string(res.body), res.readErr) != sseComplete || res.header.Get("X-Kvroute-Backend") == victim.name {
			t.Errorf("request after the crash: status %d from %s: %.200s", res.status, res.header.Get("X-Kvroute-Backend"), res.body)
		}
	}
}

// checkMoved compares every stream that started on the crashed engine
// (and so moved, or had finished before the crash) with the same request
// sent to a live engine directly, uninterrupted: the same text, token for
// token. It logs the longest wait the moved streams' clients saw between
// two reads (the move's added latency, at most).
func checkMoved(t *testing.T, fail func(string, ...any), engine string, results []streamResult, gaps []time.Duration, victim string, body func(int) string) {
	var waits []time.Duration
	for i, res := range results {
		if res.backend != victim || judgeStream(res.body, res.readErr) != sseComplete {
			continue
		}
		resp, err := http.Post(engine+"/v1/chat/completions", "application/json", strings.NewReader(body(i)))
		if err != nil {
			t.Fatal(err)
		}
		whole, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if got, want := contentOf(t, res.body), contentOf(t, string(whole)); got != want {
			fail("request %d moved: its text differs from the uninterrupted one's:\n%q\n%q", i, tailOf(got, 200), tailOf(want, 200))
		}
		waits = append(waits, gaps[i])
	}
	slices.Sort(waits)
	if len(waits) > 0 {
		t.Logf("%d streams started on the crashed engine; the longest wait between two reads after the first: median %v, max %v", len(waits), waits[len(waits)/2], waits[len(waits)-1])
	}
}

// contentOf is the text of a chat stream's content deltas.
func contentOf(t *testing.T, stream string) string {
	var sb strings.Builder
	for _, ev := range strings.Split(stream, "\n\n") {
		data, ok := strings.CutPrefix(ev, "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var c openai.Response
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			t.Fatalf("event %q: %v", ev, err)
		}
		for _, ch := range c.Choices {
			if ch.Delta != nil {
				sb.WriteString(ch.Delta.Content)
			}
		}
	}
	return sb.String()
}

// tailOf returns the last n bytes of s.
func tailOf(s string, n int) string { return s[max(0, len(s)-n):] }

// hangAfterHeaders answers completions with 200 headers and then nothing
// until the request is cancelled, as an engine stuck after accepting a
// stream (vLLM sends a stream's headers before its prefill).
func hangAfterHeaders(cancelled chan struct{}) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
			return
		case "/v1/models":
			_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"shared","object":"model"}]}`)
			return
		case "/v1/chat/completions", "/v1/completions":
		default:
			// An engine-metric scrape that hung here would count as a
			// cancelled completion.
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		signal(cancelled)
	}
}

// TestFaultEngineHangs puts a backend that accepts requests and never
// answers next to two good ones: in one case it sends no headers, in the
// other 200 headers and then nothing. upstream.response_header_timeout
// bounds both waits; each request that met the hung backend is retried
// elsewhere and completes, the hung upstream request is cancelled, and
// after health.eject_after timeouts the breaker keeps the backend out.
func TestFaultEngineHangs(t *testing.T) {
	const timeout = 300 * time.Millisecond
	for _, afterHeaders := range []bool{false, true} {
		name := "no headers"
		if afterHeaders {
			name = "headers then nothing"
		}
		t.Run(name, func(t *testing.T) {
			cancelled := make(chan struct{}, 100)
			var hung *httptest.Server
			r := newRig(t, "round-robin", 2, func(c *config.Config) {
				c.Upstream.ResponseHeaderTimeout = timeout
				c.Health.Path = "" // see healthyButBroken
				c.Health.Cooldown = time.Minute
				c.Health.MaxCooldown = time.Minute
				if afterHeaders {
					hung = httptest.NewServer(hangAfterHeaders(cancelled))
					t.Cleanup(hung.Close)
					c.Backends = append(c.Backends, config.Backend{URL: hung.URL, Name: "hung", Models: []string{"shared"}})
				}
			})
			if !afterHeaders {
				r.backends[0].setMode(modeHang)
				r.backends[0].cancelled = cancelled
			}
			hb := r.backendByName(map[bool]string{false: r.backends[0].name, true: "hung"}[afterHeaders])
			const requests = 12
			clock := clocktest.Start(t)
			// A request met the hung backend if it was retried: a count,
			// not a time, that a slow machine cannot change.
			var slow int
			for i := range requests {
				stream := i%2 == 0
				retries := counterValue(r.srv.metrics.retries)
				start := time.Now()
				res := r.post("/v1/chat/completions", chat("shared", stream, fmt.Sprintf("hang %d", i)))
				took := time.Since(start)
				from := res.header.Get("X-Kvroute-Backend")
				want := jsonAnswer(from)
				if stream {
					want = strings.Join(streamEvents(from, 4), "")
				}
				if res.status != http.StatusOK || res.readErr != nil || string(res.body) != want {
					t.Errorf("request %d: status %d from %s, read error %v: %.200s", i, res.status, from, res.readErr, res.body)
				}
				if counterValue(r.srv.metrics.retries) > retries {
					slow++
				}
				if !clock.Within(t, took, 3*timeout, fmt.Sprintf("request %d", i)) {
					t.Errorf("request %d took %v with a %v upstream timeout (%s)", i, took, timeout, clock)
				}
			}
			ejectAfter := config.Default().Health.EjectAfter
			if slow > ejectAfter {
				t.Errorf("%d requests waited for the hung backend; the breaker should open after %d", slow, ejectAfter)
			}
			if slow == 0 {
				t.Error("no request met the hung backend: the test proves nothing")
			}
			if hb.Healthy() || r.srv.set.Of(hb).Breaker().State != "open" {
				t.Errorf("hung backend: healthy %v, breaker %v; want ejected", hb.Healthy(), r.srv.set.Of(hb).Breaker().State)
			}
			for i := range slow {
				select {
				case <-cancelled:
				case <-time.After(clock.Scale(time.Second)):
					t.Fatalf("hung upstream request %d of %d was not cancelled within %v of its timeout (%s)", i+1, slow, clock.Scale(time.Second), clock)
				}
			}
			t.Logf("%d requests complete, %d of them retried after a %v timeout", requests, slow, timeout)
		})
	}

	// Without retries the client gets a clean 504 at the timeout.
	t.Run("no retry", func(t *testing.T) {
		r := newRig(t, "round-robin", 1, func(c *config.Config) {
			c.Upstream.ResponseHeaderTimeout = timeout
			c.Retry.Attempts = 0
		})
		r.backends[0].setMode(modeHang)
		clock := clocktest.Start(t)
		start := time.Now()
		res := r.post("/v1/chat/completions", chat("shared", true, "hang"))
		checkErrorShape(t, res, http.StatusGatewayTimeout, "server_error")
		if took := time.Since(start); !clock.Within(t, took, 3*timeout, "a 504 at the timeout") {
			t.Errorf("504 after %v with a %v timeout (%s)", took, timeout, clock)
		}
	})
}

// healthyButBroken: the backends of the hang and garbage tests would pass
// active health checks while their completions fail. A passing check
// counts as a success of the backend and resets its breaker's count of
// consecutive failures, so these tests turn active checks off and judge
// the request path alone: with checks every few milliseconds such a
// backend would never collect health.eject_after failures in a row, and
// with the default 5s interval a check may still fall between two
// failures.

// rawBackend is a TCP server that answers /health and /v1/models
// properly (so that only requests can find it broken) and every other
// request with the bytes answer, then closes the connection.
func rawBackend(t *testing.T, answer string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer conn.Close()
				br := bufio.NewReader(conn)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					switch req.URL.Path {
					case "/health":
						_, _ = io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
						continue
					case "/v1/models":
						b := `{"object":"list","data":[{"id":"shared","object":"model"}]}`
						_, _ = fmt.Fprintf(conn, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(b), b)
						continue
					}
					_, _ = io.WriteString(conn, answer)
					return
				}
			})
		}
	})
	return "http://" + ln.Addr().String()
}

// TestFaultEngineGarbage puts a backend that fails in one way next to two
// good ones and sends requests round robin. Whatever the failure, each
// client gets either the good backend's exact bytes or, when the broken
// backend had already sent bytes, a response that cannot pass for a
// complete one (an SSE stream ends with the router's error event and a
// read error; a JSON body ends in a read error). The broken backend is
// ejected after health.eject_after failures and receives nothing more.
func TestFaultEngineGarbage(t *testing.T) {
	tests := []struct {
		name string
		mode mode   // a fake's failure, or
		raw  string // a raw TCP answer
		// afterFirstByte: the failure comes after the client got bytes,
		// so requests that met it cannot be retried.
		afterFirstByte bool
		stream         bool
		// mayDrop: a JSON body broken before the router sent anything
		// may end in a closed connection with no response at all.
		mayDrop bool
	}{
		{name: "500", mode: mode500},
		{name: "connection closed", mode: modeClose},
		{name: "headers then close", mode: modeHeadersThenClose, stream: true},
		{name: "non-HTTP bytes", raw: "SSH-2.0-OpenSSH_9.6\r\n\x00\xff\xfe garbage\r\n\r\n"},
		{name: "malformed status line", raw: "HTTP/1.1 2OO OK\r\nContent-Length: 2\r\n\r\n{}"},
		{name: "truncated JSON", raw: "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 400\r\n\r\n{\"id\":\"c-x\",\"object\":\"chat.compl", afterFirstByte: true, mayDrop: true},
		{name: "SSE cut inside an event", raw: "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" +
			"2a\r\ndata: {\"id\":\"c-x\",\"choices\":[{\"delta\":{\"c\r\n", afterFirstByte: true, stream: true},
		{name: "SSE cut between events", mode: modeBreak, afterFirstByte: true, stream: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, "round-robin", 3, func(c *config.Config) {
				c.Health.Path = ""          // see healthyButBroken
				c.Migration.MaxAttempts = 0 // what a stream that cannot move gets
				c.Health.Cooldown = time.Minute
				c.Health.MaxCooldown = time.Minute
				if tt.raw != "" {
					c.Backends[0] = config.Backend{URL: rawBackend(t, tt.raw), Name: "raw", Models: []string{"shared"}}
				}
			})
			badName := r.backends[0].name
			if tt.raw != "" {
				badName = "raw"
			} else {
				r.backends[0].setMode(tt.mode)
			}
			bad := r.backendByName(badName)
			const requests = 15
			var cut int
			for i := range requests {
				body := chat("shared", tt.stream, fmt.Sprintf("garbage %d", i))
				var res result
				if tt.mayDrop {
					resp, err := r.client.Post(r.base+"/v1/chat/completions", "application/json", strings.NewReader(body))
					if err != nil {
						cut++ // dropped: the client sees a failure, never a complete answer
						continue
					}
					b, rerr := io.ReadAll(resp.Body)
					resp.Body.Close()
					res = result{status: resp.StatusCode, header: resp.Header, body: b, readErr: rerr}
				} else {
					res = r.post("/v1/chat/completions", body)
				}
				from := res.header.Get("X-Kvroute-Backend")
				switch {
				case from == badName && tt.afterFirstByte && res.status == http.StatusOK:
					// Cut after its first byte: detectable by the client,
					// a stream by its error event and a JSON body by its
					// truncation.
					if !tt.stream && res.readErr == nil {
						t.Errorf("request %d: a response the backend broke reads to a clean end: %q", i, res.body)
					}
					if tt.stream && judgeStream(string(res.body), res.readErr) != sseCut {
						t.Errorf("request %d: a broken stream does not end with the error event: %q", i, res.body)
					}
					if !tt.stream && strings.Contains(string(res.body), `"error"`) {
						t.Errorf("request %d: an error event appended to a JSON body: %q", i, res.body)
					}
					cut++
				case res.status == http.StatusOK:
					want := jsonAnswer(from)
					if tt.stream {
						want = strings.Join(streamEvents(from, 4), "")
					}
					if from == badName || res.readErr != nil || string(res.body) != want {
						t.Errorf("request %d from %s: read error %v, body %q", i, from, res.readErr, res.body)
					}
				default:
					t.Errorf("request %d: status %d from %s: %.200s", i, res.status, from, res.body)
				}
			}
			ejectAfter := config.Default().Health.EjectAfter
			if cut > ejectAfter {
				t.Errorf("%d responses cut by the broken backend; its breaker should open after %d", cut, ejectAfter)
			}
			if tt.afterFirstByte && cut == 0 {
				t.Error("no request met the broken backend: the test proves nothing")
			}
			if bad.Healthy() || r.srv.set.Of(bad).Breaker().State != "open" {
				t.Errorf("broken backend: healthy %v, breaker %v; want ejected", bad.Healthy(), r.srv.set.Of(bad).Breaker().State)
			}
			t.Logf("%d requests, %d cut after their first byte, %v retries", requests, cut, counterValue(r.srv.metrics.retries))
		})
	}
}

// TestFaultClientsLeaveMidStream lets 40 clients of emulated engines
// leave once their streams have started: within a second the engines run
// none of their requests any more (the router cancelled every upstream
// request) and the router's accounting is back to zero.
func TestFaultClientsLeaveMidStream(t *testing.T) {
	const clients = 40
	r, ems := newEmuRig(t, 2, 1, nil)
	clock := clocktest.Start(t)
	var wg sync.WaitGroup
	started := make(chan struct{}, clients)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := range clients {
		wg.Go(func() {
			body := fmt.Sprintf(`{"model":"shared","stream":true,"max_tokens":5000,"ignore_eos":true,"messages":[{"role":"user","content":%q}]}`,
				words(fmt.Sprintf("leave-%d", i), 400))
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.base+"/v1/chat/completions", strings.NewReader(body))
			resp, err := r.client.Do(req)
			if err != nil {
				t.Errorf("client %d: %v", i, err)
				started <- struct{}{}
				return
			}
			defer resp.Body.Close()
			buf := make([]byte, 1)
			_, _ = resp.Body.Read(buf) // the stream has started
			started <- struct{}{}
			_, _ = io.Copy(io.Discard, resp.Body)
		})
	}
	for range clients {
		select {
		case <-started:
		case <-time.After(clock.Scale(8 * time.Second)):
			t.Fatalf("streams never started (%s)", clock)
		}
	}
	running := func() int {
		n := 0
		for _, e := range ems {
			st := e.em.Stats()
			n += st.Running + st.Waiting
		}
		return n
	}
	if n := running(); n == 0 {
		t.Fatal("the engines run nothing before the clients leave: the test proves nothing")
	}
	// A second, stretched with the machine's load: the streams run for
	// 5,000 tokens, far longer, if the router does not cancel them.
	left := time.Now()
	cancel()
	if !clock.Until(time.Second, func() bool { return running() == 0 }) {
		t.Fatalf("engines still run %d requests %v after their clients left (%s)", running(), time.Since(left), clock)
	}
	t.Logf("%d clients left; the engines were idle %v later", clients, time.Since(left))
	wg.Wait()
}

// TestHungEngineProbedByCompletion: an engine that keeps its connections
// and sends nothing still answers /health (as a stuck vLLM engine's server
// does). Its breaker, opened by those timeouts, is probed by a one-token
// completion, not by /health nor by clients' requests: while the engine
// hangs the probes time out and the breaker stays open, and no client
// request is sent there; once it answers, a probe closes the breaker.
// Before, the first passing /health closed it, and every request sent to
// the stuck engine afterwards waited out its timeout.
func TestHungEngineProbedByCompletion(t *testing.T) {
	r := newRig(t, "round-robin", 2, func(c *config.Config) {
		c.Upstream.ResponseHeaderTimeout = 200 * time.Millisecond
		c.Health.Timeout = 200 * time.Millisecond
		c.Health.Cooldown = 100 * time.Millisecond
		c.Health.MaxCooldown = 100 * time.Millisecond
	})
	hung := r.backends[0]
	hung.setMode(modeHang)
	hb := r.backendByName(hung.name)
	breaker := func() string { return r.srv.set.Of(hb).Breaker().State }
	// Until the breaker opens: each request that meets the hung engine
	// times out there and is answered by the other.
	for i := 0; breaker() == "closed"; i++ {
		if i == 20 {
			t.Fatalf("the hung engine's breaker is still closed after %d requests", i)
		}
		if res := r.post("/v1/chat/completions", chat("shared", false, fmt.Sprintf("hung %d", i))); res.status != http.StatusOK {
			t.Fatalf("request %d: status %d: %s", i, res.status, res.body)
		}
	}
	// Past its cool-down, two probes meet the hung engine and time out;
	// its /health answers all along.
	pings := hung.pings.Load()
	waitFor(t, "two probes of the hung engine", func() bool { return hung.pings.Load() >= pings+2 })
	if st := breaker(); st == "closed" {
		t.Fatal("the breaker that the hung engine's timeouts opened closed while it still hangs")
	}
	// Clients' requests do not wait on it meanwhile.
	hits := hung.hits.Load() - hung.pings.Load()
	for i := range 6 {
		if res := r.post("/v1/chat/completions", chat("shared", true, fmt.Sprintf("meanwhile %d", i))); res.status != http.StatusOK || res.header.Get("X-Kvroute-Backend") == hung.name {
			t.Fatalf("request %d while the engine hangs: status %d from %s", i, res.status, res.header.Get("X-Kvroute-Backend"))
		}
	}
	if n := hung.hits.Load() - hung.pings.Load(); n != hits {
		t.Errorf("%d clients' requests reached the hung engine after its breaker opened", n-hits)
	}
	// The engine recovers: a probe closes the breaker, no client needed.
	hung.setMode(modeOK)
	waitFor(t, "a probe to close the breaker", func() bool { return breaker() == "closed" })
	if !hb.Healthy() {
		t.Error("breaker closed, backend not healthy")
	}
}

// TestHungEngineWaitingResent: a request waiting for its first byte on an
// engine that keeps its connections and sends nothing is sent to another
// the moment the engine's breaker opens on timeouts (other requests' first
// tokens that never came), not left to its own timeout: here a
// non-streamed request, whose headers the engine never sends, under a
// 10-minute upstream.response_header_timeout. Before, it waited until its
// client gave up.
func TestHungEngineWaitingResent(t *testing.T) {
	r := newRig(t, "round-robin", 2, func(c *config.Config) {
		c.Upstream.ResponseHeaderTimeout = 10 * time.Minute
		c.Upstream.FirstTokenTimeout = 200 * time.Millisecond
		c.Health.Cooldown = time.Minute
		c.Health.MaxCooldown = time.Minute
	})
	hung := r.backends[0]
	hung.setMode(modeHang)
	hb := r.backendByName(hung.name)
	// A request that waits on the hung engine: sent until one is there.
	var waiting chan result
	for i := 0; waiting == nil; i++ {
		if i == 10 {
			t.Fatal("no request reached the hung engine")
		}
		hits := hung.hits.Load()
		done := make(chan result, 1)
		go func() { done <- r.post("/v1/chat/completions", chat("shared", false, fmt.Sprintf("waiting %d", i))) }()
		// Either it is answered by the other engine, or it reaches the
		// hung one and stays.
		for answered := false; !answered && waiting == nil; {
			select {
			case res := <-done:
				if res.status != http.StatusOK {
					t.Fatalf("request %d: status %d: %s", i, res.status, res.body)
				}
				answered = true
			case <-time.After(2 * time.Millisecond):
				if hung.hits.Load() != hits {
					waiting = done
				}
			}
		}
	}
	// Streamed requests meet the hung engine, get no first token and
	// open its breaker.
	for i := 0; r.srv.set.Of(hb).Breaker().State == "closed"; i++ {
		if i == 20 {
			t.Fatalf("the hung engine's breaker is still closed after %d requests", i)
		}
		if res := r.post("/v1/chat/completions", chat("shared", true, fmt.Sprintf("stream %d", i))); res.status != http.StatusOK {
			t.Fatalf("streamed request %d: status %d: %s", i, res.status, res.body)
		}
	}
	res := <-waiting
	if res.status != http.StatusOK || res.readErr != nil || res.header.Get("X-Kvroute-Backend") == hung.name {
		t.Fatalf("the request waiting on the hung engine: status %d from %s, read error %v: %.200s", res.status, res.header.Get("X-Kvroute-Backend"), res.readErr, res.body)
	}
}
