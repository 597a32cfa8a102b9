package proxy

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/config"
)

// TestAdminListen: with admin.listen the admin API (and a copy of
// /metrics) is served on its own listener and not on the client one.
func TestAdminListen(t *testing.T) {
	const token = "admin-listen-token-0123"
	t.Setenv(config.AdminTokenEnv, "")
	r := newRig(t, "round-robin", 1, func(c *config.Config) {
		c.Admin.Token = token
		c.Admin.Listen = "127.0.0.1:0"
	})
	adminBase := "http://" + r.srv.AdminAddr()
	if adminBase == "http://" {
		t.Fatal("no admin listener")
	}
	if status, body := r.adminCall(http.MethodGet, "/admin/backends", token); status != http.StatusNotFound {
		t.Errorf("client listener /admin/backends: %d %s, want 404", status, body)
	}
	if status, body := r.callAt(adminBase, http.MethodGet, "/admin/backends", token); status != http.StatusOK {
		t.Errorf("admin listener /admin/backends: %d %s, want 200", status, body)
	}
	if status, _ := r.callAt(adminBase, http.MethodGet, "/metrics", ""); status != http.StatusOK {
		t.Errorf("admin listener /metrics: %d, want 200", status)
	}
	if status, _ := r.callAt(adminBase, http.MethodPost, "/v1/chat/completions", ""); status != http.StatusNotFound {
		t.Errorf("admin listener /v1/chat/completions: %d, want 404", status)
	}
}

// limitedRig is a router with one API key, an admin token and
// limits.auth_failures_per_minute at perMinute.
func limitedRig(t *testing.T, key, token string, perMinute int) *rig {
	t.Setenv("KVROUTE_TEST_API_KEYS", key)
	t.Setenv(config.AdminTokenEnv, "")
	return newRig(t, "round-robin", 1, func(c *config.Config) {
		c.Auth.APIKeysEnv = "KVROUTE_TEST_API_KEYS"
		c.Admin.Token = token
		c.Limits.AuthFailuresPerMinute = perMinute
	})
}

// TestAuthFailuresLimited: a client address that fails the API key or
// admin token check limits.auth_failures_per_minute times gets 429 with
// Retry-After for every further attempt, a right key included, while the
// others go on; the failures of both checks share one bucket.
func TestAuthFailuresLimited(t *testing.T) {
	const key, token, perMinute = "the-right-api-key", "the-right-admin-token", 3
	r := limitedRig(t, key, token, perMinute)
	completion := func(k string) result {
		return r.post("/v1/chat/completions", chat("shared", false, "hi"), "Authorization", "Bearer "+k)
	}
	if res := completion(key); res.status != http.StatusOK {
		t.Fatalf("right key: %d %s", res.status, res.body)
	}
	for i := range perMinute - 1 {
		if res := completion("guess-" + strconv.Itoa(i)); res.status != http.StatusUnauthorized {
			t.Errorf("wrong key %d: %d, want 401", i, res.status)
		}
	}
	if status, _ := r.adminCall(http.MethodGet, "/admin/backends", "wrong-admin-token"); status != http.StatusUnauthorized {
		t.Errorf("wrong admin token: %d, want 401", status)
	}
	for _, try := range []struct {
		name string
		do   func() result
	}{
		{"wrong key", func() result { return completion("guess-again") }},
		{"right key", func() result { return completion(key) }},
		{"right admin token", func() result {
			req, _ := http.NewRequest(http.MethodGet, r.base+"/admin/backends", nil)
			req.Header.Set("Authorization", "Bearer "+token)
			resp, err := r.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			return result{status: resp.StatusCode, header: resp.Header, body: body}
		}},
	} {
		res := try.do()
		if res.status != http.StatusTooManyRequests {
			t.Errorf("%s after %d failures: %d %s, want 429", try.name, perMinute, res.status, res.body)
			continue
		}
		if ra, err := strconv.Atoi(res.header.Get("Retry-After")); err != nil || ra < 1 {
			t.Errorf("%s: Retry-After %q", try.name, res.header.Get("Retry-After"))
		}
	}
	// Probes need no key and are not limited.
	if res := r.get("/healthz"); res.status != http.StatusOK {
		t.Errorf("/healthz from a blocked address: %d", res.status)
	}
}

// TestAdminHeaderLimited: the probe guessed the admin token through
// X-Kvroute-Admin-Token on client requests, 60 guesses and 60 answers.
// A wrong token in the header is a failed check of the same bucket as
// the admin API's: after limits.auth_failures_per_minute of them the
// address gets 429, the right token included.
func TestAdminHeaderLimited(t *testing.T) {
	const key, token, perMinute = "the-right-api-key", "the-right-admin-token", 3
	r := limitedRig(t, key, token, perMinute)
	guess := func(tok string) result {
		return r.post("/v1/chat/completions", chat("shared", false, "hi"), "Authorization", "Bearer "+key, headerAdminToken, tok)
	}
	if res := guess(token); res.status != http.StatusOK || res.header.Get(headerBackend) == "" {
		t.Fatalf("right admin token: %d, %s %q", res.status, headerBackend, res.header.Get(headerBackend))
	}
	for i := range perMinute {
		res := guess("guess-" + strconv.Itoa(i))
		if res.status != http.StatusOK || res.header.Get(headerBackend) != "" {
			t.Errorf("wrong guess %d: %d, %s %q; want 200 without the decision headers", i, res.status, headerBackend, res.header.Get(headerBackend))
		}
	}
	for _, tok := range []string{"guess-again", token} {
		res := guess(tok)
		if res.status != http.StatusTooManyRequests {
			t.Errorf("admin token %q after %d wrong guesses: %d, want 429", tok, perMinute, res.status)
			continue
		}
		if ra, err := strconv.Atoi(res.header.Get("Retry-After")); err != nil || ra < 1 {
			t.Errorf("Retry-After %q", res.header.Get("Retry-After"))
		}
	}
	if status, _ := r.adminCall(http.MethodGet, "/admin/backends", token); status != http.StatusTooManyRequests {
		t.Errorf("the admin API after the header's failures: %d, want 429 (one bucket)", status)
	}
}

// TestReloadCredentials: a reload reads the API keys file and the admin
// token file again; the old key and token stop working, the new ones
// work, without a restart.
func TestReloadCredentials(t *testing.T) {
	dir := t.TempDir()
	keys, tokenFile := filepath.Join(dir, "keys"), filepath.Join(dir, "token")
	write := func(p, s string) {
		if err := os.WriteFile(p, []byte(s+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(keys, "old-api-key")
	write(tokenFile, "old-admin-token-0123")
	t.Setenv(config.AdminTokenEnv, "")
	r := newRig(t, "round-robin", 1, func(c *config.Config) {
		c.Auth.APIKeysFile = keys
		c.Admin.TokenFile = tokenFile
		c.Limits.AuthFailuresPerMinute = 0
	})
	completion := func(k string) int {
		return r.post("/v1/chat/completions", chat("shared", false, "hi"), "Authorization", "Bearer "+k).status
	}
	adminStatus := func(tok string) int {
		status, _ := r.adminCall(http.MethodGet, "/admin/backends", tok)
		return status
	}
	if completion("old-api-key") != 200 || adminStatus("old-admin-token-0123") != 200 {
		t.Fatal("the startup key or token does not work")
	}
	write(keys, "new-api-key")
	write(tokenFile, "new-admin-token-0123")
	next := *r.srv.cfg
	if err := r.srv.Reload(&next); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name      string
		got, want int
	}{
		{"old key", completion("old-api-key"), 401},
		{"new key", completion("new-api-key"), 200},
		{"old admin token", adminStatus("old-admin-token-0123"), 401},
		{"new admin token", adminStatus("new-admin-token-0123"), 200},
	} {
		if c.got != c.want {
			t.Errorf("%s after the reload: %d, want %d", c.name, c.got, c.want)
		}
	}
	// A reload whose credentials do not load changes nothing.
	write(tokenFile, "short")
	if err := r.srv.Reload(&next); err == nil {
		t.Error("a reload with a 5-character admin token succeeded")
	}
	if completion("new-api-key") != 200 || adminStatus("new-admin-token-0123") != 200 {
		t.Error("a failed reload changed the credentials")
	}
}

// TestAuthFailuresBucket: the bucket refills at its rate, an IPv6 client's
// whole /64 shares one bucket, and other clients keep theirs.
func TestAuthFailuresBucket(t *testing.T) {
	now := time.Unix(1000, 0)
	f := newAuthFailures(2)
	f.now = func() time.Time { return now }
	req := func(remote string) *http.Request { return &http.Request{RemoteAddr: remote} }
	steps := []struct {
		remote  string
		fail    bool          // fail once after the check
		advance time.Duration // before the check
		blocked bool
	}{
		{remote: "192.0.2.1:1000", fail: true},
		{remote: "192.0.2.1:1001", fail: true},
		{remote: "192.0.2.1:1002", blocked: true},
		{remote: "192.0.2.2:1000"},                                        // another client
		{remote: "192.0.2.1:1003", advance: 30 * time.Second, fail: true}, // one token back after 30s at 2/min
		{remote: "192.0.2.1:1004", blocked: true},
		{remote: "[2001:db8::1]:1", fail: true},
		{remote: "[2001:db8::2]:1", fail: true}, // the same /64
		{remote: "[2001:db8::3]:1", blocked: true},
		{remote: "[2001:db8:0:1::1]:1"}, // the next /64
	}
	for i, s := range steps {
		now = now.Add(s.advance)
		e := f.blocked(req(s.remote))
		if (e != nil) != s.blocked {
			t.Errorf("step %d (%s): blocked %v, want %v", i, s.remote, e != nil, s.blocked)
		}
		if e != nil && (e.Status != http.StatusTooManyRequests || e.RetryAfter < 1) {
			t.Errorf("step %d: %+v, want 429 with Retry-After", i, e)
		}
		if s.fail {
			f.failed(req(s.remote))
		}
	}
	if newAuthFailures(0) != nil || newAuthFailures(0).blocked(req("192.0.2.1:1")) != nil {
		t.Error("a limit of 0 must be off")
	}
}

// TestMetricsNeedKeyWhenNotExempt: leaving /metrics out of auth.exempt
// (the documented way to require the API key for it on the client
// listener) makes it 401 without the key and 200 with it, and its backend
// labels are the configured names, not addresses.
func TestMetricsNeedKeyWhenNotExempt(t *testing.T) {
	t.Setenv("KVROUTE_TEST_API_KEYS", "metrics-key")
	r := newRig(t, "round-robin", 1, func(c *config.Config) {
		c.Auth.APIKeysEnv = "KVROUTE_TEST_API_KEYS"
		c.Auth.Exempt = []string{"/healthz", "/readyz"}
	})
	if res := r.get("/metrics"); res.status != http.StatusUnauthorized {
		t.Errorf("/metrics without a key: %d, want 401", res.status)
	}
	req, _ := http.NewRequest(http.MethodGet, r.base+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer metrics-key")
	resp, err := r.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `backend="b0"`) || strings.Contains(string(body), "127.0.0.1") {
		t.Errorf("/metrics with the key: %d; want 200 with backend=\"b0\" labels and no address", resp.StatusCode)
	}
}
