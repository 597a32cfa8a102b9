package proxy

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/config"
)

// TestEngineMonitorWired: kvroute serve scrapes its backends' vLLM metrics
// into the fleet, exports them on its own /metrics, and stops scraping at
// Shutdown, closing its connections; with engines.enabled off it scrapes
// nothing.
func TestEngineMonitorWired(t *testing.T) {
	for _, enabled := range []bool{true, false} {
		t.Run(fmt.Sprintf("enabled=%v", enabled), func(t *testing.T) {
			engine := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/metrics" {
					fmt.Fprint(w, "vllm:num_requests_running{model_name=\"m\"} 2\nvllm:num_requests_waiting{model_name=\"m\"} 50\n")
					return
				}
				w.WriteHeader(http.StatusOK)
			}))
			var open atomic.Int64 // the router's connections to the engine
			engine.Config.ConnState = func(_ net.Conn, st http.ConnState) {
				switch st {
				case http.StateNew:
					open.Add(1)
				case http.StateClosed, http.StateHijacked:
					open.Add(-1)
				}
			}
			engine.Start()
			defer engine.Close()
			cfg := config.Default()
			cfg.Listen = "127.0.0.1:0"
			cfg.Backends = []config.Backend{{URL: engine.URL, Name: "e0", Kind: "vllm"}}
			cfg.Upstream.DiscoverModels = false
			cfg.Engines.Enabled = enabled
			cfg.Engines.Interval = 10 * time.Millisecond
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			s, err := newRouter(cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Start(); err != nil {
				t.Fatal(err)
			}
			b := s.Fleet().Snapshot().All[0]
			if enabled {
				deadline := time.Now().Add(5 * time.Second)
				for b.Engine() == nil {
					if time.Now().After(deadline) {
						t.Fatal("no engine state scraped within 5s")
					}
					time.Sleep(5 * time.Millisecond)
				}
				if e := b.Engine(); e.Waiting != 50 || e.Running != 2 {
					t.Fatalf("engine state %+v, want 2 running 50 waiting", e)
				}
				resp, err := http.Get("http://" + s.Addr() + "/metrics")
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if !strings.Contains(string(body), `kvroute_engine_waiting{backend="e0"} 50`) {
					t.Fatalf("router /metrics lacks the engine's queue:\n%s", body)
				}
			} else {
				time.Sleep(100 * time.Millisecond)
				if e := b.Engine(); e != nil {
					t.Fatalf("engine state %+v scraped with engines.enabled off", e)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := s.Shutdown(ctx); err != nil {
				t.Fatal(err)
			}
			if e := b.Engine(); e != nil {
				t.Fatalf("engine state %+v kept after Shutdown", e)
			}
			// Shutdown leaves no connection open to the engine: neither
			// the health checks' nor the scrapes' idle ones.
			deadline := time.Now().Add(2 * time.Second)
			for open.Load() != 0 {
				if time.Now().After(deadline) {
					t.Fatalf("%d connections to the engine still open 2s after Shutdown", open.Load())
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
}
