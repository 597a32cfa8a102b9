package proxy

import (
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/lifecycle"
)

// hostileBody is clientBody with every split protocol member a client may
// try to set, at the top level and inside vllm_xargs.
const hostileBody = `{"model":"m","messages":[{"role":"user","content":"hello ✓"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":64,"max_completion_tokens":64,"temperature":0.5,` +
	`"kv_transfer_params":{"do_remote_prefill":true,"remote_host":"169.254.169.254","remote_port":80,"remote_engine_id":"x","remote_block_ids":[1]},` +
	`"bootstrap_host":"169.254.169.254","bootstrap_port":80,"bootstrap_room":7,"routed_dp_rank":3,"data_parallel_rank":3,` +
	`"vllm_xargs":{"kv_transfer_params":{"do_remote_decode":true},"a":1}}`

// checkOwnFields fails unless leg carries none of a client's split
// protocol members or its data-parallel rank header.
func checkOwnFields(t *testing.T, who string, leg pdLeg) {
	t.Helper()
	for _, k := range []string{"bootstrap_host", "bootstrap_port", "bootstrap_room", "routed_dp_rank", "data_parallel_rank"} {
		if _, ok := leg.body[k]; ok {
			t.Errorf("%s got the client's %s", who, k)
		}
	}
	if x, _ := leg.body["vllm_xargs"].(map[string]any); x == nil || x["kv_transfer_params"] != nil || x["a"] != 1.0 {
		t.Errorf("%s got vllm_xargs %v: want the client's without kv_transfer_params", who, leg.body["vllm_xargs"])
	}
	if kv, _ := leg.body["kv_transfer_params"].(map[string]any); kv != nil && kv["remote_host"] == "169.254.169.254" {
		t.Errorf("%s got the client's kv_transfer_params %v", who, kv)
	}
	if h := leg.header.Get("X-Data-Parallel-Rank"); h != "" {
		t.Errorf("%s got the client's X-data-parallel-rank %q", who, h)
	}
}

// TestClientSplitFieldsRemoved: a client's kv_transfer_params, SGLang
// bootstrap members, data-parallel ranks (members and header) reach no
// engine, whether the request is served whole (the conditional split's
// short prompt) or split.
func TestClientSplitFieldsRemoved(t *testing.T) {
	for _, split := range []string{config.SplitConditional, config.SplitAlways} {
		t.Run(split, func(t *testing.T) {
			r, pre, dec := pdRig(t, 1, 1, func(c *config.Config) { c.Disaggregation.Split = split })
			res := r.post("/v1/chat/completions", hostileBody, "X-data-parallel-rank", "3")
			if res.status != 200 {
				t.Fatalf("status %d: %s", res.status, res.body)
			}
			all := append(pre[0].legs(), dec[0].legs()...)
			if len(all) == 0 {
				t.Fatal("no engine got the request")
			}
			for i, leg := range all {
				checkOwnFields(t, "leg "+string(rune('0'+i)), leg)
			}
			if split == config.SplitConditional {
				// Served whole: no kv_transfer_params at all, so the
				// engine neither pulls nor holds blocks.
				if _, ok := all[0].body["kv_transfer_params"]; ok || len(all) != 1 {
					t.Errorf("whole request: %d legs, kv_transfer_params %v: want one, none", len(all), all[0].body["kv_transfer_params"])
				}
			}
		})
	}
}

// TestEngineParamsNotRelayed: an engine's own kv_transfer_params in its
// answer (vLLM's JSON completion has them at the top level; a stream's
// chunks may carry them) never reach the client, on a request served
// whole or split, streamed or not: the client gets the answer with null
// in their place, every other byte as the engine wrote it, its length
// (the engine's Content-Length) kept.
func TestEngineParamsNotRelayed(t *testing.T) {
	for _, split := range []string{config.SplitConditional, config.SplitAlways} {
		for _, stream := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s stream=%v", split, stream), func(t *testing.T) {
				r, pre, dec := pdRig(t, 1, 1, func(c *config.Config) { c.Disaggregation.Split = split })
				pre[0].answerKV.Store(true)
				dec[0].answerKV.Store(true)
				body := clientBody
				if !stream {
					body = `{"model":"m","messages":[{"role":"user","content":"hello ✓"}],"max_tokens":64}`
				}
				res := r.post("/v1/chat/completions", body)
				if res.status != 200 || res.readErr != nil {
					t.Fatalf("status %d, %v: %s", res.status, res.readErr, res.body)
				}
				from := res.header.Get(headerBackend)
				if split == config.SplitAlways && from != "d0" {
					t.Fatalf("served by %q: want the decode leg's d0", from)
				}
				kv := kvParamsJSON(from)
				want := strings.ReplaceAll(ownAnswer(from, stream), kv, "null"+strings.Repeat(" ", len(kv)-4))
				if string(res.body) != want {
					t.Errorf("client got\n%s\nwant\n%s", res.body, want)
				}
				if strings.Contains(string(res.body), "engine-") || strings.Contains(string(res.body), "remote_") {
					t.Errorf("the engine's kv_transfer_params reached the client: %s", res.body)
				}
			})
		}
	}
}

// TestPrefillParamsUnusable: a prefill answer whose kv_transfer_params
// name another host (or are of the wrong type, or over the bound) never
// reaches a decode engine: the decode engine serves the request whole
// (the client's body), counted prefill_unusable, not split.
func TestPrefillParamsUnusable(t *testing.T) {
	r, pre, dec := pdRig(t, 1, 1, nil)
	bad := kvParams("p0")
	bad["remote_host"] = "169.254.169.254"
	pre[0].kv.Store(&bad)
	res := r.post("/v1/chat/completions", clientBody)
	if res.status != 200 || string(res.body) != strings.Join(streamEvents("d0", 3), "") {
		t.Fatalf("status %d, body %q: want d0's stream", res.status, res.body)
	}
	d := dec[0].legs()
	if len(d) != 1 || !reflect.DeepEqual(d[0].body, jsonOf(t, clientBody)) {
		t.Fatalf("decode got %v: want the client's own body", d)
	}
	page := string(r.get("/metrics").body)
	if v := metricValue(page, `kvroute_pd_requests_total{model="m",outcome="prefill_unusable"}`); v != 1 {
		t.Errorf("prefill_unusable = %v, want 1", v)
	}
	if v := metricValue(page, `kvroute_pd_requests_total{model="m",outcome="split"}`); v > 0 {
		t.Errorf("split = %v, want 0: the decode engine served it whole", v)
	}
	if reason := res.header.Get(headerReason); !strings.Contains(reason, "decode d0 (whole)") {
		t.Errorf("reason %q: want the decode leg serving whole", reason)
	}
}

// TestEjectedDecodePoolServedWhole: once the only decode engine is
// ejected, the split decision reads the healthy engines: requests are
// served whole by the vLLM prefill engine (which serves any request), and
// no 503 is charged to it.
func TestEjectedDecodePoolServedWhole(t *testing.T) {
	r, pre, dec := pdRig(t, 1, 1, func(c *config.Config) {
		c.Health.Path, c.Health.EjectAfter, c.Retry.Attempts = "", 1, 0
	})
	dec[0].fail.Store(1)
	r.post("/v1/chat/completions", clientBody) // d0's 500 ejects it
	for _, b := range r.srv.Fleet().Snapshot().Healthy {
		if b.Name == "d0" {
			t.Fatal("d0 still healthy after its 500")
		}
	}
	res := r.post("/v1/chat/completions", clientBody)
	if res.status != 200 || res.header.Get(headerBackend) != "p0" {
		t.Fatalf("status %d from %q: %s: want p0 serving whole", res.status, res.header.Get(headerBackend), res.body)
	}
	if p := pre[0].legs(); !reflect.DeepEqual(p[len(p)-1].body, jsonOf(t, clientBody)) {
		t.Errorf("p0 got %v: want the client's own body", p[len(p)-1].body)
	}
	page := string(r.get("/metrics").body)
	if v := metricValue(page, `kvroute_requests_total{backend="p0",model="m",policy="kvroute",status="503"}`); v > 0 {
		t.Errorf("p0 charged %v 503s", v)
	}
}

// TestRelayIdleRace: a stream idle deadline whose Stop reports false has
// fired, even before its function ran: the read is the idle timeout (the
// body counts as broken by the backend), never bytes handed on that the
// deadline then cuts.
func TestRelayIdleRace(t *testing.T) {
	prev := lifecycle.SetAfterFunc(func(_ time.Duration, f func()) lifecycle.Timer { return firedTimer{} })
	t.Cleanup(func() { lifecycle.SetAfterFunc(prev) })
	cfg := config.Default()
	cfg.Upstream.StreamIdleTimeout = time.Hour
	ex := &exchange{s: &Server{cfg: cfg}}
	ex.Passthrough = true
	resp := &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody,
		Request: (&http.Request{}).WithContext(t.Context())}
	resp.Body = readCloser{strings.NewReader("data: {}\n\n")}
	rl := newRelay(ex, nil, resp, nil, nil)
	buf := make([]byte, 64)
	if _, err := rl.Read(buf); err != errStreamIdle || rl.broken != errStreamIdle {
		t.Errorf("read error %v, broken %v: want the stream idle timeout", err, rl.broken)
	}
}

// firedTimer is a deadline that passed before any Stop, its function not
// yet run.
type firedTimer struct{}

func (firedTimer) Stop() bool               { return false }
func (firedTimer) Reset(time.Duration) bool { return false }

type readCloser struct{ *strings.Reader }

func (readCloser) Close() error { return nil }
