package proxy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/config"
)

// kvJSON is m in JSON.
func kvJSON(m map[string]any) []byte {
	b, _ := json.Marshal(m)
	return b
}

// TestSplitMemoryProbe measures the memory of KVROUTE_SPLIT_PROBE split
// streams in flight at once, each with a prefill answer of about 900 KB
// (docs/reliability.md, "Smaller findings"): the heap in use and the RSS
// of the test process with every decode leg held open, and what the
// budget of buffered bodies (kvroute_buffered_body_bytes) reads then.
// KVROUTE_SPLIT_PROBE_BUDGET sets limits.max_buffered_bytes (MiB).
// Skipped unless set.
func TestSplitMemoryProbe(t *testing.T) {
	var n, budget int
	_, _ = fmt.Sscan(os.Getenv("KVROUTE_SPLIT_PROBE"), &n)
	if n <= 0 {
		t.Skip("set KVROUTE_SPLIT_PROBE to the number of streams")
	}
	_, _ = fmt.Sscan(os.Getenv("KVROUTE_SPLIT_PROBE_BUDGET"), &budget)
	r, pre, dec := pdRig(t, 1, 1, func(c *config.Config) {
		c.Health.Path = ""
		if budget > 0 {
			c.Limits.MaxBodyBytes = 1 << 20
			c.Limits.MaxBufferedBytes = config.ByteSize(budget << 20)
		}
	})
	r.client.Timeout = 0 // the decode legs are held until measured
	big := kvParams("p0")
	ids := make([]any, 128_000) // about 900 KB of JSON
	for i := range ids {
		ids[i] = float64(100_000 + i)
	}
	big["remote_block_ids"] = ids
	pre[0].kv.Store(&big)
	arrived, release := make(chan struct{}, n), make(chan struct{})
	hold := func(req *http.Request) {
		if req.URL.Path == "/v1/chat/completions" {
			arrived <- struct{}{}
			<-release
		}
	}
	dec[0].seen.Store(&hold)

	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	heap0, rss0 := float64(ms.HeapInuse)/1e6, rssMB()
	done := make(chan result, n)
	for range n {
		go func() { done <- r.post("/v1/chat/completions", clientBody) }()
	}
	for i := range n {
		select {
		case <-arrived:
		case <-time.After(time.Minute):
			close(release)
			t.Fatalf("%d of %d decode legs arrived", i, n)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&ms)
	heap1, rss1 := float64(ms.HeapInuse)/1e6, rssMB()
	held := metricValue(string(r.get("/metrics").body), "kvroute_buffered_body_bytes")
	close(release)
	for range n {
		<-done
	}
	page := string(r.get("/metrics").body)
	var outcomes []string
	for line := range strings.SplitSeq(page, "\n") {
		if o, ok := strings.CutPrefix(line, `kvroute_pd_requests_total{model="m",outcome=`); ok {
			outcomes = append(outcomes, o)
		}
	}
	t.Logf("%d split streams, prefill answers %d KB each, budget %d MiB: heap in use %.0f -> %.0f MB (+%.0f), RSS %.0f -> %.0f MB (+%.0f), buffered body bytes %.1f MB; outcomes %v",
		n, len(kvJSON(big))/1000, budget, heap0, heap1, heap1-heap0, rss0, rss1, rss1-rss0, held/1e6, outcomes)
}
