package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/admin"
	"github.com/kvroute/kvroute/internal/config"
)

// adminCall sends an admin request with the given bearer token ("" for
// none) and returns the status and body.
func (r *rig) adminCall(method, path, token string) (int, []byte) {
	r.t.Helper()
	return r.callAt(r.base, method, path, token)
}

// callAt is adminCall at base, the URL of one of the router's listeners.
func (r *rig) callAt(base, method, path, token string) (int, []byte) {
	r.t.Helper()
	req, err := http.NewRequest(method, base+path, nil)
	if err != nil {
		r.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		r.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func TestAdminOffWithoutToken(t *testing.T) {
	t.Setenv(config.AdminTokenEnv, "")
	r := newRig(t, "kvroute", 1, nil)
	for _, tok := range []string{"", "guess"} {
		status, body := r.adminCall(http.MethodGet, "/admin/backends", tok)
		checkErrorShape(t, result{status: status, body: body}, 404, "not_found_error")
	}
	// The 404 says how to turn the API on, on the page too.
	for _, p := range []string{"/admin/fleet", "/admin/backends", "/admin/"} {
		status, body := r.adminCall(http.MethodGet, p, "")
		if status != http.StatusNotFound || !strings.Contains(string(body), config.AdminTokenEnv) || !strings.Contains(string(body), "admin_api_off") {
			t.Errorf("GET %s without a token: %d %s, want 404 saying how to turn the admin API on", p, status, body)
		}
	}
}

func TestAdminAPI(t *testing.T) {
	const token = "admin-token-for-tests"
	t.Setenv(config.AdminTokenEnv, "")
	r := newRig(t, "kvroute", 3, func(c *config.Config) { c.Admin.Token = token; c.Admin.Decisions = 8 })

	status, body := r.adminCall(http.MethodGet, "/admin/backends", "wrong-token")
	checkErrorShape(t, result{status: status, body: body}, 401, "authentication_error")

	const secret = "the prompt text must never show"
	for i := range 10 {
		res := r.post("/v1/chat/completions", chat("shared", i%2 == 0, secret+words(fmt.Sprint(i), 300)),
			"X-Session-ID", fmt.Sprintf("client-identifier-%d", i), "Authorization", "Bearer sk-client-key")
		if res.status != 200 {
			t.Fatalf("status %d: %s", res.status, res.body)
		}
	}
	if res := r.post("/v1/chat/completions", chat("no-such-model", false, "x")); res.status != 404 {
		t.Fatalf("unknown model: status %d", res.status)
	}

	backends := func() map[string]admin.Backend {
		t.Helper()
		status, body := r.adminCall(http.MethodGet, "/admin/backends", token)
		if status != 200 {
			t.Fatalf("GET /admin/backends: %d %s", status, body)
		}
		var got struct{ Backends []admin.Backend }
		if err := json.Unmarshal(body, &got); err != nil {
			t.Fatalf("decode %s: %v", body, err)
		}
		m := map[string]admin.Backend{}
		for _, b := range got.Backends {
			m[b.Name] = b
		}
		return m
	}
	bs := backends()
	if len(bs) != 3 {
		t.Fatalf("listed %d backends, want 3", len(bs))
	}
	blocks := 0
	for name, b := range bs {
		if !b.Healthy || b.Draining || b.Breaker.State != "closed" || b.URL == "" || b.PrefillRate <= 0 {
			t.Errorf("%s: %+v", name, b)
		}
		if b.Load.InFlight != 0 {
			t.Errorf("%s: %d in flight after every request ended", name, b.Load.InFlight)
		}
		blocks += b.PrefixBlocks
	}
	if blocks == 0 {
		t.Error("no backend holds any prefix block after 10 requests")
	}

	status, body = r.adminCall(http.MethodGet, "/admin/decisions", token)
	if status != 200 {
		t.Fatalf("GET /admin/decisions: %d %s", status, body)
	}
	for _, leak := range []string{secret, "sk-client-key", "client-identifier-"} {
		if strings.Contains(string(body), leak) {
			t.Errorf("decisions show %q", leak)
		}
	}
	var dec struct{ Decisions []admin.Decision }
	if err := json.Unmarshal(body, &dec); err != nil {
		t.Fatal(err)
	}
	if len(dec.Decisions) != 8 {
		t.Fatalf("%d decisions kept, want the configured 8", len(dec.Decisions))
	}
	if d := dec.Decisions[0]; d.Status != 404 || d.Backend != "" || d.Reason != "model_not_found" || d.Model != "no-such-model" || d.TTFTMillis != 0 {
		t.Errorf("newest decision %+v, want the unroutable request", d)
	}
	for _, d := range dec.Decisions[1:] {
		if d.Status != 200 || bs[d.Backend].Name == "" || !strings.HasPrefix(d.Reason, "policy=kvroute") || d.Session != "client-i…" || d.Time.IsZero() ||
			d.PromptTokens <= 0 || d.TTFTMillis <= 0 {
			t.Errorf("decision %+v", d)
		}
	}

	// Drain b0: no new request goes there; undrain: it is back.
	if status, body := r.adminCall(http.MethodPost, "/admin/backends/b0/drain", token); status != 200 {
		t.Fatalf("drain: %d %s", status, body)
	}
	if !backends()["b0"].Draining {
		t.Fatal("b0 not shown draining")
	}
	for i := range 12 {
		res := r.post("/v1/chat/completions", chat("shared", false, words(fmt.Sprint("drained", i), 200)))
		if got := res.header.Get("X-Kvroute-Backend"); res.status != 200 || got == "b0" {
			t.Fatalf("request %d while b0 drains: status %d from %s", i, res.status, got)
		}
	}
	if status, _ := r.adminCall(http.MethodPost, "/admin/backends/nope/drain", token); status != 404 {
		t.Errorf("drain of an unknown backend: %d, want 404", status)
	}
	if status, body := r.adminCall(http.MethodPost, "/admin/backends/b0/undrain", token); status != 200 {
		t.Fatalf("undrain: %d %s", status, body)
	}
	seen := false
	for i := range 30 {
		// Distinct prompts with no cache anywhere: kvroute spreads them.
		if r.post("/v1/chat/completions", chat("shared", false, words(fmt.Sprint("undrained", i), 200))).header.Get("X-Kvroute-Backend") == "b0" {
			seen = true
			break
		}
	}
	if !seen {
		t.Error("b0 got no request after undrain")
	}
}
