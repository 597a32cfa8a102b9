package proxy

import (
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/config"
)

// BenchmarkProxyHop measures the latency the router adds: each iteration
// sends the same small non-streaming chat request once directly to a fake
// backend and once through the router, over keep-alive loopback
// connections, and reports the difference of the medians.
func BenchmarkProxyHop(b *testing.B) {
	for _, pol := range []string{"round-robin", "kvroute"} {
		b.Run(pol, func(b *testing.B) {
			f := newFakeB(b)
			cfg := config.Default()
			cfg.Listen = "127.0.0.1:0"
			cfg.Policy = pol
			cfg.Backends = []config.Backend{{URL: f.srv.URL, Name: f.name}}
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
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
			body := chat("shared", false, "Say hello in one short sentence, please.")
			do := func(url string) time.Duration {
				start := time.Now()
				resp, err := client.Post(url, "application/json", strings.NewReader(body))
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					b.Fatalf("status %d", resp.StatusCode)
				}
				return time.Since(start)
			}
			direct := f.srv.URL + "/v1/chat/completions"
			routed := "http://" + srv.Addr() + "/v1/chat/completions"
			do(direct)
			do(routed)
			var dd, rd []time.Duration
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				dd = append(dd, do(direct))
				rd = append(rd, do(routed))
			}
			b.StopTimer()
			slices.Sort(dd)
			slices.Sort(rd)
			p50 := func(d []time.Duration) float64 { return float64(d[len(d)/2].Nanoseconds()) / 1e3 }
			b.ReportMetric(p50(dd), "direct-p50-µs")
			b.ReportMetric(p50(rd), "routed-p50-µs")
			b.ReportMetric(p50(rd)-p50(dd), "added-p50-µs")
		})
	}
}

// newFakeB is newFake for benchmarks: a fake backend with no prefill delay.
func newFakeB(b *testing.B) *fake {
	b.Helper()
	f := newFake(b, "bench")
	f.prefillRate = 0
	return f
}
