package proxy

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/openai"
)

// heldBackend answers each chat completion only when the test lets it: it
// reports the arrival of each one (by its first message) on arrived, then
// waits for a value on proceed. Health checks pass and any other path
// (engine-metric scrapes, model probes) is a 404, so that only completions
// count as arrivals and take a proceed; a handler never blocks past its
// request's end.
type heldBackend struct {
	srv     *httptest.Server
	arrived chan string
	proceed chan struct{}
}

func newHeldBackend(t *testing.T) *heldBackend {
	t.Helper()
	h := &heldBackend{arrived: make(chan string, 16), proceed: make(chan struct{}, 16)}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Engine-metric scrapes and model probes are not held: only
		// completions count as arrivals.
		if !completionOnly(w, r) {
			return
		}
		var body struct {
			Messages []struct{ Content string } `json:"messages"`
		}
		b, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(b, &body)
		name := ""
		if len(body.Messages) > 0 {
			name = body.Messages[0].Content
		}
		select {
		case h.arrived <- name:
		case <-r.Context().Done():
			return
		}
		select {
		case <-h.proceed:
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, jsonAnswer("held"))
	}))
	t.Cleanup(h.srv.Close)
	return h
}

// next returns the name of the next request to reach the backend.
func (h *heldBackend) next(t *testing.T) string {
	t.Helper()
	select {
	case n := <-h.arrived:
		return n
	case <-time.After(5 * time.Second):
		t.Fatal("no request reached the backend")
		return ""
	}
}

// TestAdmissionQueue saturates a one-slot backend: later requests wait in
// the router, the higher priority goes first, a full queue answers 429
// with Retry-After in the OpenAI shape, and a bad priority is a 400.
func TestAdmissionQueue(t *testing.T) {
	hb := newHeldBackend(t)
	r := newRig(t, "kvroute", 0, func(c *config.Config) {
		c.Backends = []config.Backend{{URL: hb.srv.URL, Name: "held", Models: []string{"m"}}}
		c.Admission.MaxInFlightPerBackend = 1
		c.Admission.MaxQueue = 2
		c.Admission.MaxWait = 5 * time.Second
		c.Admission.TrustedPriorityCIDRs = []string{"127.0.0.1"} // the test client is the trusted front
	})
	send := func(name string, prio int) <-chan result {
		ch := make(chan result, 1)
		go func() {
			ch <- r.post("/v1/chat/completions", chat("m", false, name), "X-Kvroute-Priority", strconv.Itoa(prio))
		}()
		return ch
	}
	waitQueued := func(n int) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for r.srv.adm.Len() != n {
			if time.Now().After(deadline) {
				t.Fatalf("queue length %d, want %d", r.srv.adm.Len(), n)
			}
			time.Sleep(time.Millisecond)
		}
	}

	first := send("first", 0)
	if got := hb.next(t); got != "first" {
		t.Fatalf("backend got %q first", got)
	}
	low := send("low", 0)
	waitQueued(1)
	high := send("high", 7)
	waitQueued(2)

	full := r.post("/v1/chat/completions", chat("m", false, "overflow"), "X-Kvroute-Priority", "3")
	checkErrorShape(t, full, http.StatusTooManyRequests, openai.TypeRateLimit)
	if ra, err := strconv.Atoi(full.header.Get("Retry-After")); err != nil || ra < 1 {
		t.Errorf("Retry-After %q, want a positive number of seconds", full.header.Get("Retry-After"))
	}

	bad := r.post("/v1/chat/completions", chat("m", false, "bad"), "X-Kvroute-Priority", "urgent")
	checkErrorShape(t, bad, http.StatusBadRequest, openai.TypeInvalidRequest)

	// Let the requests through one at a time: the backend sees the higher
	// priority before the earlier, lower one.
	hb.proceed <- struct{}{}
	if got := hb.next(t); got != "high" {
		t.Errorf("second request at the backend %q, want high", got)
	}
	hb.proceed <- struct{}{}
	if got := hb.next(t); got != "low" {
		t.Errorf("third request at the backend %q, want low", got)
	}
	hb.proceed <- struct{}{}
	for name, ch := range map[string]<-chan result{"first": first, "high": high, "low": low} {
		if res := <-ch; res.status != http.StatusOK {
			t.Errorf("%s: status %d: %s", name, res.status, res.body)
		}
	}
	waitQueued(0)
}

// TestPriorityFromTrustedSourcesOnly: a request's priority comes from a
// trusted front's X-Kvroute-Priority header or from its API key, never
// from a client's own header. With a one-slot backend busy, "low" queues
// first and "high" second; the backend then sees "high" first only when
// its priority came from a trusted source.
func TestPriorityFromTrustedSourcesOnly(t *testing.T) {
	const key = "key-of-the-interactive-tier"
	keyed := func(c *config.Config) { c.Admission.KeyPriorities = []config.KeyPriority{{Key: key, Priority: 7}} }
	tests := []struct {
		name string
		mod  func(*config.Config)
		hdr  []string // the headers of "high"
		want string   // the second request at the backend
	}{
		{"a client's own header is ignored", nil, []string{"X-Kvroute-Priority", "1000000"}, "low"},
		{"a malformed header from a client is ignored", nil, []string{"X-Kvroute-Priority", "urgent"}, "low"},
		{"the header of a trusted front", func(c *config.Config) { c.Admission.TrustedPriorityCIDRs = []string{"127.0.0.0/8"} },
			[]string{"X-Kvroute-Priority", "7"}, "high"},
		{"a peer outside the trusted networks", func(c *config.Config) { c.Admission.TrustedPriorityCIDRs = []string{"10.0.0.0/8", "::1"} },
			[]string{"X-Kvroute-Priority", "7"}, "low"},
		{"the priority of an API key", keyed, []string{"Authorization", "Bearer " + key}, "high"},
		{"a client header with a keyed config", keyed, []string{"X-Kvroute-Priority", "7"}, "low"},
		{"another key", keyed, []string{"Authorization", "Bearer not-" + key}, "low"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hb := newHeldBackend(t)
			r := newRig(t, "kvroute", 0, func(c *config.Config) {
				c.Backends = []config.Backend{{URL: hb.srv.URL, Name: "held", Models: []string{"m"}}}
				c.Admission.MaxInFlightPerBackend = 1
				c.Admission.MaxWait = 5 * time.Second
				if tt.mod != nil {
					tt.mod(c)
				}
			})
			send := func(name string, hdr ...string) <-chan result {
				ch := make(chan result, 1)
				go func() { ch <- r.post("/v1/chat/completions", chat("m", false, name), hdr...) }()
				return ch
			}
			waitQueued := func(n int) {
				t.Helper()
				for deadline := time.Now().Add(5 * time.Second); r.srv.adm.Len() != n; time.Sleep(time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatalf("queue length %d, want %d", r.srv.adm.Len(), n)
					}
				}
			}
			results := []<-chan result{send("first")}
			if got := hb.next(t); got != "first" {
				t.Fatalf("backend got %q first", got)
			}
			results = append(results, send("low"))
			waitQueued(1)
			results = append(results, send("high", tt.hdr...))
			waitQueued(2)
			hb.proceed <- struct{}{}
			if got := hb.next(t); got != tt.want {
				t.Errorf("second request at the backend %q, want %q", got, tt.want)
			}
			hb.proceed <- struct{}{}
			hb.next(t)
			hb.proceed <- struct{}{}
			for _, ch := range results {
				if res := <-ch; res.status != http.StatusOK {
					t.Errorf("status %d: %s", res.status, res.body)
				}
			}
		})
	}
}

// TestAdmissionTimeout: a request that waits max_wait gets 429.
func TestAdmissionTimeout(t *testing.T) {
	hb := newHeldBackend(t)
	r := newRig(t, "kvroute", 0, func(c *config.Config) {
		c.Backends = []config.Backend{{URL: hb.srv.URL, Name: "held", Models: []string{"m"}}}
		c.Admission.MaxInFlightPerBackend = 1
		c.Admission.MaxWait = 100 * time.Millisecond
	})
	first := make(chan result, 1)
	go func() { first <- r.post("/v1/chat/completions", chat("m", false, "first")) }()
	hb.next(t)
	start := time.Now()
	res := r.post("/v1/chat/completions", chat("m", false, "late"))
	checkErrorShape(t, res, http.StatusTooManyRequests, openai.TypeRateLimit)
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Errorf("429 after %v, before max_wait", d)
	}
	if res.header.Get("Retry-After") == "" {
		t.Error("no Retry-After")
	}
	hb.proceed <- struct{}{}
	if res := <-first; res.status != http.StatusOK {
		t.Errorf("first: %d", res.status)
	}
}
