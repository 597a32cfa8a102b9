package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/kvroute/kvroute/internal/admin"
	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/disagg"
)

// metricValue is the value of the series named series (name and labels,
// exactly as exposed) in a /metrics page, -1 when absent.
func metricValue(page, series string) float64 {
	for line := range strings.SplitSeq(page, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}

// TestPDMetrics: a split streaming request is counted as split, with its
// prefill leg's time on its prefill engine and its transfer wait and
// decode TTFT on its decode engine; a request whose prefill leg failed on
// every attempt is counted as served whole after it, with no leg timing.
func TestPDMetrics(t *testing.T) {
	r, pre, _ := pdRig(t, 1, 1, func(c *config.Config) { c.Retry.Attempts = 1 })
	if res := r.post("/v1/chat/completions", clientBody); res.status != 200 {
		t.Fatalf("status %d", res.status)
	}
	page := string(r.get("/metrics").body)
	for _, s := range []string{
		`kvroute_pd_requests_total{model="m",outcome="split"}`,
		`kvroute_pd_prefill_seconds_count{backend="p0",model="m"}`,
		`kvroute_pd_transfer_wait_seconds_count{backend="d0",model="m"}`,
		`kvroute_pd_decode_ttft_seconds_count{backend="d0",model="m"}`,
	} {
		if v := metricValue(page, s); v != 1 {
			t.Errorf("%s = %v, want 1", s, v)
		}
	}
	// The legs' timings add up as the router saw them: the request's TTFT
	// covers the prefill leg and the decode leg's TTFT.
	sum := func(name string) float64 { return metricValue(page, name) }
	if p, d, ttft := sum(`kvroute_pd_prefill_seconds_sum{backend="p0",model="m"}`), sum(`kvroute_pd_decode_ttft_seconds_sum{backend="d0",model="m"}`),
		sum(`kvroute_ttft_seconds_sum{backend="d0",model="m"}`); p <= 0 || d <= 0 || p+d > ttft {
		t.Errorf("prefill %v s + decode TTFT %v s against the request's TTFT %v s: want both positive, within it", p, d, ttft)
	}
	// Under vllm the decode leg is sent once the prefill leg ended: its
	// transfer wait is its TTFT and the router's step between the legs.
	if w, d := sum(`kvroute_pd_transfer_wait_seconds_sum{backend="d0",model="m"}`), sum(`kvroute_pd_decode_ttft_seconds_sum{backend="d0",model="m"}`); w < d {
		t.Errorf("transfer wait %v s, decode TTFT %v s: want the wait to cover the decode leg's TTFT", w, d)
	}

	pre[0].fail.Store(1)
	if res := r.post("/v1/chat/completions", clientBody); res.status != 200 {
		t.Fatalf("status %d after the prefill failed: want the decode engine's answer", res.status)
	}
	page = string(r.get("/metrics").body)
	if v := metricValue(page, `kvroute_pd_requests_total{model="m",outcome="prefill_failed"}`); v != 1 {
		t.Errorf("prefill_failed = %v, want 1", v)
	}
	if v := metricValue(page, `kvroute_pd_prefill_seconds_count{backend="p0",model="m"}`); v != 1 {
		t.Errorf("prefill legs timed %v, want still 1 (a failed leg is not timed)", v)
	}
}

// TestPDPrefillLoadReleased: a prefill engine's load ticket is released
// when its leg's answer is read, not when the decode leg's stream ends:
// while the decode engine streams, the prefill engine has nothing in
// flight, and both engines' breakers hear of their own leg.
func TestPDPrefillLoadReleased(t *testing.T) {
	var rig *rig
	var during atomic.Int64
	during.Store(-1)
	r, pre, dec := pdRig(t, 1, 1, nil)
	rig = r
	seen := func(req *http.Request) {
		if req.URL.Path == "/v1/chat/completions" {
			for _, b := range rig.srv.Fleet().Snapshot().All {
				if b.Name == "p0" {
					during.Store(int64(b.Load().InFlight))
				}
			}
		}
	}
	dec[0].seen.Store(&seen)
	if res := r.post("/v1/chat/completions", clientBody); res.status != 200 {
		t.Fatalf("status %d", res.status)
	}
	if len(pre[0].legs()) != 1 {
		t.Fatalf("prefill legs %d, want 1", len(pre[0].legs()))
	}
	if v := during.Load(); v != 0 {
		t.Errorf("p0 had %d requests in flight while d0 decoded: want its leg released once answered", v)
	}
	set := r.srv.root.Members()
	for _, b := range r.srv.Fleet().Snapshot().All {
		if st := set.Of(b).Breaker(); st.Fails != 0 || st.Open {
			t.Errorf("%s's breaker %+v after a served request", b.Name, st)
		}
	}
}

// TestPDDecisionLegs: /admin/decisions shows each leg of a split request
// (role, engine, the scheduler's reason, attempts), and for a request
// whose prefill leg failed, why it was skipped and that the decode engine
// served it whole; the reason header says the same.
func TestPDDecisionLegs(t *testing.T) {
	r, pre, _ := pdRig(t, 1, 1, func(c *config.Config) { c.Retry.Attempts = 1 })
	r.post("/v1/chat/completions", clientBody)
	pre[0].fail.Store(2)
	res := r.post("/v1/chat/completions", clientBody)
	if res.status != 200 {
		t.Fatalf("status %d", res.status)
	}
	if h := res.header.Get(headerReason); !strings.HasPrefix(h, "prefill skipped after failing on p0; decode d0 (whole): ") {
		t.Errorf("reason %q: want the prefill skipped and d0 serving whole", h)
	}
	status, body := r.adminCall(http.MethodGet, "/admin/decisions", "pd-admin-token-for-tests")
	var log struct{ Decisions []admin.Decision }
	if status != 200 || json.Unmarshal(body, &log) != nil || len(log.Decisions) != 2 {
		t.Fatalf("GET /admin/decisions: %d %s", status, body)
	}
	fell, split := log.Decisions[0], log.Decisions[1]
	if len(split.Legs) != 2 || len(fell.Legs) != 2 {
		t.Fatalf("legs %+v and %+v: want two each", split.Legs, fell.Legs)
	}
	for i, want := range []admin.Leg{{Role: "prefill", Backend: "p0", Attempts: 1}, {Role: "decode", Backend: "d0", Attempts: 1}} {
		got := split.Legs[i]
		if got.Reason == "" || !strings.Contains(split.Reason, got.Reason) {
			t.Errorf("leg %d reason %q: want the scheduler's, as in %q", i, got.Reason, split.Reason)
		}
		got.Reason = ""
		if !reflect.DeepEqual(got, want) {
			t.Errorf("split leg %d %+v, want %+v", i, got, want)
		}
	}
	if l := fell.Legs[0]; l.Skipped != "failed on p0" || l.Reason != "" {
		t.Errorf("failed prefill leg %+v: want skipped, failed on p0", l)
	}
	if l := fell.Legs[1]; !l.Whole || l.Backend != "d0" {
		t.Errorf("decode leg %+v: want d0 serving whole", l)
	}
}

// TestPDTraces: each leg of a split request is a span named for its role,
// a child of the request's, with its engine, role and attempts; the
// upstream attempts are children of their leg's span, a retried prefill
// leg's two attempts both under it.
func TestPDTraces(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	old := newTraceExporter
	newTraceExporter = func(context.Context, config.Tracing) (sdktrace.SpanExporter, error) { return exp, nil }
	t.Cleanup(func() { newTraceExporter = old })
	r, pre, _ := pdRig(t, 2, 1, func(c *config.Config) { c.Tracing.Enabled = true })
	pre[0].fail.Store(1)
	postUntil(t, r, pre[0], func(res result) {
		if res.status != 200 {
			t.Fatalf("status %d", res.status)
		}
	})
	// The request's span ends once its handler returned, which may be
	// just after the client read the last byte.
	var spans []tracetest.SpanStub
	for start := time.Now(); ; time.Sleep(5 * time.Millisecond) {
		if err := r.srv.tracing.tp.ForceFlush(context.Background()); err != nil {
			t.Fatal(err)
		}
		spans = exp.GetSpans()
		roots := 0
		for _, s := range spans {
			if s.Name == "chat m" {
				roots++
			}
		}
		if roots == len(pre[0].legs())+len(pre[1].legs())-1 || time.Since(start) > 10*time.Second {
			break
		}
	}
	attrs := func(s tracetest.SpanStub) map[string]string {
		m := map[string]string{}
		for _, kv := range s.Attributes {
			m[string(kv.Key)] = kv.Value.String()
		}
		return m
	}
	// The last request: the one whose prefill leg met p0.
	var root tracetest.SpanStub
	for _, s := range spans {
		if s.Name == "chat m" {
			root = s
		}
	}
	legs := map[string]tracetest.SpanStub{}
	for _, s := range spans {
		if s.Parent.SpanID() == root.SpanContext.SpanID() && (s.Name == "prefill" || s.Name == "decode") {
			legs[s.Name] = s
		}
	}
	p, d := legs["prefill"], legs["decode"]
	if a := attrs(p); a["kvroute.leg.role"] != "prefill" || a["kvroute.backend"] != "p1" || a["kvroute.attempts"] != "2" {
		t.Errorf("prefill leg span %v: want p1 after 2 attempts", a)
	}
	if a := attrs(d); a["kvroute.leg.role"] != "decode" || a["kvroute.backend"] != "d0" || a["kvroute.attempts"] != "1" {
		t.Errorf("decode leg span %v: want d0, 1 attempt", a)
	}
	under := map[string]int{}
	for _, s := range spans {
		if s.Name != "POST" {
			continue
		}
		switch s.Parent.SpanID() {
		case p.SpanContext.SpanID():
			under["prefill"]++
		case d.SpanContext.SpanID():
			under["decode"]++
		}
	}
	if under["prefill"] != 2 || under["decode"] != 1 {
		t.Errorf("attempt spans under the legs %v: want 2 under prefill, 1 under decode", under)
	}
}

// TestVLLMDataParallel: a prefill engine run with data parallelism names
// its rank in its answer (NixlConnector: remote_engine_id of the rank's
// engine, remote_port its side channel, VLLM_NIXL_SIDE_CHANNEL_PORT plus
// the rank, remote_request_id): the decode leg carries those fields
// verbatim, so that the decode engine pulls from that rank whichever of
// its own ranks serves it, and the router adds no rank header to either
// leg. Its side channel is on another interface than its URL's, which
// disaggregation.transfer_hosts allows.
func TestVLLMDataParallel(t *testing.T) {
	r, pre, dec := pdRig(t, 1, 1, func(c *config.Config) { c.Disaggregation.TransferHosts = []string{"10.0.0.9"} })
	kv := map[string]any{"do_remote_prefill": true, "do_remote_decode": false, "remote_block_ids": []any{7.0, 8.0},
		"remote_engine_id": "engine-p0_dp3", "remote_request_id": "cmpl-req-dp-0", "remote_host": "10.0.0.9", "remote_port": 5603.0, "tp_size": 2.0}
	pre[0].kv.Store(&kv)
	if res := r.post("/v1/chat/completions", clientBody, "X-Request-Id", "req-dp"); res.status != 200 {
		t.Fatalf("status %d", res.status)
	}
	d := dec[0].legs()
	if len(d) != 1 || !reflect.DeepEqual(d[0].body["kv_transfer_params"], kv) {
		t.Fatalf("decode leg's kv_transfer_params %v, want the rank's %v", d[0].body["kv_transfer_params"], kv)
	}
	for k := range d[0].header {
		if strings.EqualFold(k, "X-Data-Parallel-Rank") {
			t.Errorf("decode leg carries %s: the decode engine picks its own rank", k)
		}
	}
}

// sgKV is what an SGLang pair of fake engines shares: the bootstrap rooms
// a prefill engine has computed (the decode engine of the room can pull
// its KV cache).
type sgKV struct {
	mu    sync.Mutex
	rooms map[string]chan struct{}
}

func (k *sgKV) room(id string) chan struct{} {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.rooms == nil {
		k.rooms = map[string]chan struct{}{}
	}
	if k.rooms[id] == nil {
		k.rooms[id] = make(chan struct{})
	}
	return k.rooms[id]
}

// sgPairEngines are SGLang prefill engines p0.. and one decode engine d0
// sharing kv: the first fails prefill requests answer 500 (or, with
// hangup, close the connection); the others make their room's KV cache
// ready and answer. The decode engine waits for its room's KV cache, its
// client leaving (outcome "cancelled") or 5 s (outcome "timeout", a 500:
// SGLang's decode engine gives up after its own bootstrap timeout).
type sgPairEngines struct {
	kv     sgKV
	fails  atomic.Int32
	hangup bool
	pre    []*httptest.Server
	dec    *httptest.Server
	// decFails: the first decFails decode requests answer 500 at once
	// (on a second decode engine dec1, when there is one).
	decFails atomic.Int32
	dec1     *httptest.Server
	mu       sync.Mutex
	preRooms []string
	decRooms []string
	outcomes chan string
}

func newSGPair(t *testing.T, prefill int, fails int32, hangup bool, decFails int32) *sgPairEngines {
	e := &sgPairEngines{hangup: hangup, outcomes: make(chan string, 16)}
	e.fails.Store(fails)
	roomOf := func(r *http.Request) string {
		var b struct {
			Room json.Number `json:"bootstrap_room"`
		}
		_ = json.NewDecoder(r.Body).Decode(&b)
		return b.Room.String()
	}
	for range prefill {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !completionOnly(w, r) {
				return
			}
			room := roomOf(r)
			e.mu.Lock()
			e.preRooms = append(e.preRooms, room)
			e.mu.Unlock()
			if e.fails.Add(-1) >= 0 {
				if e.hangup {
					if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
						_ = conn.Close()
					}
					return
				}
				http.Error(w, `{"error":{"message":"prefill engine failed"}}`, http.StatusInternalServerError)
				return
			}
			close(e.kv.room(room))
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, jsonAnswer("p"))
		}))
		t.Cleanup(s.Close)
		e.pre = append(e.pre, s)
	}
	decode := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !completionOnly(w, r) {
			return
		}
		room := roomOf(r)
		e.mu.Lock()
		e.decRooms = append(e.decRooms, room)
		e.mu.Unlock()
		if e.decFails.Add(-1) >= 0 {
			e.outcomes <- "failed"
			http.Error(w, `{"error":{"message":"decode engine failed"}}`, http.StatusInternalServerError)
			return
		}
		select {
		case <-e.kv.room(room):
		case <-r.Context().Done():
			e.outcomes <- "cancelled"
			return
		case <-time.After(5 * time.Second):
			e.outcomes <- "timeout"
			http.Error(w, `{"error":{"message":"bootstrap timeout"}}`, http.StatusInternalServerError)
			return
		}
		e.outcomes <- "served"
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range streamEvents("d0", 3) {
			_, _ = io.WriteString(w, ev)
		}
	})
	e.dec = httptest.NewServer(decode)
	t.Cleanup(e.dec.Close)
	if decFails > 0 {
		e.decFails.Store(decFails)
		e.dec1 = httptest.NewServer(decode)
		t.Cleanup(e.dec1.Close)
	}
	return e
}

// rooms are the bootstrap rooms the prefill and the decode engines got, in
// order.
func (e *sgPairEngines) rooms() (pre, dec []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.preRooms...), append([]string(nil), e.decRooms...)
}

// breakerFails is each backend's count of failures in its breaker.
func (r *rig) breakerFails() map[string]int {
	set := r.srv.root.Members()
	fails := map[string]int{}
	for _, b := range r.srv.Fleet().Snapshot().All {
		fails[b.Name] = set.Of(b).Breaker().Fails
	}
	return fails
}

// sgPairRig is a router over e's engines under protocol sglang, rooms
// drawn 1, 2, 3...
func sgPairRig(t *testing.T, e *sgPairEngines, attempts int) *rig {
	var n atomic.Uint64
	prev := disagg.SetRoom(func() uint64 { return n.Add(1) })
	t.Cleanup(func() { disagg.SetRoom(prev) })
	r := newRig(t, "kvroute", 0, func(c *config.Config) {
		c.Disaggregation = config.Disaggregation{Protocol: config.ProtocolSGLang, BootstrapPort: 9123, Split: config.SplitAlways}
		c.Retry.Attempts = attempts
		for i, s := range e.pre {
			c.Backends = append(c.Backends, config.Backend{URL: s.URL, Name: fmt.Sprintf("p%d", i), Models: []string{"m"}, Role: config.RolePrefill})
		}
		c.Backends = append(c.Backends, config.Backend{URL: e.dec.URL, Name: "d0", Models: []string{"m"}, Role: config.RoleDecode})
		if e.dec1 != nil {
			c.Backends = append(c.Backends, config.Backend{URL: e.dec1.URL, Name: "d1", Models: []string{"m"}, Role: config.RoleDecode})
		}
	})
	r.waitReady(http.StatusOK)
	return r
}

// TestSGLangPrefillFails: an SGLang prefill engine that fails (a 5xx)
// while its decode engine waits for the bootstrap does not leave the
// client waiting on the decode engine's own timeout: the decode leg's
// wait is ended at once and the pair sent again, as SGLang's router
// retries a pair, with another prefill engine and a new room; the client
// gets the decode engine's stream. The failing prefill engine's breaker
// hears of it, the decode engine's does not (it was not at fault).
func TestSGLangPrefillFails(t *testing.T) {
	e := newSGPair(t, 2, 1, false, 0)
	r := sgPairRig(t, e, 2)
	res := r.post("/v1/chat/completions", clientBody)
	if res.status != 200 || string(res.body) != strings.Join(streamEvents("d0", 3), "") {
		t.Fatalf("status %d, body %q: want d0's stream after the pair was sent again", res.status, res.body)
	}
	pr, dr := e.rooms()
	// The failed pair's decode leg may be cancelled before it reached
	// the engine; if it did reach it, the router ended its wait. Its
	// arrival may come after the second pair's on a loaded machine (both
	// legs are sent concurrently), so the decode rooms are a set: the
	// second pair's, and at most the first's beside it.
	if len(pr) != 2 || pr[0] == pr[1] || !slices.Contains(dr, pr[1]) || len(dr) > 2 || (len(dr) == 2 && !slices.Contains(dr, pr[0])) {
		t.Errorf("prefill rooms %v, decode rooms %v: want two pairs, each with one room, the second a new one", pr, dr)
	}
	for range dr {
		if o := <-e.outcomes; o == "timeout" {
			t.Errorf("a decode leg waited for its bootstrap until its own timeout: want it cancelled by the router")
		}
	}
	fails := r.breakerFails()
	if fails["d0"] != 0 || fails["p0"]+fails["p1"] != 1 {
		t.Errorf("breaker failures %v: want one on the failed prefill engine, none on d0", fails)
	}
	if h := res.header.Get(headerReason); !strings.Contains(h, " after 1 retry: ") || !strings.Contains(h, "; decode d0: ") {
		t.Errorf("reason %q: want the prefill leg's retry and the decode leg", h)
	}
}

// TestSGLangDecodeFails: an SGLang decode engine that fails before its
// first byte has the pair sent again, as SGLang's router does: the prefill
// attempt of the abandoned room is ended (unjudged: not its fault) and the
// prefill engine gets the request again with a new room, beside another
// decode engine; the failed decode engine's breaker hears of it.
func TestSGLangDecodeFails(t *testing.T) {
	e := newSGPair(t, 1, 0, false, 1)
	r := sgPairRig(t, e, 2)
	res := r.post("/v1/chat/completions", clientBody)
	if res.status != 200 || string(res.body) != strings.Join(streamEvents("d0", 3), "") {
		t.Fatalf("status %d, body %q: want the stream after the pair was sent again", res.status, res.body)
	}
	if o1, o2 := <-e.outcomes, <-e.outcomes; o1 != "failed" || o2 != "served" {
		t.Errorf("decode legs ended %q, %q: want failed, then served", o1, o2)
	}
	pr, dr := e.rooms()
	if len(dr) != 2 || dr[0] == dr[1] || len(pr) == 0 || pr[len(pr)-1] != dr[1] {
		t.Errorf("prefill rooms %v, decode rooms %v: want the pair sent again with a new room", pr, dr)
	}
	fails := r.breakerFails()
	if fails["p0"] != 0 || fails["d0"]+fails["d1"] != 1 {
		t.Errorf("breaker failures %v: want one on the failed decode engine, none on p0", fails)
	}
}

// TestSGLangPrefillDown: when every attempt's prefill engine is gone (its
// connection closed) the client gets a clean 502 at once, never a hang,
// and each decode leg waiting for its bootstrap is cancelled by the
// router rather than left to its timeout.
func TestSGLangPrefillDown(t *testing.T) {
	e := newSGPair(t, 1, 100, true, 0)
	r := sgPairRig(t, e, 1)
	res := r.post("/v1/chat/completions", clientBody)
	var oe struct {
		Error struct{ Code string } `json:"error"`
	}
	if res.status != http.StatusBadGateway || json.Unmarshal(res.body, &oe) != nil || oe.Error.Code != "backend_error" {
		t.Fatalf("status %d, body %s: want a clean 502 backend_error", res.status, res.body)
	}
	e.mu.Lock()
	n := len(e.decRooms)
	e.mu.Unlock()
	for range n {
		if o := <-e.outcomes; o != "cancelled" {
			t.Errorf("a decode leg ended %q: want cancelled by the router", o)
		}
	}
}

// TestKubeRolesSplit: the role label of a Kubernetes pool's pods
// (kvroute.io/role) splits requests as a configured role does: the pod
// labelled prefill takes the prefill leg, the one labelled decode the
// decode leg. A pool left with prefill pods only serves whole (on the
// prefill engine: vLLM's serves any request), counted and said so.
func TestKubeRolesSplit(t *testing.T) {
	p, d := newPDEngine(t, "p"), newPDEngine(t, "d")
	cs := kubeFleet(t, map[string]*pdEngine{"pre-0": p, "dec-0": d}, map[string]string{"pre-0": "prefill", "dec-0": "decode"})
	r := newRig(t, "kvroute", 0, func(c *config.Config) {
		c.Backends = []config.Backend{{Name: "vllm", Models: []string{"m"}, Kubernetes: &config.Kubernetes{Namespace: "llm", Service: "vllm"}}}
		c.Disaggregation.Split = config.SplitAlways
	})
	r.waitReady(http.StatusOK)
	if res := r.post("/v1/chat/completions", clientBody); res.status != 200 {
		t.Fatalf("status %d: %s", res.status, res.body)
	}
	if pl, dl := p.legs(), d.legs(); len(pl) != 1 || len(dl) != 1 || !reflect.DeepEqual(pl[0].body, wantPrefill(t)) {
		t.Fatalf("prefill pod got %d legs, decode pod %d: want a split request", len(pl), len(dl))
	}

	// The decode pod goes: prefill pods only, served whole.
	cs.remove(t, "dec-0")
	eventually := time.Now()
	for len(r.srv.Fleet().Snapshot().All) != 1 || r.srv.Fleet().Snapshot().All[0].Draining() {
		if time.Since(eventually) > 30*time.Second {
			t.Fatal("the decode pod never left")
		}
		time.Sleep(5 * time.Millisecond)
	}
	res := r.post("/v1/chat/completions", clientBody)
	if res.status != 200 || !strings.HasPrefix(res.header.Get(headerReason), "whole (no decode engine for the model): ") {
		t.Fatalf("status %d, reason %q: want served whole, saying why", res.status, res.header.Get(headerReason))
	}
	if pl := p.legs(); len(pl) != 2 || !reflect.DeepEqual(pl[1].body, jsonOf(t, clientBody)) {
		t.Errorf("prefill pod's last request %v: want the client's own body", pl[len(pl)-1].body)
	}
	if v := metricValue(string(r.get("/metrics").body), `kvroute_pd_requests_total{model="m",outcome="no_decode_engine"}`); v != 1 {
		t.Errorf("no_decode_engine = %v, want 1", v)
	}
}

// hostPort is the port of a test server's URL.
func hostPort(t *testing.T, raw string) int32 {
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	p, err := strconv.Atoi(u.Port())
	if err != nil {
		t.Fatal(err)
	}
	return int32(p)
}
