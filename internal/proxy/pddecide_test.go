package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/admin"
	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/emulator"
)

// decideLatency is the transfer latency the conditional split tests
// configure (the per-token cost 0): the split of a request with u
// uncached tokens then saves u p of its stall against 4 ms plus the decode
// engine's step, at p seconds a prompt token. With the tests' prompts (a
// short one and a cached one, under 40 uncached tokens; a long one of
// about 16,000) that puts the short ones whole and the long one split for
// any rate the router may learn of the emulated engines from 0.5 µs to
// 100 µs a token (the engine model's h100 figure is 32 µs, 1.6 µs of real
// time at the rig's time scale of 20).
const decideLatency = 4 * time.Millisecond

// decideRig is a conditional-split fleet of an emulated prefill engine
// and an emulated decode engine.
func decideRig(t *testing.T, split string) (*rig, *emuEngine, *emuEngine) {
	t.Helper()
	return decideRigPolicy(t, split, "kvroute")
}

// decideRigPolicy is decideRig under policy pol.
func decideRigPolicy(t *testing.T, split, pol string) (*rig, *emuEngine, *emuEngine) {
	t.Helper()
	pre, dec := startEmu(t, "p0", emulator.RolePrefill, emuPreset(t)), startEmu(t, "d0", emulator.RoleDecode, emuPreset(t))
	r := emuRigWith(t, config.ProtocolVLLM, func(c *config.Config) {
		c.Policy = pol
		c.Admin.Token, c.Admin.Decisions = "pd-admin-token-for-tests", 16
		c.Disaggregation.Split = split
		c.Disaggregation.KVTransferLatency = decideLatency
		c.Disaggregation.KVTransferTimePerToken = 0
	}, pre, dec)
	return r, pre, dec
}

// decideBody is a non-streaming chat request of content.
func decideBody(model, content string) string {
	return fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":2,"ignore_eos":true}`, model, content)
}

// longContent is a prompt of about 16,000 tokens, unique to tag.
func longContent(tag string) string {
	return tag + ": " + strings.Repeat("the quick brown fox jumps over the lazy dog. ", 1400)
}

// decodingStream starts a long streaming request and returns once its
// first token is read (the router then counts it as decoding on its
// engine); the stream is cut when the test ends, or by the returned stop.
func decodingStream(t *testing.T, r *rig, model string) (reason string, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"keep decoding"}],"stream":true,"max_tokens":60000,"ignore_eos":true}`, model)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	client := &http.Client{}
	resp, err := client.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	stop = func() {
		cancel()
		<-done
	}
	first := make(chan bool, 1)
	go func() {
		defer close(done)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sent := false
		for sc.Scan() {
			if !sent && strings.Contains(sc.Text(), `"content":`) {
				first <- true
				sent = true
			}
		}
		if !sent {
			first <- false
		}
	}()
	if !<-first {
		stop()
		t.Fatalf("the decoding stream ended before its first token (status %d)", resp.StatusCode)
	}
	t.Cleanup(stop)
	return resp.Header.Get(headerReason), stop
}

// TestConditionalSplitLive: with disaggregation.split conditional (the
// default) the proxy asks disagg.Decide, as the simulator does, before it
// gives a request its legs. With a stream decoding on the decode engine
// (whose steps a whole prefill would stall), a short prompt is served
// whole on the decode engine (its stall is less than a transfer), a long
// uncached one is split (its stall is more), and the same long prompt
// again, now held by both engines, is served whole; each whole request
// says why in X-Kvroute-Reason and /admin/decisions, and is counted.
func TestConditionalSplitLive(t *testing.T) {
	r, pre, dec := decideRig(t, config.SplitConditional)
	model := pre.Model()
	wholeOf := func(what string, res result) {
		t.Helper()
		if res.status != 200 {
			t.Fatalf("%s: status %d: %s", what, res.status, res.body)
		}
		reason := res.header.Get(headerReason)
		if !strings.HasPrefix(reason, "whole (") || res.header.Get("X-Kvroute-Backend") != "d0" {
			t.Errorf("%s: backend %q, reason %q: want served whole on d0, saying why", what, res.header.Get("X-Kvroute-Backend"), reason)
		}
	}

	// Nothing decodes yet: the stream itself is served whole.
	reason, stop := decodingStream(t, r, model)
	if !strings.HasPrefix(reason, "whole (not worth a transfer: ") {
		t.Errorf("first stream's reason %q: want whole, nothing to protect", reason)
	}

	short := r.post("/v1/chat/completions", decideBody(model, "a short question"))
	wholeOf("short prompt", short)
	if !strings.HasPrefix(short.header.Get(headerReason), "whole (not worth a transfer: whole ") {
		t.Errorf("short prompt's reason %q", short.header.Get(headerReason))
	}
	if n := len(pre.legs()); n != 0 {
		t.Fatalf("the prefill engine got %d requests: want none before the long prompt", n)
	}

	long := longContent("long")
	res := r.post("/v1/chat/completions", decideBody(model, long))
	if res.status != 200 || !strings.HasPrefix(res.header.Get(headerReason), "prefill p0") || len(pre.legs()) != 1 {
		t.Fatalf("long uncached prompt: status %d, reason %q, %d prefill legs: want split", res.status, res.header.Get(headerReason), len(pre.legs()))
	}
	if st := dec.Stats(); st.KVTransferTokens == 0 {
		t.Errorf("the decode engine received no KV cache for the split request: %+v", st)
	}

	// Both engines now hold the long prompt: what is left is short.
	wholeOf("cached long prompt", r.post("/v1/chat/completions", decideBody(model, long)))
	if n := len(pre.legs()); n != 1 {
		t.Errorf("the prefill engine got %d requests: want only the uncached long prompt's", n)
	}
	stop()
	t.Logf("reasons: stream %q; short %q; long %q", reason, short.header.Get(headerReason), res.header.Get(headerReason))

	status, body := r.adminCall(http.MethodGet, "/admin/decisions", "pd-admin-token-for-tests")
	var log struct{ Decisions []admin.Decision }
	if status != 200 || json.Unmarshal(body, &log) != nil {
		t.Fatalf("GET /admin/decisions: %d %s", status, body)
	}
	whole := 0
	for _, d := range log.Decisions {
		if strings.HasPrefix(d.Whole, "not worth a transfer: whole ") && len(d.Legs) == 0 {
			whole++
		}
	}
	if whole < 2 { // the stream's, cut, may be settled yet or not
		t.Errorf("/admin/decisions %s: want the short and the cached prompt's whole, saying why", body)
	}

	metrics := string(r.get("/metrics").body)
	if v := metricValue(metrics, fmt.Sprintf(`kvroute_pd_requests_total{model=%q,outcome="decided_whole"}`, model)); v != 3 {
		t.Errorf("decided_whole count %v: want 3 (the stream, the short prompt, the cached long one)", v)
	}
	if v := metricValue(metrics, fmt.Sprintf(`kvroute_pd_requests_total{model=%q,outcome="split"}`, model)); v != 1 {
		t.Errorf("split count %v: want 1", v)
	}
}

// TestAlwaysSplitLive: with disaggregation.split always every request a
// prefill engine can take is split, the short prompt as the long one.
func TestAlwaysSplitLive(t *testing.T) {
	r, pre, _ := decideRig(t, config.SplitAlways)
	model := pre.Model()
	for i, content := range []string{"a short question", longContent("always")} {
		res := r.post("/v1/chat/completions", decideBody(model, content))
		if res.status != 200 || !strings.HasPrefix(res.header.Get(headerReason), "prefill p0") || len(pre.legs()) != i+1 {
			t.Errorf("request %d: status %d, reason %q, %d prefill legs: want split", i, res.status, res.header.Get(headerReason), len(pre.legs()))
		}
	}
}

// TestPolicyDeciderLive: under split conditional a P/D policy with a split
// decision of its own (policy.PairDecider) decides, as it does in the
// simulator: least-loaded-pair splits every request, the short prompt the
// conditional split would serve whole included.
func TestPolicyDeciderLive(t *testing.T) {
	r, pre, _ := decideRigPolicy(t, config.SplitConditional, "least-loaded-pair")
	res := r.post("/v1/chat/completions", decideBody(pre.Model(), "a short question"))
	if res.status != 200 || !strings.HasPrefix(res.header.Get(headerReason), "prefill p0") || len(pre.legs()) != 1 {
		t.Errorf("status %d, reason %q, %d prefill legs: want split, by the policy", res.status, res.header.Get(headerReason), len(pre.legs()))
	}
}
