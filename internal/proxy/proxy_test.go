package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvroute/kvroute/internal/config"
)

// rig is a router on loopback in front of fake backends.
type rig struct {
	t        *testing.T
	srv      *router
	base     string
	backends []*fake
	client   *http.Client
}

// newRig starts n fakes named b0..b{n-1} and a router over them with the
// named policy; mod may adjust the config. At the end of the test it
// checks that the router's load accounting returned to zero.
func newRig(t *testing.T, pol string, n int, mod func(*config.Config)) *rig {
	t.Helper()
	return newRigLog(t, pol, n, mod, nil)
}

// newRigLog is newRig with the router logging to logger.
func newRigLog(t *testing.T, pol string, n int, mod func(*config.Config), logger *slog.Logger) *rig {
	t.Helper()
	r := &rig{t: t, client: &http.Client{Timeout: 10 * time.Second}}
	cfg := config.Default()
	cfg.Listen = "127.0.0.1:0"
	cfg.Policy = pol
	cfg.Health.Interval = 20 * time.Millisecond
	cfg.Health.Timeout = time.Second
	cfg.Log.Level = "debug"
	for i := range n {
		f := newFake(t, fmt.Sprintf("b%d", i))
		r.backends = append(r.backends, f)
		cfg.Backends = append(cfg.Backends, config.Backend{URL: f.srv.URL, Name: f.name})
	}
	if mod != nil {
		mod(cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("config: %v", err)
	}
	srv, err := newRouter(cfg, logger)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := srv.Start(); err != nil {
		t.Fatalf("Start: %v", err)
	}
	r.srv, r.base = srv, "http://"+srv.Addr()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	t.Cleanup(r.checkZero) // runs before the shutdown above
	return r
}

// checkZero fails the test unless every backend's accounting is back to
// zero (it may take a moment after the client read its last byte).
func (r *rig) checkZero() {
	r.t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for {
		var bad []string
		for _, b := range r.srv.Fleet().Snapshot().All {
			l := b.Load()
			if l.InFlight != 0 || l.PendingPrefill != 0 || l.Decoding != 0 || l.DecodeBudget != 0 || l.DecodeTokens != 0 {
				bad = append(bad, fmt.Sprintf("%s: %+v", b.Name, l))
			}
		}
		if len(bad) == 0 {
			return
		}
		if time.Now().After(deadline) {
			r.t.Errorf("load accounting not back to zero: %v", bad)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// result is one request's answer through the router.
type result struct {
	status  int
	header  http.Header
	body    []byte
	readErr error
}

// post sends body to path with extra headers and reads the whole answer;
// a request that gets no answer fails the test and returns status 0.
func (r *rig) post(path, body string, hdr ...string) result {
	r.t.Helper()
	req, err := http.NewRequest(http.MethodPost, r.base+path, strings.NewReader(body))
	if err != nil {
		r.t.Error(err)
		return result{readErr: err}
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := r.client.Do(req)
	if err != nil {
		// Errorf, not Fatalf: post runs on clients' goroutines too, where
		// Fatalf would end the goroutine before its result is sent and
		// leave the test waiting for it.
		r.t.Errorf("POST %s: %v", path, err)
		return result{readErr: err}
	}
	defer resp.Body.Close()
	b, rerr := io.ReadAll(resp.Body)
	return result{status: resp.StatusCode, header: resp.Header, body: b, readErr: rerr}
}

func (r *rig) get(path string) result {
	r.t.Helper()
	resp, err := r.client.Get(r.base + path)
	if err != nil {
		r.t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, rerr := io.ReadAll(resp.Body)
	return result{status: resp.StatusCode, header: resp.Header, body: b, readErr: rerr}
}

// chat renders a chat request body.
func chat(model string, stream bool, msgs ...string) string {
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	var ms []msg
	for i, m := range msgs {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		ms = append(ms, msg{role, m})
	}
	b, _ := json.Marshal(map[string]any{"model": model, "messages": ms, "stream": stream, "max_tokens": 16})
	return string(b)
}

// words returns n characters of text that no other seed produces.
func words(seed string, n int) string {
	var sb strings.Builder
	for i := 0; sb.Len() < n; i++ {
		fmt.Fprintf(&sb, "%s-%d lorem ipsum dolor sit amet. ", seed, i)
	}
	return sb.String()[:n]
}

// waitReady waits until /readyz answers want.
func (r *rig) waitReady(want int) {
	r.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for r.get("/readyz").status != want {
		if time.Now().After(deadline) {
			r.t.Fatalf("/readyz never answered %d", want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestSessionStickiness(t *testing.T) {
	tests := []struct {
		policy  string
		viaBody bool
	}{
		{"kvroute", false}, {"session-hash", false}, {"kvroute", true},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s/body=%v", tt.policy, tt.viaBody), func(t *testing.T) {
			r := newRig(t, tt.policy, 3, func(c *config.Config) { c.Session.BodyField = "user" })
			const sessions, turns = 6, 4
			for s := range sessions {
				key := fmt.Sprintf("conv-%d", s)
				first := ""
				for turn := range turns {
					// Turns share no text, so only the session key can keep
					// them together.
					body := chat("shared", false, words(fmt.Sprintf("%s-turn%d", key, turn), 300))
					var res result
					if tt.viaBody {
						body = strings.Replace(body, `{`, `{"user":"`+key+`",`, 1)
						res = r.post("/v1/chat/completions", body)
					} else {
						res = r.post("/v1/chat/completions", body, "X-Session-ID", key)
					}
					if res.status != 200 {
						t.Fatalf("status %d: %s", res.status, res.body)
					}
					got := res.header.Get("X-Kvroute-Backend")
					if string(res.body) != jsonAnswer(got) {
						t.Fatalf("header says %s but body is %s", got, res.body)
					}
					if first == "" {
						first = got
					} else if got != first {
						t.Errorf("%s turn %d went to %s, earlier turns to %s", key, turn, got, first)
					}
				}
			}
		})
	}
}

func TestPrefixRouting(t *testing.T) {
	for _, pol := range []string{"prefix", "kvroute"} {
		t.Run(pol, func(t *testing.T) {
			r := newRig(t, pol, 3, nil)
			for d := range 3 {
				// A long shared document (4k tokens), then short questions.
				doc := words(fmt.Sprintf("doc%d", d), 16000)
				home := ""
				for q := range 5 {
					res := r.post("/v1/chat/completions", chat("shared", true, doc+" Question "+words(fmt.Sprintf("q%d-%d", d, q), 40)))
					if res.status != 200 {
						t.Fatalf("status %d: %s", res.status, res.body)
					}
					got := res.header.Get("X-Kvroute-Backend")
					if q == 0 {
						home = got
						continue
					}
					if got != home {
						t.Errorf("doc %d question %d went to %s, the document is on %s (reason %q)", d, q, got, home, res.header.Get("X-Kvroute-Reason"))
					}
					if reason := res.header.Get("X-Kvroute-Reason"); reason == "" {
						t.Error("no X-Kvroute-Reason")
					}
				}
			}
			if hit := counterValue(r.srv.metrics.prefixHit); hit < 3*4*3900 {
				t.Errorf("kvroute_prefix_hit_tokens_total = %v, want at least %d", hit, 3*4*3900)
			}
		})
	}
}

func TestLoadSpreading(t *testing.T) {
	for _, pol := range []string{"kvroute", "least-request", "prefix"} {
		t.Run(pol, func(t *testing.T) {
			const n, requests, workers = 3, 90, 9
			r := newRig(t, pol, n, nil)
			for _, f := range r.backends {
				f.gap = 5 * time.Millisecond
			}
			var mu sync.Mutex
			count := map[string]int{}
			var wg sync.WaitGroup
			jobs := make(chan int)
			for range workers {
				wg.Go(func() {
					for j := range jobs {
						res := r.post("/v1/chat/completions", chat("shared", true, words(fmt.Sprintf("unrelated-%d", j), 400)))
						if res.status != 200 {
							t.Errorf("status %d", res.status)
						}
						mu.Lock()
						count[res.header.Get("X-Kvroute-Backend")]++
						mu.Unlock()
					}
				})
			}
			for j := range requests {
				jobs <- j
			}
			close(jobs)
			wg.Wait()
			for _, f := range r.backends {
				if c := count[f.name]; c > 2*requests/n {
					t.Errorf("%s got %d of %d requests, more than twice its share: %v", f.name, c, requests, count)
				}
			}
		})
	}
}

func TestSSEByteExact(t *testing.T) {
	r := newRig(t, "kvroute", 2, nil)
	res := r.post("/v1/chat/completions", chat("shared", true, "hello"))
	if res.status != 200 || res.readErr != nil {
		t.Fatalf("status %d, read error %v", res.status, res.readErr)
	}
	name := res.header.Get("X-Kvroute-Backend")
	if want := strings.Join(streamEvents(name, 4), ""); string(res.body) != want {
		t.Errorf("stream differs from the backend's bytes:\n got %q\nwant %q", res.body, want)
	}
	if ct := res.header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("Content-Type = %q", ct)
	}
}

// The first event reaches the client while the backend still holds the
// rest: the router flushes each event instead of buffering.
func TestSSEIncremental(t *testing.T) {
	r := newRig(t, "round-robin", 1, nil)
	f := r.backends[0]
	f.setMode(modeGated)
	req, _ := http.NewRequest(http.MethodPost, r.base+"/v1/chat/completions", strings.NewReader(chat("shared", true, "hi")))
	resp, err := r.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	got := make(chan string, 1)
	go func() {
		var sb strings.Builder
		for !strings.HasSuffix(sb.String(), "\n\n") {
			line, err := br.ReadString('\n')
			sb.WriteString(line)
			if err != nil {
				break
			}
		}
		got <- sb.String()
	}()
	select {
	case ev := <-got:
		if want := streamEvents("b0", 4)[0]; ev != want {
			t.Errorf("first event %q, want %q", ev, want)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("first event did not arrive while the backend held the rest: not flushed")
	}
	close(f.gate)
	rest, err := io.ReadAll(br)
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.Join(streamEvents("b0", 4)[1:], ""); string(rest) != want {
		t.Errorf("rest of stream %q, want %q", rest, want)
	}
}

func TestJSONPassthrough(t *testing.T) {
	r := newRig(t, "kvroute", 2, nil)
	// Odd but valid JSON: spacing and key order must reach the backend as
	// sent.
	body := "{ \"messages\" : [ {\"role\":\"user\",\"content\":\"h\\u00e9llo\"} ],\n \"model\":\"shared\" , \"extra_vendor_field\": {\"a\":[1,2]} }"
	res := r.post("/v1/chat/completions", body,
		"X-Kvroute-Backend", "forged", "X-Kvroute-Anything", "x", "X-Forwarded-For", "203.0.113.7", "Authorization", "Bearer sk-test")
	if res.status != 200 {
		t.Fatalf("status %d: %s", res.status, res.body)
	}
	name := res.header.Get("X-Kvroute-Backend")
	if string(res.body) != jsonAnswer(name) {
		t.Errorf("body %q, want %q", res.body, jsonAnswer(name))
	}
	var f *fake
	for _, b := range r.backends {
		if b.name == name {
			f = b
		}
	}
	if f == nil {
		t.Fatalf("X-Kvroute-Backend %q names no backend", name)
	}
	if got := *f.lastBody.Load(); string(got) != body {
		t.Errorf("backend received %q, want the original %q", got, body)
	}
	h := *f.lastHeader.Load()
	for k := range h {
		if strings.HasPrefix(k, "X-Kvroute-") {
			t.Errorf("client header %s reached the backend", k)
		}
	}
	if got := h.Get("X-Forwarded-For"); got != "203.0.113.7, 127.0.0.1" {
		t.Errorf("X-Forwarded-For = %q, want the client's list with the peer appended", got)
	}
	if got := h.Get("Authorization"); got != "Bearer sk-test" {
		t.Errorf("Authorization = %q, not forwarded", got)
	}
}

func TestRetryBeforeFirstByte(t *testing.T) {
	for _, m := range []mode{modeClose, mode500, modeHeadersThenClose} {
		t.Run(fmt.Sprint(m), func(t *testing.T) {
			r := newRig(t, "round-robin", 2, func(c *config.Config) { c.Health.EjectAfter = 100 })
			bad, good := r.backends[0], r.backends[1]
			bad.setMode(m)
			for i := range 6 {
				res := r.post("/v1/chat/completions", chat("shared", i%2 == 0, "retry me"))
				if res.status != 200 || res.readErr != nil {
					t.Fatalf("request %d: status %d, read error %v: %s", i, res.status, res.readErr, res.body)
				}
				if got := res.header.Get("X-Kvroute-Backend"); got != good.name {
					t.Errorf("request %d answered by %s", i, got)
				}
			}
			retries := counterValue(r.srv.metrics.retries)
			if bad.hits.Load() == 0 || retries != float64(bad.hits.Load()) {
				t.Errorf("bad backend saw %d requests, retries_total = %v; want equal and positive", bad.hits.Load(), retries)
			}
			if good.hits.Load() != 6 {
				t.Errorf("good backend saw %d requests, want 6", good.hits.Load())
			}
			if !strings.Contains(string(r.get("/metrics").body), "kvroute_retries_total "+fmt.Sprint(retries)) {
				t.Error("/metrics does not show kvroute_retries_total")
			}
		})
	}
}

func TestRetryExhausted(t *testing.T) {
	tests := []struct {
		mode       mode
		wantStatus int
		wantType   string
	}{
		// The backends' own 5xx passes through; a connection failure is
		// the router's 502.
		{mode500, 500, "server_error"},
		{modeClose, 502, "server_error"},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.mode), func(t *testing.T) {
			r := newRig(t, "kvroute", 3, func(c *config.Config) { c.Retry.Attempts = 1; c.Health.EjectAfter = 100 })
			for _, f := range r.backends {
				f.setMode(tt.mode)
			}
			res := r.post("/v1/chat/completions", chat("shared", false, "doomed"))
			checkErrorShape(t, res, tt.wantStatus, tt.wantType)
			var hits int64
			for _, f := range r.backends {
				hits += f.hits.Load()
			}
			if hits != 2 {
				t.Errorf("backends saw %d attempts, want 2 (one retry)", hits)
			}
		})
	}
}

func TestNoRetryAfterFirstByte(t *testing.T) {
	r := newRig(t, "round-robin", 2, func(c *config.Config) {
		c.Health.EjectAfter = 100
		c.Migration.MaxAttempts = 0 // moving a stream is not retrying it (migrate_test.go)
	})
	bad, good := r.backends[0], r.backends[1]
	bad.setMode(modeBreak)
	broken := 0
	for range 4 {
		goodBefore := good.hits.Load()
		res := r.post("/v1/chat/completions", chat("shared", true, "break me"))
		if res.header.Get("X-Kvroute-Backend") != bad.name {
			continue
		}
		broken++
		if res.readErr != nil {
			t.Errorf("the broken stream's body did not end cleanly: %v", res.readErr)
		}
		// The backend's first event, then the router's error event
		// (streamerr.go).
		if first := streamEvents(bad.name, 4)[0]; !strings.HasPrefix(string(res.body), first) || judgeStream(string(res.body), res.readErr) != sseCut {
			t.Errorf("client got %q, want the first event %q and the error event", res.body, first)
		}
		if good.hits.Load() != goodBefore {
			t.Error("request retried after its first byte")
		}
	}
	if broken == 0 {
		t.Fatal("no request reached the breaking backend")
	}
	if got := counterValue(r.srv.metrics.retries); got != 0 {
		t.Errorf("retries_total = %v, want 0", got)
	}
}

// TestBrokenAfterDone: a backend that breaks its connection after the
// stream's data: [DONE] has not broken the stream: the client gets it
// whole, with no error event after the end, and the request counts as
// served.
func TestBrokenAfterDone(t *testing.T) {
	r := newRig(t, "round-robin", 1, func(c *config.Config) { c.Health.EjectAfter = 100 })
	r.backends[0].setMode(modeBreakAfterDone)
	res := r.post("/v1/chat/completions", chat("shared", true, "end, then go"))
	if res.readErr != nil {
		t.Errorf("the body did not end cleanly: %v", res.readErr)
	}
	if want := strings.Join(streamEvents(r.backends[0].name, 4), ""); res.status != http.StatusOK || string(res.body) != want {
		t.Errorf("client got %d %q, want the whole stream %q", res.status, res.body, want)
	}
}

// TestSSETail: where a relayed stream stopped, whatever the writes' sizes.
func TestSSETail(t *testing.T) {
	for _, c := range []struct {
		writes         []string
		boundary, done bool
	}{
		{nil, true, false},
		{[]string{"data: {}\n\n"}, true, false},
		{[]string{"data: {}\n"}, false, false},
		{[]string{"data: [DONE]\n\n"}, true, true},
		{[]string{"data:[DONE]\r\n\r\n"}, true, true},
		{[]string{"data: [DO", "NE]\n", "\n"}, true, true},
		{[]string{"d", "a", "t", "a", ":", " ", "[DONE]", "\r", "\r"}, true, true},
		{[]string{"data: [DONE]\n\ndata: {}\n\n"}, true, false},
		{[]string{"data: [DONE]\n"}, false, false},
		{[]string{"data: x[DONE]\n\n"}, true, false},
		{[]string{strings.Repeat("x", 100), "data: [DONE]\n\n"}, true, true},
	} {
		var tail sseTail
		for _, w := range c.writes {
			tail.note([]byte(w))
		}
		if tail.atBoundary() != c.boundary || tail.done() != c.done {
			t.Errorf("%q: boundary %v done %v, want %v %v", c.writes, tail.atBoundary(), tail.done(), c.boundary, c.done)
		}
	}
}

// checkErrorShape checks an OpenAI-shaped error.
func checkErrorShape(t *testing.T, res result, status int, typ string) {
	t.Helper()
	if res.status != status {
		t.Errorf("status %d, want %d: %s", res.status, status, res.body)
	}
	var e struct {
		Error struct {
			Message *string `json:"message"`
			Type    *string `json:"type"`
			Code    any     `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(res.body, &e); err != nil || e.Error.Message == nil || *e.Error.Message == "" || e.Error.Type == nil {
		t.Fatalf("not an OpenAI error: %q (%v)", res.body, err)
	}
	if *e.Error.Type != typ {
		t.Errorf("type %q, want %q", *e.Error.Type, typ)
	}
}

func TestErrorShapes(t *testing.T) {
	r := newRig(t, "kvroute", 2, func(c *config.Config) { c.Limits.MaxBodyBytes = 4096 })
	tests := []struct {
		name   string
		method string
		path   string
		body   string
		status int
		typ    string
		code   string
	}{
		{"malformed JSON", "POST", "/v1/chat/completions", `{"model":"shared","messages":[`, 400, "invalid_request_error", "invalid_json"},
		{"not an object", "POST", "/v1/completions", `[1,2]`, 400, "invalid_request_error", "invalid_json"},
		{"too large", "POST", "/v1/chat/completions", chat("shared", false, words("big", 5000)), 413, "invalid_request_error", "request_too_large"},
		{"unknown model", "POST", "/v1/chat/completions", chat("no-such-model", false, "hi"), 404, "not_found_error", "model_not_found"},
		{"wrong method", "GET", "/v1/chat/completions", "", 405, "invalid_request_error", "method_not_allowed"},
		{"unknown path", "GET", "/nowhere", "", 404, "not_found_error", "not_found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(tt.method, r.base+tt.path, strings.NewReader(tt.body))
			resp, err := r.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			res := result{status: resp.StatusCode, header: resp.Header, body: b}
			checkErrorShape(t, res, tt.status, tt.typ)
			if !strings.Contains(string(b), `"code":"`+tt.code+`"`) {
				t.Errorf("body %s lacks code %q", b, tt.code)
			}
		})
	}
	// A known model (discovered from the backends) is served.
	if res := r.post("/v1/chat/completions", chat("own-b1", false, "hi")); res.status != 200 || res.header.Get("X-Kvroute-Backend") != "b1" {
		t.Errorf("own-b1: status %d from %q", res.status, res.header.Get("X-Kvroute-Backend"))
	}
	// No healthy backend: 503, and /readyz says so.
	for _, f := range r.backends {
		f.health.Store(false)
	}
	r.waitReady(503)
	checkErrorShape(t, r.post("/v1/chat/completions", chat("shared", false, "hi")), 503, "service_unavailable_error")
	checkErrorShape(t, r.get("/v1/models"), 503, "service_unavailable_error")
	if got := counterValue(r.srv.metrics.ejections.WithLabelValues("b0")); got != 1 {
		t.Errorf("ejections{b0} = %v, want 1", got)
	}
	// Recovery through the active check.
	r.backends[1].health.Store(true)
	r.waitReady(200)
	if res := r.post("/v1/chat/completions", chat("shared", false, "hi")); res.status != 200 || res.header.Get("X-Kvroute-Backend") != "b1" {
		t.Errorf("after recovery: status %d from %q", res.status, res.header.Get("X-Kvroute-Backend"))
	}
}

func TestModelsAndProbes(t *testing.T) {
	r := newRig(t, "kvroute", 3, nil)
	if res := r.get("/healthz"); res.status != 200 {
		t.Errorf("/healthz %d", res.status)
	}
	if res := r.get("/health"); res.status != 200 || string(res.body) != "ok\n" {
		t.Errorf("/health (the engines' probe path) %d %q, want as /healthz", res.status, res.body)
	}
	if res := r.get("/readyz"); res.status != 200 {
		t.Errorf("/readyz %d", res.status)
	}
	res := r.get("/v1/models")
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID          string `json:"id"`
			Object      string `json:"object"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	if err := json.Unmarshal(res.body, &list); err != nil || list.Object != "list" {
		t.Fatalf("/v1/models: %v %s", err, res.body)
	}
	var ids []string
	for _, m := range list.Data {
		ids = append(ids, m.ID)
	}
	if got, want := strings.Join(ids, ","), "shared,own-b0,own-b1,own-b2"; got != want {
		t.Errorf("models %s, want %s", got, want)
	}
	if list.Data[0].MaxModelLen != 4096 {
		t.Error("backend's extension fields did not pass through")
	}
	// Other allowed /v1 paths reach a backend untouched.
	ping := `{"model":"shared","input":"ping"}`
	echo := r.post("/v1/embeddings", ping)
	if echo.status != 200 || string(echo.body) != ping || echo.header.Get("X-Fake") == "" {
		t.Errorf("/v1/embeddings: %d %q", echo.status, echo.body)
	}
	m := string(r.get("/metrics").body)
	for _, name := range []string{"kvroute_requests_total", "kvroute_inflight_requests{backend=\"b0\"} 0", "kvroute_pending_prefill_tokens{backend=\"b2\"} 0", "kvroute_backend_healthy"} {
		if !strings.Contains(m, name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
}

func TestClientDisconnect(t *testing.T) {
	tests := []struct {
		name string
		mode mode
		// readFirst waits for the first event before cancelling.
		readFirst bool
	}{
		{"before first byte", modeHang, false},
		{"mid-stream", modeGated, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, "kvroute", 1, nil)
			f := r.backends[0]
			f.setMode(tt.mode)
			ctx, cancel := context.WithCancel(context.Background())
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.base+"/v1/chat/completions", strings.NewReader(chat("shared", true, "long job")))
			done := make(chan struct{})
			go func() {
				defer close(done)
				resp, err := r.client.Do(req)
				if err != nil {
					return
				}
				defer resp.Body.Close()
				_, _ = io.Copy(io.Discard, resp.Body)
			}()
			select {
			case <-f.started:
			case <-time.After(3 * time.Second):
				t.Fatal("request never reached the backend")
			}
			if tt.readFirst {
				// Wait for the router to see the first byte.
				deadline := time.Now().Add(3 * time.Second)
				for r.srv.Fleet().Snapshot().All[0].Load().Decoding == 0 {
					if time.Now().After(deadline) {
						t.Fatal("never decoding")
					}
					time.Sleep(time.Millisecond)
				}
			}
			start := time.Now()
			cancel()
			select {
			case <-f.cancelled:
				t.Logf("upstream cancelled %v after the client left", time.Since(start))
			case <-time.After(time.Second):
				t.Error("upstream request still running a second after the client left")
			}
			<-done
			deadline := time.Now().Add(2 * time.Second)
			for counterValue(r.srv.metrics.requests) == 0 && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
}

// Shutdown lets a running stream finish while refusing new connections,
// and returns only once it has: the stream is held open well past any
// short grace, and Shutdown must not return before it ends.
func TestGracefulShutdown(t *testing.T) {
	r := newRig(t, "kvroute", 1, nil)
	f := r.backends[0]
	f.setMode(modeGated)
	resp, err := r.client.Post(r.base+"/v1/chat/completions", "application/json", strings.NewReader(chat("shared", true, "x")))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	returned := make(chan time.Time, 1)
	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err := r.srv.Shutdown(ctx)
		returned <- time.Now()
		stopped <- err
	}()
	// New connections are refused while the stream runs.
	deadline := time.Now().Add(2 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", r.srv.Addr(), 100*time.Millisecond)
		if err != nil {
			break
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatal("the router still accepts connections while shutting down")
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(400 * time.Millisecond)
	opened := time.Now()
	close(f.gate)
	b, err := io.ReadAll(resp.Body)
	if err != nil || !bytes.HasSuffix(b, []byte("data: [DONE]\n\n")) {
		t.Errorf("stream cut by shutdown: %v %q", err, b)
	}
	if at := <-returned; at.Before(opened) {
		t.Errorf("Shutdown returned %v before the running stream could end", opened.Sub(at))
	}
	if err := <-stopped; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
}

// counterValue sums the counters c collects.
func counterValue(c prometheus.Collector) float64 {
	ch := make(chan prometheus.Metric, 64)
	go func() { c.Collect(ch); close(ch) }()
	total := 0.0
	for m := range ch {
		var pb dto.Metric
		if err := m.Write(&pb); err == nil && pb.Counter != nil {
			total += pb.Counter.GetValue()
		}
	}
	return total
}

// A storm of mixed outcomes (successes, 5xx, dropped connections, streams
// broken mid-way, clients that give up before or after the first byte)
// must leave every backend's accounting at zero; newRig's cleanup checks
// that.
func TestStormCountersReturnToZero(t *testing.T) {
	r := newRig(t, "kvroute", 4, func(c *config.Config) { c.Health.EjectAfter = 1000 })
	modes := []mode{modeOK, mode500, modeClose, modeHeadersThenClose, modeBreak, modeOK}
	for i, f := range r.backends {
		f.setMode(modes[i%len(modes)])
		f.gap = time.Millisecond
	}
	// Count the requests that reach the router: some clients give up
	// before theirs is even sent.
	var arrivals atomic.Int64
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		arrivals.Add(1)
		r.srv.Handler().ServeHTTP(w, req)
	}))
	defer front.Close()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for j := range 25 {
				// Backends change behaviour under the requests' feet.
				r.backends[(w+j)%len(r.backends)].setMode(modes[(w*7+j)%len(modes)])
				ctx, cancel := context.WithCancel(context.Background())
				if j%5 == 4 {
					// A client that gives up early, at a random point.
					time.AfterFunc(time.Duration(j%3)*time.Millisecond, cancel)
				}
				body := chat("shared", j%2 == 0, words(fmt.Sprintf("storm-%d", j%4), 600+j))
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, front.URL+"/v1/chat/completions", strings.NewReader(body))
				req.Header.Set("X-Session-ID", fmt.Sprintf("s%d", w))
				if resp, err := r.client.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				cancel()
			}
		})
	}
	wg.Wait()
	// A client that gave up early may leave its request still on its way
	// into the front server: Close waits for every handler to return, so
	// that arrivals is final before it is read.
	front.Close()
	// Every request is counted once, whatever its fate (the count lands
	// when the proxy is done with the body, just after the client).
	want := float64(arrivals.Load())
	deadline := time.Now().Add(3 * time.Second)
	for counterValue(r.srv.metrics.requests) < want && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := counterValue(r.srv.metrics.requests); n != want || want < 160 {
		t.Errorf("requests_total = %v, want %v (the requests that reached the router, at least 160)", n, want)
	}
}
