package proxy

import (
	"context"
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

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

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
//
// "kvroute+tracing" is the kvroute policy with tracing on, every request
// sampled, its spans batched to an exporter that drops them: the cost of
// the spans themselves.
func BenchmarkProxyHop(b *testing.B) {
	for _, pol := range []string{"round-robin", "kvroute", "kvroute+tracing"} {
		for _, size := range []int{4 << 10, 200 << 10} {
			for _, clients := range []int{1, 16} {
				b.Run(fmt.Sprintf("%s/%dKB/clients=%d", pol, size>>10, clients), func(b *testing.B) {
					benchHop(b, pol, size, clients)
				})
			}
		}
	}
}

// dropExporter is a span exporter that drops every span.
type dropExporter struct{}

func (dropExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (dropExporter) Shutdown(context.Context) error                             { return nil }

// benchRouter starts a router with the named policy over the one backend
// at backendURL, serving model, with engine scraping off (the benchmarks'
// backends have no metrics) and, with tracing, every request traced and
// its spans dropped by the exporter. It returns the router's base URL and
// shuts it down when the benchmark ends.
func benchRouter(b *testing.B, backendURL, model, pol string, tracing bool) string {
	b.Helper()
	cfg := config.Default()
	cfg.Listen = "127.0.0.1:0"
	cfg.Policy = pol
	cfg.Backends = []config.Backend{{URL: backendURL, Name: "bench", Models: []string{model}}}
	cfg.Health.Interval = time.Hour
	cfg.Engines.Enabled = false
	cfg.Tracing.Enabled = tracing
	if err := cfg.Validate(); err != nil {
		b.Fatal(err)
	}
	old := newTraceExporter
	newTraceExporter = func(context.Context, config.Tracing) (sdktrace.SpanExporter, error) { return dropExporter{}, nil }
	defer func() { newTraceExporter = old }()
	srv, err := newRouter(cfg, nil)
	if err != nil {
		b.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	return "http://" + srv.Addr()
}

func benchHop(b *testing.B, pol string, size, clients int) {
	backend := newStaticB(b)
	body := hopBody("bench-model", size)
	pol, tracing := strings.CutSuffix(pol, "+tracing")
	router := benchRouter(b, backend.URL, "bench-model", pol, tracing)
	measureHop(b, backend.URL+"/v1/chat/completions", router+"/v1/chat/completions", body, clients)
}

// measureHop has clients each alternate a request of body to direct and
// one to routed, b.N pairs in all, and reports the medians of both and
// their difference.
func measureHop(b *testing.B, direct, routed, body string, clients int) {
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

// BenchmarkRelaySSE measures what relaying an event stream costs per
// event: a backend streams 500 chat chunks as fast as it can, once
// directly to the client and once through the router, and the benchmark
// reports the time per event of each and their difference. The router's
// work per event is one read from the backend, one write and one flush to
// the client.
func BenchmarkRelaySSE(b *testing.B) {
	const events = 500
	chunk := `data: {"id":"c-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" token"},"finish_reason":null}]}` + "\n\n"
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		for range events {
			_, _ = io.WriteString(w, chunk)
			f.Flush()
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}))
	defer backend.Close()
	router := benchRouter(b, backend.URL, "m", "kvroute", false)
	client := &http.Client{}
	body := chat("m", true, "stream")
	stream := func(url string) time.Duration {
		start := time.Now()
		resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		n, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if want := int64(events*len(chunk) + len("data: [DONE]\n\n")); n != want {
			b.Fatalf("%s: %d bytes, want %d", url, n, want)
		}
		return time.Since(start)
	}
	var direct, routed time.Duration
	b.ReportAllocs()
	for b.Loop() {
		direct += stream(backend.URL)
		routed += stream(router)
	}
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(b.N*events) }
	b.ReportMetric(per(direct), "direct-ns/event")
	b.ReportMetric(per(routed), "routed-ns/event")
	b.ReportMetric(per(routed)-per(direct), "added-ns/event")
}

// BenchmarkTracingCost puts two routers over one backend, one with tracing
// on (every request sampled, spans batched to an exporter that drops them)
// and one with it off, and has 16 clients alternate requests between them,
// so that both see the same machine at the same moment. It reports each
// router's mean request time and the ratio: with 16 clients saturating the
// router, the ratio of mean times is the inverse ratio of throughputs.
func BenchmarkTracingCost(b *testing.B) {
	for _, size := range []int{4 << 10, 200 << 10} {
		b.Run(fmt.Sprintf("%dKB", size>>10), func(b *testing.B) {
			backend := newStaticB(b)
			body := hopBody("bench-model", size)
			path := "/v1/chat/completions"
			off := benchRouter(b, backend.URL, "bench-model", "kvroute", false) + path
			on := benchRouter(b, backend.URL, "bench-model", "kvroute", true) + path
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 32}}
			defer client.CloseIdleConnections()
			do := func(url string) time.Duration {
				t0 := time.Now()
				resp, err := client.Post(url, "application/json", strings.NewReader(body))
				if err != nil {
					b.Error(err)
					return 0
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				return time.Since(t0)
			}
			do(off)
			do(on)
			var offSum, onSum atomic.Int64
			var next atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			for c := range 16 {
				wg.Go(func() {
					for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
						// Alternate which goes first, so neither always
						// meets a warmer connection.
						if (i+int64(c))%2 == 0 {
							offSum.Add(int64(do(off)))
							onSum.Add(int64(do(on)))
						} else {
							onSum.Add(int64(do(on)))
							offSum.Add(int64(do(off)))
						}
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			b.ReportMetric(float64(offSum.Load())/float64(b.N)/1e3, "off-µs")
			b.ReportMetric(float64(onSum.Load())/float64(b.N)/1e3, "on-µs")
			b.ReportMetric(float64(onSum.Load())/float64(offSum.Load()), "on/off")
		})
	}
}
