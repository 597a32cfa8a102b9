package proxy

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/config"
)

// TestLateBinding runs late binding over loopback HTTP with one backend
// that answers when the test lets it. A long prompt puts the backend at the
// bound of queued prefill (1,000 tokens); a second long prompt, then a
// short one (2k tokens), then one
// whose client goes away are held in the router. The client that left is
// released at once (its place freed, 499 in the log); when the first
// request's answer frees the backend, the short prompt is bound first
// (deadline order), then the long one, and both are served.
func TestLateBinding(t *testing.T) {
	hb := newHeldBackend(t)
	r := newRig(t, "kvroute", 0, func(c *config.Config) {
		c.Backends = []config.Backend{{URL: hb.srv.URL, Name: "held", Models: []string{"m"}}}
		c.Admission.LateBinding = true
		c.Admission.MaxPendingPrefillTokensPerBackend = 1000
		c.Admission.MaxWait = 10 * time.Second
	})
	if r.srv.adm == nil {
		t.Fatal("admission.late_binding did not turn the admission queue on")
	}
	long := strings.Repeat("a long document ", 2500) // about 10k tokens
	send := func(body string) <-chan result {
		ch := make(chan result, 1)
		go func() { ch <- r.post("/v1/chat/completions", body) }()
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

	first := send(chat("m", false, "first", long))
	if got := hb.next(t); got != "first" {
		t.Fatalf("backend got %q first", got)
	}
	long2 := send(chat("m", false, "long2", long))
	waitQueued(1)
	// Short, but over the bound too, so that it holds the backend alone.
	short := send(chat("m", false, "short", strings.Repeat("a short note ", 650)))
	waitQueued(2)

	// A held client that goes away releases its place at once.
	ctx, cancel := context.WithCancel(t.Context())
	gone := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.base+"/v1/chat/completions", strings.NewReader(chat("m", false, "gone")))
		req.Header.Set("Content-Type", "application/json")
		resp, err := r.client.Do(req)
		if err == nil {
			resp.Body.Close()
			err = errors.New("answered: " + resp.Status)
		}
		gone <- err
	}()
	waitQueued(3)
	cancel()
	if err := <-gone; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled client: %v", err)
	}
	waitQueued(2)

	// The first answer frees the backend: the short prompt binds before
	// the long one that arrived earlier, then the long one.
	hb.proceed <- struct{}{}
	if got := hb.next(t); got != "short" {
		t.Errorf("bound first %q, want short", got)
	}
	waitQueued(1)
	hb.proceed <- struct{}{}
	if got := hb.next(t); got != "long2" {
		t.Errorf("bound second %q, want long2", got)
	}
	hb.proceed <- struct{}{}
	for name, ch := range map[string]<-chan result{"first": first, "long2": long2, "short": short} {
		if res := <-ch; res.status != http.StatusOK {
			t.Errorf("%s: status %d: %s", name, res.status, res.body)
		}
	}
	waitQueued(0)
	m := string(r.get("/metrics").body)
	for _, want := range []string{"kvroute_queue_admitted_total 2", "kvroute_queue_length 0", `kvroute_queue_wait_seconds_count{outcome="cancelled"} 1`} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}
