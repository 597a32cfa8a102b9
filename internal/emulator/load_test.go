package emulator

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/server"
)

// TestLoadManyStreams drives several engines with many concurrent
// streaming clients in one process and checks that the emulator keeps up
// with its clock: every request completes and the driver delivers steps
// late by little on average. It is a measurement harness, off by default:
//
//	KVROUTE_LOAD=1 go test -run LoadManyStreams -cpuprofile /tmp/load.prof ./internal/emulator
//	go tool pprof -tags /tmp/load.prof   # CPU by component label
//
// KVROUTE_LOAD_ENGINES, _STREAMS and _SECONDS change the shape (8, 500, 10);
// KVROUTE_LOAD_ROUTER=POLICY puts a kvroute router (component=router)
// between the clients and the engines.
func TestLoadManyStreams(t *testing.T) {
	if os.Getenv("KVROUTE_LOAD") == "" {
		t.Skip("set KVROUTE_LOAD=1 to run the load harness")
	}
	engines, streams, secs := envInt("KVROUTE_LOAD_ENGINES", 8), envInt("KVROUTE_LOAD_STREAMS", 500), envInt("KVROUTE_LOAD_SECONDS", 10)
	p, err := engine.LookupPreset(testPreset)
	if err != nil {
		t.Fatal(err)
	}
	var urls []string
	var servers []*Server
	// Goroutines inherit profiler labels, so the driver, the listener and
	// every connection of the servers carry component=emulator.
	pprof.Do(t.Context(), pprof.Labels("component", "emulator"), func(ctx context.Context) {
		for range engines {
			r, err := Start(ctx, Config{Preset: p}, "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { r.Close() })
			urls = append(urls, r.URL)
			servers = append(servers, r.Server)
		}
	})

	targets := urls
	if policy := os.Getenv("KVROUTE_LOAD_ROUTER"); policy != "" {
		cc := config.Default()
		cc.Listen = "127.0.0.1:0"
		cc.Policy = policy
		cc.Upstream.DiscoverModels = false
		for i, u := range urls {
			cc.Backends = append(cc.Backends, config.Backend{URL: u, Name: fmt.Sprintf("engine-%d", i)})
		}
		if err := cc.Validate(); err != nil {
			t.Fatal(err)
		}
		rt, err := server.New(cc, nil)
		if err != nil {
			t.Fatal(err)
		}
		pprof.Do(t.Context(), pprof.Labels("component", "router"), func(context.Context) {
			if err := rt.Start(); err != nil {
				t.Fatal(err)
			}
		})
		t.Cleanup(func() { rt.Shutdown(context.Background()) })
		targets = []string{"http://" + rt.Addr()}
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: streams, MaxConnsPerHost: 0}}
	system := strings.Repeat("You are a helpful assistant with a long system prompt. ", 60)
	var done, failed, tokens atomic.Int64
	var ru0, ru1 syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	start := time.Now()
	deadline := start.Add(time.Duration(secs) * time.Second)
	var wg sync.WaitGroup
	pprof.Do(t.Context(), pprof.Labels("component", "client"), func(ctx context.Context) {
		for i := range streams {
			wg.Go(func() {
				for n := 0; time.Now().Before(deadline); n++ {
					body, _ := json.Marshal(map[string]any{
						"model": p.Model,
						"messages": []map[string]string{
							{"role": "system", "content": system},
							{"role": "user", "content": fmt.Sprintf("stream %d question %d: %s", i, n, strings.Repeat("words ", 100))},
						},
						"max_tokens": 128, "ignore_eos": true, "stream": true,
					})
					got, err := streamOnce(ctx, client, targets[(i+n)%len(targets)], body)
					if err != nil {
						failed.Add(1)
						t.Logf("stream %d: %v", i, err)
						return
					}
					tokens.Add(int64(got))
					done.Add(1)
				}
			})
		}
		wg.Wait()
	})
	wall := time.Since(start)
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	cpu := time.Duration(ru1.Utime.Nano()+ru1.Stime.Nano()-ru0.Utime.Nano()-ru0.Stime.Nano()) * time.Nanosecond
	t.Logf("%d engines, %d streams, %v: %d requests, %d failed, %.0f tokens/s, process CPU %.2f cores",
		engines, streams, wall.Round(time.Millisecond), done.Load(), failed.Load(), float64(tokens.Load())/wall.Seconds(), cpu.Seconds()/wall.Seconds())
	var steps int64
	var lag, slip, busy time.Duration
	for i, s := range servers {
		d := s.Driver()
		st := s.Stats()
		t.Logf("engine %d: %d steps, delivered late by %v on average, %v at worst; clock slip %v over %v busy",
			i, d.Steps, d.MeanLate, d.WorstLate, d.Slip, st.BusyTime)
		steps += d.Steps
		lag += time.Duration(d.Steps) * d.MeanLate
		slip += d.Slip
		busy += st.BusyTime
	}
	t.Logf("all engines: clock slip %.2f%% of busy time", 100*slip.Seconds()/busy.Seconds())
	if failed.Load() > 0 || done.Load() == 0 {
		t.Errorf("%d requests failed, %d completed", failed.Load(), done.Load())
	}
	if steps > 0 {
		if mean := lag / time.Duration(steps); mean > 2*time.Millisecond {
			t.Errorf("driver late by %v per step on average: the emulator does not keep up", mean)
		}
	}
}

// streamOnce sends one streaming request and counts its token chunks.
func streamOnce(ctx context.Context, c *http.Client, url string, body []byte) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("status %d", resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	n := 0
	for sc.Scan() {
		line := sc.Bytes()
		if bytes.HasPrefix(line, []byte("data: [DONE]")) {
			return n, nil
		}
		if bytes.Contains(line, []byte(`"content":" `)) {
			n++
		}
	}
	return n, fmt.Errorf("stream ended without [DONE] after %d tokens: %v", n, sc.Err())
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}
