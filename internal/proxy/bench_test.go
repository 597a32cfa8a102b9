package proxy

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/config"
)

// BenchmarkProxyHop measures the latency the router adds to non-streaming
// chat requests over keep-alive loopback connections, with a 4 KB chat body
// and a 200 KB one (an agent's long context), with one client and with 16
// at once (the load of scripts/overhead.sh's wrk). Each client alternates
// one request directly to a backend that only reads the body and answers,
// and one through the router to it. It reports the medians of both and
// their difference; with 16 clients on a small machine the difference is
// mostly the router's CPU time per request, queued. allocs/op count
// everything in the process for one direct and one routed request (client,
// router and backend).
func BenchmarkProxyHop(b *testing.B) {
	for _, pol := range []string{"round-robin", "kvroute"} {
		for _, size := range []int{4 << 10, 200 << 10} {
			for _, clients := range []int{1, 16} {
				b.Run(fmt.Sprintf("%s/%dKB/clients=%d", pol, size>>10, clients), func(b *testing.B) {
					benchHop(b, pol, size, clients)
				})
			}
		}
	}
}

func benchHop(b *testing.B, pol string, size, clients int) {
	backend := newStaticB(b)
	body := hopBody("bench-model", size)
	cfg := config.Default()
	cfg.Listen = "127.0.0.1:0"
	cfg.Policy = pol
	cfg.Backends = []config.Backend{{URL: backend.URL, Name: "bench", Models: []string{"bench-model"}}}
	cfg.Health.Interval = time.Hour
	if err := cfg.Validate(); err != nil {
		b.Fatal(err)
	}
	srv, err := New(cfg, nil)
	if err != nil {
		b.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		b.Fatal(err)
	}
	defer srv.Shutdown(b.Context())
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
	defer client.CloseIdleConnections()
	do := func(url string) (time.Duration, error) {
		start := time.Now()
		resp, err := client.Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			return 0, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return 0, fmt.Errorf("%s: status %d", url, resp.StatusCode)
		}
		return time.Since(start), nil
	}
	direct := backend.URL + "/v1/chat/completions"
	routed := "http://" + srv.Addr() + "/v1/chat/completions"
	for _, u := range []string{direct, routed} {
		if _, err := do(u); err != nil {
			b.Fatal(err)
		}
	}
	var (
		mu       sync.Mutex
		dd, rd   []time.Duration
		firstErr error
		next     atomic.Int64
		wg       sync.WaitGroup
	)
	b.ReportAllocs()
	b.ResetTimer()
	for range clients {
		wg.Go(func() {
			var d, r []time.Duration
			var err error
			for err == nil && next.Add(1) <= int64(b.N) {
				var dt, rt time.Duration
				if dt, err = do(direct); err == nil {
					rt, err = do(routed)
				}
				d, r = append(d, dt), append(r, rt)
			}
			mu.Lock()
			defer mu.Unlock()
			dd, rd = append(dd, d...), append(rd, r...)
			firstErr = errors.Join(firstErr, err)
		})
	}
	wg.Wait()
	b.StopTimer()
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	slices.Sort(dd)
	slices.Sort(rd)
	p50 := func(d []time.Duration) float64 { return float64(d[len(d)/2].Nanoseconds()) / 1e3 }
	b.ReportMetric(p50(dd), "direct-p50-µs")
	b.ReportMetric(p50(rd), "routed-p50-µs")
	b.ReportMetric(p50(rd)-p50(dd), "added-p50-µs")
}

// hopBody is a non-streaming chat body of about size bytes: a conversation
// whose turns grow with the size (7 for 4 KB, 32 of about 6 KB for 200 KB).
func hopBody(model string, size int) string {
	n := 7 + size/8192
	msgs := make([]string, n)
	for i := range msgs {
		msgs[i] = words(fmt.Sprintf("turn%d", i), (size-200)/n-30)
	}
	return chat(model, false, msgs...)
}

// newStaticB is the benchmark's backend: it reads each body and answers
// the fake's fixed completion, and does nothing else (the fake parses
// every body, which at 200 KB would cost more than the hop measured).
func newStaticB(b *testing.B) *httptest.Server {
	b.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/v1/chat/completions" {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, jsonAnswer("bench"))
		}
	}))
	b.Cleanup(srv.Close)
	return srv
}
