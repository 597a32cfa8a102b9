package proxy

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/admin"
	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/discovery"
	"github.com/kvroute/kvroute/internal/members"
	"github.com/kvroute/kvroute/internal/request"
)

// TestOutcomeStatusLabels: every outcome of a request is counted once in
// kvroute_requests_total, under the status the client got (499 when it
// left first) and the backend that answered ("none" when the router did),
// and the admin decision log says the same status.
func TestOutcomeStatusLabels(t *testing.T) {
	tests := []struct {
		name    string
		mode    mode
		mod     func(*config.Config)
		body    string
		cancel  time.Duration // the client gives up after this; 0: never
		status  int           // what the client gets (0: nothing)
		backend string        // the label: "b0" or "none"
		model   string        // the model label: "shared" unless set
	}{
		{name: "ok", mode: modeOK, status: 200, backend: "b0"},
		{name: "stream ok", mode: modeOK, body: chat("shared", true, "s"), status: 200, backend: "b0"},
		{name: "5xx passed through", mode: mode500, status: 500, backend: "b0"},
		{name: "connection closed", mode: modeClose, status: 502, backend: "b0"},
		{name: "header timeout", mode: modeHang, status: 504, backend: "b0",
			mod: func(c *config.Config) { c.Upstream.ResponseHeaderTimeout = 100 * time.Millisecond }},
		{name: "client gone before the first byte", mode: modeHang, cancel: 100 * time.Millisecond, status: 0, backend: "b0"},
		{name: "bad JSON", mode: modeOK, body: `{"model":`, status: 400, backend: "none", model: "-"},
		// A name the fleet does not serve is not a label of its own.
		{name: "unknown model", mode: modeOK, body: chat("nope", false, "x"), status: 404, backend: "none", model: "other"},
		{name: "over context", mode: modeOK, body: chat("shared", false, words("long", 4097*request.MaxBytesPerToken)), status: 400, backend: "none"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, "round-robin", 1, func(c *config.Config) {
				c.Retry.Attempts = 0
				c.Admin.Token = "outcome-token-0123456789"
				if tt.mod != nil {
					tt.mod(c)
				}
			})
			r.backends[0].setMode(tt.mode)
			body := tt.body
			if body == "" {
				body = chat("shared", false, "hello")
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tt.cancel > 0 {
				time.AfterFunc(tt.cancel, cancel)
			}
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.base+"/v1/chat/completions", strings.NewReader(body))
			got := 0
			if resp, err := r.client.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				got = resp.StatusCode
			}
			if got != tt.status {
				t.Fatalf("client got status %d, want %d", got, tt.status)
			}
			want := tt.status
			if want == 0 {
				want = statusClientGone
			}
			label := strconv.Itoa(want)
			deadline := time.Now().Add(3 * time.Second)
			for counterValue(r.srv.metrics.requests) < 1 && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			if n := counterValue(r.srv.metrics.requests); n != 1 {
				t.Errorf("requests_total sums to %v, want 1", n)
			}
			model := tt.model
			switch model {
			case "":
				model = "shared"
			case "-":
				model = "" // no model read
			}
			if v := counterValue(r.srv.metrics.requests.WithLabelValues(tt.backend, "round-robin", model, label)); v != 1 {
				t.Errorf("requests_total{backend=%q,model=%q,status=%q} = %v, want 1", tt.backend, model, label, v)
			}
			if tt.backend == "none" && want == 400 && tt.body == `{"model":` {
				return // not parsed: no decision to log
			}
			last := r.srv.decisions.Last(1)
			if len(last) != 1 || last[0].Status != want {
				t.Errorf("decision log %+v, want status %d", last, want)
			}
		})
	}
}

// TestContextTableWithDNSFirst: each backend's context length comes from
// its own entry, whatever the order of the entries. A DNS pool listed
// before a static backend with max_model_len 50 used to shift the table
// (the pool's members join later, so fleet IDs and config indexes
// differ), and a prompt too long for the static backend was forwarded.
func TestContextTableWithDNSFirst(t *testing.T) {
	pool := newFake(t, "p0")
	old := members.Resolver
	members.Resolver = discovery.Funcs{SRV: func(_ context.Context, _, _, name string) (string, []*net.SRV, error) {
		u, _ := url.Parse(pool.srv.URL)
		p, _ := strconv.Atoi(u.Port())
		return name, []*net.SRV{{Target: "127.0.0.1.", Port: uint16(p)}}, nil
	}}
	t.Cleanup(func() { members.Resolver = old })
	for _, dnsFirst := range []bool{true, false} {
		t.Run("dns first "+strconv.FormatBool(dnsFirst), func(t *testing.T) {
			r := newRig(t, "round-robin", 1, func(c *config.Config) {
				c.Backends[0].MaxModelLen = 50
				dns := config.Backend{SRV: "_http._tcp.pool.test", Models: []string{"other"}}
				if dnsFirst {
					c.Backends = append([]config.Backend{dns}, c.Backends...)
				} else {
					c.Backends = append(c.Backends, dns)
				}
			})
			res := r.post("/v1/chat/completions", chat("shared", false, words("ctx", 300*request.MaxBytesPerToken)))
			if res.status != http.StatusBadRequest || !strings.Contains(string(res.body), "context_length_exceeded") {
				t.Errorf("a 300-token prompt for a 50-token backend: status %d %s, want 400 context_length_exceeded", res.status, res.body)
			}
			if res := r.post("/v1/chat/completions", chat("shared", false, "short")); res.status != 200 {
				t.Errorf("a short prompt: status %d", res.status)
			}
		})
	}
}

// TestSessionHeaderBeatsBodyField: the session header, when sent, is the
// session key even when session.body_field names a field the body has.
func TestSessionHeaderBeatsBodyField(t *testing.T) {
	r := newRig(t, "round-robin", 2, func(c *config.Config) {
		c.Session.BodyField = "user"
		c.Admin.Token = "session-token-0123456789"
	})
	body := `{"model":"shared","user":"from-body","messages":[{"role":"user","content":"hi"}]}`
	if res := r.post("/v1/chat/completions", body, "X-Session-ID", "from-header"); res.status != 200 {
		t.Fatalf("status %d", res.status)
	}
	if res := r.post("/v1/chat/completions", body); res.status != 200 {
		t.Fatalf("status %d", res.status)
	}
	last := r.srv.decisions.Last(2)
	if len(last) != 2 {
		t.Fatalf("%d decisions", len(last))
	}
	// The log keeps the first characters of a key.
	h, b := admin.Truncate("from-header"), admin.Truncate("from-body")
	got := []string{last[0].Session, last[1].Session}
	if !(got[0] == h && got[1] == b) && !(got[1] == h && got[0] == b) {
		t.Errorf("session keys %q, want the header's for the first request and the body's for the second", got)
	}
}
