package proxy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/admin"
	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/prefix"
)

// chatTurn is the body of turn turn of conversation conv: a long opening
// of its own and turn exchanges after it, so that each turn's prompt
// extends the previous one's.
func chatTurn(conv, turn int, stream bool) string {
	msgs := []map[string]string{{"role": "user", "content": strings.Repeat(fmt.Sprintf("conversation %d opens with its own long context. ", conv), 40)}}
	for i := range turn {
		msgs = append(msgs,
			map[string]string{"role": "assistant", "content": strings.Repeat(fmt.Sprintf("answer %d of %d. ", i, conv), 8)},
			map[string]string{"role": "user", "content": strings.Repeat(fmt.Sprintf("question %d of %d? ", i+1, conv), 8)})
	}
	b, _ := json.Marshal(map[string]any{"model": "shared", "messages": msgs, "max_tokens": 2, "stream": stream,
		"stream_options": map[string]bool{"include_usage": true}})
	return string(b)
}

// TestAuditEngineResetBehindTheRouter: an emulated engine whose prefix
// cache is reset behind the router's back (POST /reset_prefix_cache on
// the engine itself) is caught from the cached tokens it reports, within
// 20 requests; before the reset, when the router's picture is right, the
// audit changes nothing, and what it compared (the engine's reports,
// streamed and whole) shows in its totals.
func TestAuditEngineResetBehindTheRouter(t *testing.T) {
	t.Setenv(config.AdminTokenEnv, "")
	const token = "audit-token-0123456789"
	r, ems := newEmuRig(t, 1, 50, func(c *config.Config) { c.Admin.Token = token })
	b := r.backendByName(ems[0].name)
	audit := r.srv.sched.Audit()
	const convs = 6
	turn := 0
	send := func() {
		for c := range convs {
			if res := r.post("/v1/chat/completions", chatTurn(c, turn, c%2 == 0)); res.status != http.StatusOK {
				t.Fatalf("turn %d of conversation %d: %d %s", turn, c, res.status, res.body)
			}
		}
		turn++
	}
	for range 4 {
		send()
	}
	before := audit.Backend(b.ID)
	var tot prefix.Totals
	for _, x := range before.Totals {
		tot.Sum(x)
	}
	if tot.Requests != 4*convs || tot.Reported == 0 || tot.Predicted == 0 {
		t.Fatalf("audit totals before the reset: %+v", tot)
	}
	for v, n := range before.Actions {
		if n != 0 {
			t.Fatalf("before the reset the audit said %s %d times (totals %+v)", v, n, tot)
		}
	}
	resp, err := http.Post(ems[0].srv.URL+"/reset_prefix_cache", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	sent := 0
	for sent < 20 && audit.Backend(b.ID).Actions["forget"] == 0 {
		send()
		sent += convs
	}
	if audit.Backend(b.ID).Actions["forget"] == 0 {
		t.Fatalf("reset not detected after %d requests (audit %+v)", sent, audit.Backend(b.ID))
	}
	t.Logf("reset detected within %d requests", sent)
	m := string(r.get("/metrics").body)
	for _, want := range []string{
		`kvroute_prefix_audit_actions_total{action="forget",backend="e0"} 1`,
		`kvroute_prefix_trusted{backend="e0"} 1`,
		`kvroute_cache_reported_tokens_total{backend="e0",policy="kvroute"} `,
		`kvroute_cache_predicted_tokens_total{backend="e0",policy="kvroute"} `,
		`kvroute_cache_best_tokens_total{backend="e0",policy="kvroute"} `,
		`kvroute_ttft_estimated_requests_total{backend="e0",policy="kvroute"} `,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	status, body := r.adminCall("GET", "/admin/backends", token)
	var list struct{ Backends []admin.Backend }
	if err := json.Unmarshal(body, &list); status != http.StatusOK || err != nil || len(list.Backends) != 1 {
		t.Fatalf("/admin/backends: %d %s", status, body)
	}
	if c := list.Backends[0].Cache; c.ReportedCachedTokens == 0 || c.AuditedPromptTokens == 0 || !c.Trusted || c.Actions["forget"] != 1 {
		t.Errorf("/admin/backends cache audit %+v", c)
	}
}
