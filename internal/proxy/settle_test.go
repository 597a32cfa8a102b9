package proxy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/clocktest"
	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/tokenize"
)

// newHandlerRig starts a router over one backend per handler (named b0,
// b1...), serving the model "shared", with no active checks (the breaker
// is fed by requests alone) and no retries unless mod says otherwise.
func newHandlerRig(t *testing.T, pol string, mod func(*config.Config), handlers ...http.HandlerFunc) *rig {
	t.Helper()
	var urls []string
	for _, h := range handlers {
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		urls = append(urls, srv.URL)
	}
	return newRig(t, pol, 0, func(c *config.Config) {
		for i, u := range urls {
			c.Backends = append(c.Backends, config.Backend{URL: u, Name: fmt.Sprintf("b%d", i), Models: []string{"shared"}})
		}
		c.Health.Path = ""
		c.Engines.Enabled = false
		c.Retry.Attempts = 0
		if mod != nil {
			mod(c)
		}
	})
}

// breakerOf is the breaker of the backend named name.
func (r *rig) breakerOf(name string) (state string, fails int) {
	st := r.srv.set.Of(r.backendByName(name)).Breaker()
	return st.State, st.Fails
}

// TestSettle5xxBrokenCountsOnce: a 5xx passed through whose body the
// backend then breaks is one failed request, one failure of its backend
// (it used to count twice: once when the 5xx came, once when its body
// broke, ejecting a backend at half its threshold).
func TestSettle5xxBrokenCountsOnce(t *testing.T) {
	r := newHandlerRig(t, "round-robin", func(c *config.Config) { c.Health.EjectAfter = 2 },
		func(w http.ResponseWriter, req *http.Request) {
			if !completionOnly(w, req) {
				return
			}
			w.Header().Set("Content-Length", "100")
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = io.WriteString(w, `{"error":`)
			if f, ok := w.(http.Flusher); ok {
				f.Flush()
			}
			panic(http.ErrAbortHandler) // the body breaks 91 bytes short
		})
	// The client gets the 500's headers or, as here where they were not
	// flushed yet, a closed connection.
	if resp, err := r.client.Post(r.base+"/v1/chat/completions", "application/json", strings.NewReader(chat("shared", false, "x"))); err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusInternalServerError {
			t.Fatalf("status %d, want the backend's 500", resp.StatusCode)
		}
	}
	if state, fails := r.breakerOf("b0"); state != "closed" || fails != 1 {
		t.Errorf("breaker %s with %d failures after one failed request, want closed with 1", state, fails)
	}
}

// TestSettle4xxSaysNothing: a 4xx is the backend's answer to the client's
// mistake: it neither counts as a failure nor resets the consecutive
// failures a 5xx counted (it used to count as a success, so that a
// backend failing every other request on a client error was never
// ejected).
func TestSettle4xxSaysNothing(t *testing.T) {
	var n atomic.Int64
	r := newHandlerRig(t, "round-robin", func(c *config.Config) { c.Health.EjectAfter = 3 },
		func(w http.ResponseWriter, req *http.Request) {
			if !completionOnly(w, req) {
				return
			}
			status := http.StatusInternalServerError
			if n.Add(1)%2 == 0 {
				status = http.StatusBadRequest
			}
			http.Error(w, `{"error":{"message":"no"}}`, status)
		})
	for i, want := range []int{500, 400, 500} {
		if res := r.post("/v1/chat/completions", chat("shared", false, "x")); res.status != want {
			t.Fatalf("request %d: status %d, want %d", i, res.status, want)
		}
		if i == 1 {
			if state, fails := r.breakerOf("b0"); state != "closed" || fails != 1 {
				t.Errorf("after a 500 and a 400: breaker %s with %d failures, want closed with 1", state, fails)
			}
		}
	}
	if state, fails := r.breakerOf("b0"); fails != 2 {
		t.Errorf("after 500, 400, 500: breaker %s with %d failures, want 2", state, fails)
	}
}

// TestSettleEmpty2xx: a 2xx with an empty body is a complete answer, handed
// on as it is, and a success of its backend, not a failure before the
// first byte.
func TestSettleEmpty2xx(t *testing.T) {
	var fail atomic.Bool
	fail.Store(true)
	r := newHandlerRig(t, "round-robin", func(c *config.Config) { c.Health.EjectAfter = 3 },
		func(w http.ResponseWriter, req *http.Request) {
			if !completionOnly(w, req) {
				return
			}
			if fail.Swap(false) {
				w.WriteHeader(http.StatusBadGateway)
				return
			}
			w.Header().Set("Content-Length", "0")
			w.WriteHeader(http.StatusOK)
		})
	r.post("/v1/chat/completions", chat("shared", false, "x")) // one failure
	res := r.post("/v1/chat/completions", chat("shared", false, "x"))
	if res.status != http.StatusOK || len(res.body) != 0 {
		t.Fatalf("status %d with %d bytes, want 200 with the backend's empty body", res.status, len(res.body))
	}
	if state, fails := r.breakerOf("b0"); state != "closed" || fails != 0 {
		t.Errorf("breaker %s with %d failures after an empty 200, want closed with 0 (a success)", state, fails)
	}
}

// TestPassthroughBreaker: a passed-through request feeds its backend's
// breaker as a completion does: its 5xx count, and the breaker ejects the
// backend (passthrough used to give the breaker no failure at all).
func TestPassthroughBreaker(t *testing.T) {
	var hits atomic.Int64
	r := newHandlerRig(t, "round-robin", func(c *config.Config) {
		c.Health.EjectAfter = 2
		c.Health.Cooldown, c.Health.MaxCooldown = time.Hour, time.Hour
	},
		func(w http.ResponseWriter, req *http.Request) {
			if req.URL.Path != "/v1/embeddings" {
				http.NotFound(w, req)
				return
			}
			hits.Add(1)
			http.Error(w, `{"error":{"message":"down"}}`, http.StatusServiceUnavailable)
		})
	body := `{"model":"shared","input":"x"}`
	for range 2 {
		if res := r.post("/v1/embeddings", body); res.status != http.StatusServiceUnavailable {
			t.Fatalf("status %d, want the backend's 503", res.status)
		}
	}
	if state, _ := r.breakerOf("b0"); state != "open" {
		t.Fatalf("breaker %s after two failed passthrough requests, want open", state)
	}
	if res := r.post("/v1/embeddings", body); res.status != http.StatusServiceUnavailable || hits.Load() != 2 {
		t.Errorf("with the breaker open: status %d, backend hit %d times, want the router's 503 and 2 hits", res.status, hits.Load())
	}
}

// TestHalfOpenProbesOut: a request routed to a half-open backend whose
// probes are out goes to another backend, and its first assignment is
// released (the rig checks the load is back to zero); a passed-through
// request too (passthrough used to skip the breaker's Allow).
func TestHalfOpenProbesOut(t *testing.T) {
	var failing atomic.Bool
	failing.Store(true)
	h := func(w http.ResponseWriter, req *http.Request) {
		if failing.Load() {
			http.Error(w, "down", http.StatusInternalServerError)
			return
		}
		if req.URL.Path == "/v1/embeddings" {
			_, _ = io.WriteString(w, `{"object":"list","data":[]}`)
			return
		}
		_, _ = io.WriteString(w, jsonAnswer("x"))
	}
	ok := func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path == "/v1/embeddings" {
			_, _ = io.WriteString(w, `{"object":"list","data":[]}`)
			return
		}
		_, _ = io.WriteString(w, jsonAnswer("ok"))
	}
	// The probe window is one cool-down: long enough for the requests
	// below to run inside it.
	const cooldown = 2 * time.Second
	r := newHandlerRig(t, "round-robin", func(c *config.Config) {
		c.Health.EjectAfter = 1
		c.Health.Cooldown = cooldown
		c.Health.MaxCooldown = cooldown
		c.Health.HalfOpenProbes = 1
	}, h, ok)
	m := r.srv.set.Of(r.backendByName("b0"))
	for m.Breaker().State != "open" {
		r.post("/v1/chat/completions", chat("shared", false, "x"))
	}
	failing.Store(false)
	m2 := clocktest.Start(t)
	if !m2.Until(2*cooldown, func() bool { return m.Breaker().State == "half-open" }) {
		t.Fatalf("breaker %s, never half-open", m.Breaker().State)
	}
	if !r.srv.set.Allow(m) {
		t.Fatal("a half-open backend refused its first probe")
	}
	allowed := time.Now()
	// Round robin sends one of every two requests to b0 first: each must
	// go to b1 instead.
	for i, path := range []string{"/v1/chat/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/embeddings"} {
		body := chat("shared", false, "x")
		if strings.HasSuffix(path, "embeddings") {
			body = `{"model":"shared","input":"x"}`
		}
		res := r.post(path, body)
		if got := res.header.Get(headerBackend); res.status != http.StatusOK || got != "b1" {
			if took := time.Since(allowed); took >= cooldown {
				t.Skipf("the probe window (%v) turned before request %d was answered (%v; %s): b0 could take a probe again", cooldown, i, took, m2)
			}
			t.Errorf("request %d to %s: status %d from %q, want 200 from b1 (b0's probe is out)", i, path, res.status, got)
		}
	}
}

// TestTTFTStreamsOnly: kvroute_ttft_seconds observes streams only: a JSON
// answer's first byte comes with its last, and its whole duration is
// kvroute_e2e_seconds' (it used to be observed as a TTFT too).
func TestTTFTStreamsOnly(t *testing.T) {
	r := newRig(t, "round-robin", 1, nil)
	ttft := func() int {
		res := r.get("/metrics")
		sc := bufio.NewScanner(strings.NewReader(string(res.body)))
		for sc.Scan() {
			if line := sc.Text(); strings.HasPrefix(line, `kvroute_ttft_seconds_count{backend="b0",model="shared"}`) {
				var n int
				_, _ = fmt.Sscanf(line[strings.LastIndexByte(line, ' ')+1:], "%d", &n)
				return n
			}
		}
		return 0
	}
	if res := r.post("/v1/chat/completions", chat("shared", false, "x")); res.status != 200 {
		t.Fatalf("status %d", res.status)
	}
	if n := ttft(); n != 0 {
		t.Errorf("a JSON answer observed %d TTFTs, want none", n)
	}
	if res := r.post("/v1/chat/completions", chat("shared", true, "x")); res.status != 200 {
		t.Fatalf("status %d", res.status)
	}
	if n := ttft(); n != 1 {
		t.Errorf("a stream observed %d TTFTs, want 1", n)
	}
}

// TestTokenizeHoldsNoGrant: a request's /tokenize call is made before it
// is admitted, never while it holds an admission grant (with the grant in
// transit the queue admits nobody). Two one-slot backends are busy and
// two requests wait in the queue; both slots free at once: with a slow
// tokenizer, the second still reaches a backend right after the first,
// not one tokenize later.
func TestTokenizeHoldsNoGrant(t *testing.T) {
	const delay = 300 * time.Millisecond
	tok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		var tr tokenize.Request
		var msgs []struct{ Content string }
		if json.NewDecoder(req.Body).Decode(&tr) != nil || json.Unmarshal(tr.Messages, &msgs) != nil || len(msgs) == 0 {
			http.Error(w, "bad", http.StatusBadRequest)
			return
		}
		select {
		case <-time.After(delay):
		case <-req.Context().Done():
			return
		}
		toks := ids(msgs[len(msgs)-1].Content)
		b, _ := json.Marshal(map[string]any{"count": len(toks), "max_model_len": 8192, "tokens": toks})
		_, _ = w.Write(b)
	}))
	t.Cleanup(tok.Close)
	type arrival struct {
		name string
		at   time.Time
	}
	arrived := make(chan arrival, 8)
	proceed := make(chan struct{}, 8)
	held := func(w http.ResponseWriter, req *http.Request) {
		if !completionOnly(w, req) {
			return
		}
		var body struct{ Messages []struct{ Content string } }
		_ = json.NewDecoder(req.Body).Decode(&body)
		name, _, _ := strings.Cut(body.Messages[0].Content, " ")
		arrived <- arrival{name, time.Now()}
		select {
		case <-proceed:
		case <-req.Context().Done():
			return
		}
		_, _ = io.WriteString(w, jsonAnswer("held"))
	}
	r := newHandlerRig(t, "kvroute", func(c *config.Config) {
		for i := range c.Backends {
			c.Backends[i].KVEvents = fmt.Sprintf("tcp://127.0.0.1:%d", 1+i) // no stream is followed
		}
		c.KVEvents.Tokenizer = tok.URL
		c.KVEvents.TokenizeTimeout = 10 * delay
		c.KVEvents.TokenizeCache = 0
		c.Admission.MaxInFlightPerBackend = 1
		c.Admission.MaxQueue = 4
		c.Admission.MaxWait = time.Minute
	}, held, held)
	send := func(name string) <-chan result {
		ch := make(chan result, 1)
		go func() { ch <- r.post("/v1/chat/completions", chat("shared", false, name+" "+words(name, 64*8))) }()
		return ch
	}
	next := func() arrival {
		t.Helper()
		select {
		case a := <-arrived:
			return a
		case <-time.After(time.Minute):
			t.Fatal("no request reached a backend")
			return arrival{}
		}
	}
	var results []<-chan result
	results = append(results, send("one"), send("two"))
	next()
	next()
	meter := clocktest.Start(t)
	results = append(results, send("three"), send("four"))
	if !meter.Until(time.Minute, func() bool { return r.srv.adm.Len() == 2 }) {
		t.Fatalf("queue length %d, want 2", r.srv.adm.Len())
	}
	proceed <- struct{}{}
	proceed <- struct{}{}
	first, second := next(), next()
	gap := second.at.Sub(first.at)
	proceed <- struct{}{}
	proceed <- struct{}{}
	for _, ch := range results {
		if res := <-ch; res.status != http.StatusOK {
			t.Errorf("status %d: %s", res.status, res.body)
		}
	}
	if !meter.Within(t, gap, delay/2, "the second queued request's arrival after the first") {
		t.Errorf("%s reached a backend %v after %s: a tokenize (%v) held the admission grant", second.name, gap, first.name, delay)
	}
}
