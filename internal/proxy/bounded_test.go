package proxy

import (
	"bufio"
	"bytes"
	"runtime"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/admin"
	"github.com/kvroute/kvroute/internal/config"
)

// liveHeap is the heap in use after two collections.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// A client's model name is kept in the decision log only in part: 40
// requests with a 16 MB model (each a 404) left 683 MB of live heap in
// /admin/decisions. Here 8 requests with a 4 MB model must leave less
// than one such model behind, and no metric label longer than the log's
// bound.
func TestDecisionLogBoundedInBytes(t *testing.T) {
	r := newRig(t, "kvroute", 1, func(c *config.Config) {
		for i := range c.Backends {
			c.Backends[i].Models = []string{"shared"}
		}
	})
	const modelBytes, requests = 4 << 20, 8
	before := liveHeap()
	for i := range requests {
		model := strings.Repeat(string(rune('a'+i)), modelBytes)
		if res := r.post("/v1/chat/completions", `{"model":"`+model+`","messages":[{"role":"user","content":"hi"}]}`); res.status != 404 {
			t.Fatalf("request %d: status %d, want 404", i, res.status)
		}
	}
	grown := int64(liveHeap()) - int64(before)
	t.Logf("%d requests with a %d-byte model: live heap grew by %d bytes", requests, modelBytes, grown)
	if grown > modelBytes {
		t.Errorf("live heap grew by %d bytes after %d requests with a %d-byte model: the log keeps client strings", grown, requests, modelBytes)
	}
	d := r.srv.decisions.Last(requests)
	if len(d) != requests {
		t.Fatalf("%d decisions logged, want %d", len(d), requests)
	}
	for _, dec := range d {
		if len(dec.Model) > admin.ModelShown+len("…") {
			t.Fatalf("a decision keeps a %d-byte model", len(dec.Model))
		}
	}
	// Every label value of the metrics is the router's own, and short.
	res := r.get("/metrics")
	sc := bufio.NewScanner(bytes.NewReader(res.body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if i := strings.IndexByte(line, '{'); i >= 0 && len(line)-i > admin.ModelShown+64 {
			t.Errorf("metric with %d bytes of labels: %.120s…", len(line)-i, line)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
}
