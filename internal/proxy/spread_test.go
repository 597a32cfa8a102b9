package proxy

import (
	"fmt"
	"strings"
	"testing"
)

// TestIdleSpreadThenStick sends four unrelated long prompts one after
// another to three idle backends, one of which answers at once whatever the
// prompt (a fast server, a small model, a cached response), each prompt
// followed by five questions on it (the prompt plus a question, no session
// header). The prompts must use all three backends, and each prompt's
// questions must stay where the prompt went.
func TestIdleSpreadThenStick(t *testing.T) {
	r := newRig(t, "kvroute", 3, nil)
	r.backends[0].prefillRate = 0 // instant first byte, whatever the prompt
	for _, f := range r.backends[1:] {
		f.prefillRate = 100000 // 2,000 uncached tokens in 20 ms
	}
	used := map[string]int{}
	for d := range 4 {
		doc := words(fmt.Sprintf("unrelated-doc%d", d), 8000)
		home := ""
		for q := range 6 {
			msg := doc
			if q > 0 {
				msg += " Question: " + words(fmt.Sprintf("d%d-q%d", d, q), 60)
			}
			res := r.post("/v1/chat/completions", chat("shared", true, msg))
			if res.status != 200 {
				t.Fatalf("status %d: %s", res.status, res.body)
			}
			got := res.header.Get("X-Kvroute-Backend")
			if q == 0 {
				home = got
				used[got]++
				continue
			}
			if got != home {
				t.Errorf("prompt %d question %d went to %s, the prompt to %s (reason %q)", d, q, got, home, res.header.Get("X-Kvroute-Reason"))
			}
		}
	}
	if len(used) != 3 {
		t.Errorf("four unrelated prompts on idle backends used %d of 3 backends: %v", len(used), used)
	}
}

// TestEnginePrefillRateSeries: the engine-reported prefill rate has a
// series only for a backend whose engine reports one.
func TestEnginePrefillRateSeries(t *testing.T) {
	r := newRig(t, "kvroute", 2, nil)
	const name = "kvroute_engine_prefill_rate_tokens_per_second"
	if body := string(r.get("/metrics").body); strings.Contains(body, name+"{") {
		t.Fatalf("%s exported before any engine reported a rate:\n%s", name, body)
	}
	r.srv.Fleet().Snapshot().All[1].ObserveEnginePrefill(6000, 2)
	body := string(r.get("/metrics").body)
	if !strings.Contains(body, name+`{backend="b1"} 3000`) || strings.Contains(body, name+`{backend="b0"}`) {
		t.Fatalf("want %s for b1 only, at 3000:\n%s", name, body)
	}
}
