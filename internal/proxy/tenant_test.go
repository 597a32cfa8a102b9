package proxy

import (
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/config"
)

// completion is a completions body for prompt under cacheSalt ("": none).
func completion(prompt, cacheSalt string) string {
	b := map[string]any{"model": "shared", "prompt": prompt, "max_tokens": 1}
	if cacheSalt != "" {
		b["cache_salt"] = cacheSalt
	}
	out, _ := json.Marshal(b)
	return string(out)
}

var prefixRe = regexp.MustCompile(`prefix=(\d+)/(\d+)`)

// matched is the prefix match a reason shows, -1 when it shows none.
func matched(reason string) int {
	m := prefixRe.FindStringSubmatch(reason)
	if m == nil {
		return -1
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// tenantRig is a router with the API keys key-a, key-b and key-ops (the
// last allowed the decision headers) and an admin token.
func tenantRig(t *testing.T, isolate bool) *rig {
	t.Setenv("KVROUTE_TEST_TENANT_KEYS", "key-a,key-b,key-ops")
	return newRig(t, "kvroute", 2, func(c *config.Config) {
		c.Auth.APIKeysEnv = "KVROUTE_TEST_TENANT_KEYS"
		c.Auth.DecisionHeaderKeys = []string{"key-ops"}
		c.Auth.IsolatePrefix = isolate
		c.Admin.Token = "tenant-admin-token-0123456789"
	})
}

// The tenant probe: tenant B recovered tenant A's 64-character block one
// guess at a time from X-Kvroute-Reason (prefix=10/12 for a wrong guess,
// 11/12 for the right one), although A's requests carried a cache_salt.
// With keys configured the decision headers go only to a key allowed
// them (or the admin token), and the prefix index honours cache_salt as
// vLLM does: only requests under the same salt share blocks.
func TestTenantProbe(t *testing.T) {
	r := tenantRig(t, false)
	const blockChars = 64
	secret := words("salary-of-alice", 11*blockChars) + strings.Repeat("7", blockChars) // the 12th block is the secret
	as := func(key string, hdr ...string) []string {
		return append([]string{"Authorization", "Bearer " + key}, hdr...)
	}
	// Tenant A's prompt, salted, twice: it is in the index.
	for range 2 {
		if res := r.post("/v1/completions", completion(secret, "salt-of-a"), as("key-a")...); res.status != 200 {
			t.Fatalf("tenant A: status %d: %s", res.status, res.body)
		}
	}
	// The key allowed the headers sees that the salt keeps A's blocks
	// apart: without A's salt (or under another) nothing matches, and
	// under A's salt everything does (before anyone sent the text
	// unsalted).
	for _, tt := range []struct {
		salt string
		want int
	}{{"", 0}, {"salt-of-b", 0}, {"salt-of-a", 12}} {
		res := r.post("/v1/completions", completion(secret, tt.salt), as("key-ops")...)
		if got := matched(res.header.Get(headerReason)); got != tt.want {
			t.Errorf("cache_salt %q: reason %q shows %d blocks matched, want %d", tt.salt, res.header.Get(headerReason), got, tt.want)
		}
		if res.header.Get(headerBackend) == "" {
			t.Errorf("cache_salt %q: the allowed key got no %s", tt.salt, headerBackend)
		}
	}
	// Tenant B probes the 12th block: a wrong guess and the right one.
	guesses := []string{secret[:11*blockChars] + strings.Repeat("6", blockChars), secret}
	for i, g := range guesses {
		res := r.post("/v1/completions", completion(g, ""), as("key-b")...)
		if res.status != 200 {
			t.Fatalf("tenant B's guess %d: status %d", i, res.status)
		}
		for _, h := range []string{headerReason, headerBackend} {
			if v := res.header.Get(h); v != "" {
				t.Errorf("tenant B's guess %d got %s: %q", i, h, v)
			}
		}
	}
	// The admin token (in its own header, never forwarded) shows them too.
	res := r.post("/v1/completions", completion(secret, ""), as("key-b", headerAdminToken, "tenant-admin-token-0123456789")...)
	if res.header.Get(headerReason) == "" {
		t.Error("the admin token did not get the decision headers")
	}
	for _, b := range r.backends {
		if h := b.lastHeader.Load(); h != nil && h.Get(headerAdminToken) != "" {
			t.Errorf("backend %s saw the admin token", b.name)
		}
	}
	if res := r.post("/v1/completions", completion(secret, ""), as("key-b", headerAdminToken, "wrong-token")...); res.header.Get(headerReason) != "" {
		t.Error("a wrong admin token got the decision headers")
	}
}

// auth.isolate_prefix: each key's prompts form their own chains, so a
// key's routing never follows another's prompts; its own repeat still
// matches.
func TestIsolatePrefix(t *testing.T) {
	r := tenantRig(t, true)
	prompt := words("shared-system-prompt", 12*64)
	ops := []string{"Authorization", "Bearer key-ops"}
	if res := r.post("/v1/completions", completion(prompt, ""), "Authorization", "Bearer key-a"); res.status != 200 {
		t.Fatalf("status %d", res.status)
	}
	if got := matched(r.post("/v1/completions", completion(prompt, ""), ops...).header.Get(headerReason)); got != 0 {
		t.Errorf("another key's prompt matched %d blocks under isolation, want 0", got)
	}
	if got := matched(r.post("/v1/completions", completion(prompt, ""), ops...).header.Get(headerReason)); got != 12 {
		t.Errorf("a key's own repeat matched %d blocks, want 12", got)
	}
}

// page reads a /metrics page into its kvroute_ series (name and labels)
// and their values, leaving out the families that move with time rather
// than with a request's content (durations, rates, and the monitor's
// scrapes of the engines, which run on their own clock).
func page(body []byte) map[string]float64 {
	out := map[string]float64{}
	for line := range strings.SplitSeq(string(body), "\n") {
		i := strings.LastIndexByte(line, ' ')
		if !strings.HasPrefix(line, "kvroute_") || i < 0 || strings.Contains(line, "_seconds") || strings.HasPrefix(line, "kvroute_engine_scrape") {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err == nil {
			out[line[:i]] = v
		}
	}
	return out
}

// delta is what moved from before to after.
func delta(before, after map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// The guess probe on /metrics: with tenant A's prompt in the index,
// tenant B sent a wrong and a right guess of its last block and read the
// open page after each: kvroute_prefix_hit_tokens_total moved +176 for the
// wrong guess and +192 for the right one. The open page now moves alike
// for both; the whole page, cache families included, is the admin
// token's.
func TestMetricsGuessProbe(t *testing.T) {
	r := tenantRig(t, false)
	const blockChars = 64
	secret := words("salary-of-alice", 11*blockChars) + strings.Repeat("7", blockChars)
	for range 2 {
		if res := r.post("/v1/completions", completion(secret, ""), "Authorization", "Bearer key-a"); res.status != 200 {
			t.Fatalf("tenant A: status %d: %s", res.status, res.body)
		}
	}
	scrape := func() map[string]float64 {
		res := r.get("/metrics")
		if res.status != 200 {
			t.Fatalf("/metrics: %d", res.status)
		}
		return page(res.body)
	}
	guesses := []string{secret[:11*blockChars] + strings.Repeat("6", blockChars), secret}
	var moved [2]map[string]float64
	for i, g := range guesses {
		before := scrape()
		if res := r.post("/v1/completions", completion(g, ""), "Authorization", "Bearer key-b"); res.status != 200 {
			t.Fatalf("guess %d: status %d", i, res.status)
		}
		moved[i] = delta(before, scrape())
	}
	if len(moved[0]) == 0 {
		t.Fatal("the page did not move at all for a request")
	}
	for k, v := range moved[0] {
		if moved[1][k] != v {
			t.Errorf("%s moved %v for the wrong guess, %v for the right one", k, v, moved[1][k])
		}
	}
	for k, v := range moved[1] {
		if _, ok := moved[0][k]; !ok {
			t.Errorf("%s moved %v for the right guess only", k, v)
		}
	}
	// The operators' scrape, with the admin token, has the whole page.
	req, _ := http.NewRequest(http.MethodGet, r.base+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer tenant-admin-token-0123456789")
	resp, err := r.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "\nkvroute_prefix_hit_tokens_total ") {
		t.Error("the admin token's scrape has no kvroute_prefix_hit_tokens_total")
	}
}
