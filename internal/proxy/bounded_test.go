package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/admin"
	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/racetest"
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
	racetest.Heavy(t, "eight 4 MiB bodies through the router, timed by the detector twentyfold")
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

// Prompts the engine refuses leave nothing in the tokenizer cache: 60
// distinct 1 MB prompts an engine refused left 77 MB after GC. Here 24
// distinct prompts of 64K tokens (256 KB of ids each), all refused with
// 400, must leave the cache empty and the live heap less than a third of
// their ids (what does grow is bounded elsewhere: the precise index's
// speculative keys, 8 bytes a block of 16 tokens, and the approximate
// index, capped here at 1,024 blocks), and a refused prompt sent again is
// tokenized again.
func TestRefusedPromptsNotCached(t *testing.T) {
	racetest.Heavy(t, "48 prompts of 256 KiB tokenized and refused, timed by the detector tenfold")
	tk := newTokenizer(t)
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/v1/") {
			openai.WriteError(w, http.StatusBadRequest, openai.TypeInvalidRequest, "context_length_exceeded", "too long", 0)
		}
	}))
	t.Cleanup(refusing.Close)
	r := newRig(t, "kvroute", 1, func(c *config.Config) {
		c.Backends[0].URL = refusing.URL
		c.Backends[0].Models = []string{"shared"}
		c.Backends[0].KVEvents = "tcp://127.0.0.1:1" // not followed: only the tokenizer matters
		c.KVEvents.Tokenizer = tk.srv.URL
		// The approximate index's own bounded growth (about 112 bytes a
		// block) kept small, so that the heap shows the tokenizer's.
		c.Prefix.CapacityBlocks = 1024
	})
	r.waitReady(http.StatusOK)
	// Cached, the refused prompts' ids would hold prompts*promptBytes
	// bytes (a 4-byte id per 4-byte word). The live heap's noise under
	// the race detector on a loaded machine reached 4.4 MB over such a
	// run, whatever the prompts, so the signal is made three times that.
	const prompts, promptBytes = 48, 256 << 10 // 64K tokens of 4 bytes
	prompt := func(i int) string { return words(fmt.Sprintf("refused-%d", i), promptBytes) }
	body := func(i int) string {
		return `{"model":"shared","messages":[{"role":"user","content":"` + prompt(i) + `"}]}`
	}
	before := liveHeap()
	for i := range prompts {
		if res := r.post("/v1/chat/completions", body(i)); res.status != http.StatusBadRequest {
			t.Fatalf("prompt %d: status %d, want the engine's 400", i, res.status)
		}
	}
	grown := int64(liveHeap()) - int64(before)
	t.Logf("%d refused prompts of %d bytes: live heap grew by %d bytes", prompts, promptBytes, grown)
	if grown > prompts*promptBytes*3/4 {
		t.Errorf("live heap grew by %d bytes after %d refused prompts of %d bytes: their token ids were cached", grown, prompts, promptBytes)
	}
	if b := r.srv.precise.CachedBytes(); b != 0 {
		t.Errorf("the tokenizer cache holds %d bytes of refused prompts", b)
	}
	calls := tk.calls.Load()
	r.post("/v1/chat/completions", body(0))
	if tk.calls.Load() != calls+1 {
		t.Errorf("a refused prompt sent again was not tokenized again: its ids were cached")
	}
}
