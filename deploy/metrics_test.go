package deploy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/internal/peerlink"
	"github.com/kvroute/kvroute/internal/server"
)

// vllmExposition is what the test backends serve at /metrics: enough of
// vLLM's exposition for kvroute's monitor to report an engine state.
const vllmExposition = `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.25
`

// sglangExposition is the SGLang part of the test backends' /metrics:
// the dashboard's SGLang panels read it (kvroute's vLLM reader ignores
// it).
const sglangExposition = `# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m"} 1.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m"} 0.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m"} 0.3
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="m"} 0.5
`

// prefillExposition is vLLM's prefill counters after n scrapes: 1,000
// prompt tokens prefilled in 0.1 s between two scrapes, so that the
// monitor learns the engine's own prefill rate.
func prefillExposition(n int64) string {
	return fmt.Sprintf(`# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} %d
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} %d
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} %d
# TYPE vllm:request_prefill_time_seconds histogram
vllm:request_prefill_time_seconds_bucket{engine="0",model_name="m",le="+Inf"} %d
vllm:request_prefill_time_seconds_sum{engine="0",model_name="m"} %g
vllm:request_prefill_time_seconds_count{engine="0",model_name="m"} %d
`, 1000*n, 400*n, 1000*n, n, 0.1*float64(n), n)
}

// testEngine is a loopback backend: healthy, with vLLM (and SGLang)
// metrics; its completions take delay, or fail with 500 when fail is
// set, and stream three token chunks and a usage chunk when asked to.
func testEngine(t *testing.T, fail bool, delay time.Duration) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	var scrapes atomic.Int64
	mux.HandleFunc("GET /health", func(http.ResponseWriter, *http.Request) {})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = io.WriteString(w, vllmExposition+sglangExposition+prefillExposition(scrapes.Add(1)))
	})
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if fail {
			http.Error(w, `{"error":{"message":"down","type":"server_error"}}`, http.StatusInternalServerError)
			return
		}
		select {
		case <-time.After(delay):
		case <-r.Context().Done():
			return
		}
		if strings.Contains(string(body), `"stream":true`) {
			w.Header().Set("Content-Type", "text/event-stream")
			for _, tok := range []string{"a", "b", "c"} {
				fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"%s\"}}]}\n\n", tok)
				w.(http.Flusher).Flush()
				time.Sleep(5 * time.Millisecond)
			}
			_, _ = io.WriteString(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":8,\"completion_tokens\":3,\"total_tokens\":11}}\n\ndata: [DONE]\n\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":8,"completion_tokens":1,"total_tokens":9}}`)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// liveFleet is a router on loopback over two test backends, one failing,
// and a second router over a split fleet (pdFleet).
type liveFleet struct {
	base      string // the router's URL
	good, bad *httptest.Server
	client    *http.Client
	pd        *pdFleet
}

// newLiveFleet starts a router over two loopback backends, one failing,
// with round robin, ejection after one failure and admission at one
// request in flight per backend; and the split fleet's router.
func newLiveFleet(t *testing.T) *liveFleet {
	t.Helper()
	good, bad := testEngine(t, false, 100*time.Millisecond), testEngine(t, true, 0)
	cfg, err := config.Parse(fmt.Appendf(nil, `
listen: 127.0.0.1:0
policy: round-robin
backends:
  - {name: good, url: %s, models: [m], kind: vllm}
  - {name: bad, url: %s, models: [m], kind: vllm}
health: {eject_after: 1, cooldown: 1m, max_cooldown: 1m}
engines: {interval: 50ms}
admission: {max_inflight_per_backend: 1}
upstream: {discover_models: false}
`, good.URL, bad.URL))
	if err != nil {
		t.Fatal(err)
	}
	return &liveFleet{base: startRouter(t, cfg), good: good, bad: bad, client: &http.Client{Timeout: 10 * time.Second}, pd: newPDFleet(t)}
}

// post sends one chat completion, streamed or not, and reads it whole.
func (l *liveFleet) post(stream bool) error {
	resp, err := l.client.Post(l.base+"/v1/chat/completions", "application/json",
		strings.NewReader(fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"hello there"}],"max_tokens":4,"stream":%t}`, stream)))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != 200 {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// drive sends the traffic that gives every metric a sample: a retry, an
// ejection, waits in the admission queue, streamed tokens.
func (l *liveFleet) drive(t *testing.T) {
	t.Helper()
	post := func() error { return l.post(false) }
	// Round robin sends one of the first two to the failing backend: a
	// 500, an ejection (for a minute: the test's whole life) and a retry
	// on the good one.
	for range 2 {
		if err := post(); err != nil {
			t.Fatalf("completion: %v", err)
		}
	}
	// One backend left, one request in flight at a time: the others
	// wait in the admission queue.
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for range 3 {
		wg.Go(func() { errs <- post() })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("queued completion: %v", err)
		}
	}
	if err := l.post(true); err != nil {
		t.Fatalf("streamed completion: %v", err)
	}
	l.pd.drive(t)
}

// kvrouteMetrics runs a live fleet, drives it until every metric it
// registers has a sample (a retry, an ejection, a wait in the admission
// queue, an engine report), scrapes its /metrics and returns every
// sample name it serves: a histogram x as x_bucket, x_sum and x_count.
func kvrouteMetrics(t *testing.T) map[string]bool {
	t.Helper()
	l := newLiveFleet(t)
	l.drive(t)
	client, base := l.client, l.base
	deadline := time.Now().Add(10 * time.Second)
	for {
		names, err := scrape(client, base+"/metrics")
		if err != nil {
			t.Fatal(err)
		}
		pd, err := scrape(client, l.pd.base+"/metrics")
		if err != nil {
			t.Fatal(err)
		}
		maps.Copy(names, pd)
		if names["kvroute_engine_kv_usage"] && names["kvroute_ejections_total"] && names["kvroute_queue_wait_seconds_count"] &&
			names["kvroute_engine_prefill_rate_tokens_per_second"] && names["kvroute_kv_hash_parity"] && names["kvroute_kv_events_received_total"] {
			return names
		}
		if time.Now().After(deadline) {
			t.Fatalf("the router's /metrics never showed every metric; it has %v", names)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// scrape reads a text exposition's metric families off its TYPE lines.
func scrape(client *http.Client, url string) (map[string]bool, error) {
	resp, err := client.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	names := map[string]bool{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 4 || f[0] != "#" || f[1] != "TYPE" {
			continue
		}
		switch name, typ := f[2], f[3]; typ {
		case "histogram":
			names[name+"_bucket"], names[name+"_sum"], names[name+"_count"] = true, true, true
		case "summary":
			names[name], names[name+"_sum"], names[name+"_count"] = true, true, true
		default:
			names[name] = true
		}
	}
	return names, sc.Err()
}

// pdFleet is a second router on loopback, the one whose families the
// first cannot show: over two emulated vLLM engines (one prefill, one
// decode), both publishing KV events and serving a LoRA adapter, with
// every request split and sync on through an in-process NATS server.
type pdFleet struct {
	base    string   // the router's URL
	engines []string // the engines' URLs
	client  *http.Client
}

// pdAdapter is the LoRA adapter the engines serve.
const pdAdapter = "sql-lora"

// newPDFleet starts the engines, NATS and the router.
func newPDFleet(t *testing.T) *pdFleet {
	t.Helper()
	ns, err := peerlink.LoopbackServer(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	p, err := engine.LookupPreset("h100-llama3-8b")
	if err != nil {
		t.Fatal(err)
	}
	p.MaxLoras = 2
	cfg := config.Default()
	cfg.Listen = "127.0.0.1:0"
	cfg.Engines.Interval = 50 * time.Millisecond
	cfg.Disaggregation.Protocol, cfg.Disaggregation.Split = "vllm", "always"
	cfg.Sync.URL = ns.ClientURL()
	f := &pdFleet{client: &http.Client{Timeout: 30 * time.Second}}
	for _, role := range []string{config.RolePrefill, config.RoleDecode} {
		em, err := emulator.Start(t.Context(), emulator.Config{
			Preset: p, TimeScale: 20, Role: role, Logger: slog.New(slog.DiscardHandler),
			LoRAModules: []emulator.LoRAModule{{Name: pdAdapter, Path: "/adapters/" + pdAdapter}},
			KVEvents:    &kvevents.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Bind: true},
		}, "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = em.Close() })
		f.engines = append(f.engines, em.URL)
		cfg.Backends = append(cfg.Backends, config.Backend{Name: role + "-0", URL: em.URL, Kind: "vllm", Role: role,
			KVEvents: "tcp://" + em.Server.KVEventsAddr().String()})
	}
	f.base = startRouter(t, cfg)
	return f
}

// drive sends streamed split requests, to the base model and to the
// adapter, with prompts long enough for the engines to store blocks.
func (f *pdFleet) drive(t *testing.T) {
	t.Helper()
	prompt := strings.Repeat("the router splits this request into a prefill and a decode leg. ", 10)
	for i, model := range []string{"meta-llama/Llama-3.1-8B-Instruct", pdAdapter, "meta-llama/Llama-3.1-8B-Instruct"} {
		body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"%d %s"}],"max_tokens":4,"stream":true}`, model, i, prompt)
		resp, err := f.client.Post(f.base+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Kvroute-Prefill-Backend") == "" {
			t.Fatalf("%s: status %d, prefill backend %q (reason %q): want a split request", model, resp.StatusCode, resp.Header.Get("X-Kvroute-Prefill-Backend"), resp.Header.Get("X-Kvroute-Reason"))
		}
	}
}

// startRouter validates cfg and starts a router on it, shut down when the
// test ends, and returns its URL.
func startRouter(t *testing.T, cfg *config.Config) string {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s, err := server.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
	})
	return "http://" + s.Addr()
}
