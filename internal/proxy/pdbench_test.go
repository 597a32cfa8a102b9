package proxy

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/config"
)

// BenchmarkSplitHop measures the latency the router adds to a request
// split over a prefill and a decode engine (two upstream requests, the
// prefill answer read and the decode body rewritten), beside the same
// request served whole by a router over the same two engines, both roles
// "both": one client alternates a request straight to an engine and one
// through the router, as BenchmarkProxyHop does. The engines read the body
// and answer a fixed completion with kv_transfer_params.
func BenchmarkSplitHop(b *testing.B) {
	for _, split := range []bool{false, true} {
		for _, size := range []int{4 << 10, 200 << 10} {
			name := "whole"
			if split {
				name = "split"
			}
			b.Run(fmt.Sprintf("%s/%dKB", name, size>>10), func(b *testing.B) {
				engines := []*httptest.Server{newKVStaticB(b), newKVStaticB(b)}
				cfg := config.Default()
				cfg.Listen = "127.0.0.1:0"
				cfg.Health.Interval = time.Hour
				cfg.Engines.Enabled = false
				for i, e := range engines {
					cfg.Backends = append(cfg.Backends, config.Backend{URL: e.URL, Name: fmt.Sprintf("e%d", i), Models: []string{"bench-model"}})
				}
				if split {
					cfg.Backends[0].Role, cfg.Backends[1].Role = config.RolePrefill, config.RoleDecode
					// Every request split: the conditional split would
					// serve these whole (nothing decodes to stall).
					cfg.Disaggregation.Split = config.SplitAlways
				}
				if err := cfg.Validate(); err != nil {
					b.Fatal(err)
				}
				srv, err := newRouter(cfg, nil)
				if err != nil {
					b.Fatal(err)
				}
				if err := srv.Start(); err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = srv.Shutdown(b.Context()) })
				measureHop(b, engines[1].URL+"/v1/chat/completions", "http://"+srv.Addr()+"/v1/chat/completions", hopBody("bench-model", size), 1)
			})
		}
	}
}

// newKVStaticB is newStaticB answering as a vLLM engine with a KV
// connector does: its completion carries kv_transfer_params.
func newKVStaticB(b *testing.B) *httptest.Server {
	b.Helper()
	answer := `{"id":"c-bench","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"x"},"finish_reason":"length"}],` +
		`"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[1,2,3],"remote_engine_id":"e","remote_request_id":"r","remote_host":"10.0.0.1","remote_port":5600,"tp_size":1}}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/v1/chat/completions" {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, answer)
		}
	}))
	b.Cleanup(srv.Close)
	return srv
}
