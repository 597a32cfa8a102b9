package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/admin"
	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/disagg"
)

// pdEngine is a fake vLLM engine of a disaggregated fleet: it records every
// completion it receives (body and headers), and answers a prefill leg as
// vLLM's NixlConnector does (a one-token JSON completion whose
// kv_transfer_params name the engine, its blocks, host and port) and any
// other request with a stream of its own.
type pdEngine struct {
	name string
	srv  *httptest.Server
	// fail: 1 answers 500, 2 closes the connection without an answer.
	fail atomic.Int32
	// kv, when set, is the kv_transfer_params its prefill answers carry
	// instead of kvParams(name).
	kv atomic.Pointer[map[string]any]
	// answerKV makes its other answers carry its kv_transfer_params too
	// (ownAnswer).
	answerKV atomic.Bool
	// seen, when set, is called with every request before it is served
	// (set it rather than the server's handler, which the router's
	// scrapes read concurrently).
	seen atomic.Pointer[func(*http.Request)]
	mu   sync.Mutex
	got  []pdLeg
}

// pdLeg is one request an engine received.
type pdLeg struct {
	body   map[string]any
	header http.Header
	raw    []byte
}

func newPDEngine(t *testing.T, name string) *pdEngine {
	t.Helper()
	e := &pdEngine{name: name}
	e.srv = httptest.NewServer(http.HandlerFunc(e.serve))
	t.Cleanup(e.srv.Close)
	return e
}

// kvParams is the kv_transfer_params engine name's prefill answers with
// (the fields of vLLM's NixlConnector request_finished).
func kvParams(name string) map[string]any {
	return map[string]any{"do_remote_prefill": true, "do_remote_decode": false, "remote_block_ids": []any{1.0, 2.0, 3.0},
		"remote_engine_id": "engine-" + name, "remote_host": "127.0.0.1", "remote_port": 5600.0, "tp_size": 1.0}
}

func (e *pdEngine) serve(w http.ResponseWriter, r *http.Request) {
	if f := e.seen.Load(); f != nil {
		(*f)(r)
	}
	body, ok := e.record(w, r)
	if !ok {
		return
	}
	switch e.fail.Load() {
	case 1:
		http.Error(w, `{"error":{"message":"engine down"}}`, http.StatusInternalServerError)
		return
	case 2:
		if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
			_ = conn.Close()
		}
		return
	}
	if kv, _ := body["kv_transfer_params"].(map[string]any); kv != nil && kv["do_remote_decode"] == true {
		w.Header().Set("Content-Type", "application/json")
		params := kvParams(e.name)
		if kv := e.kv.Load(); kv != nil {
			params = *kv
		}
		ans, _ := json.Marshal(map[string]any{"id": "p-" + e.name, "object": "chat.completion", "choices": []any{},
			"kv_transfer_params": params})
		_, _ = w.Write(ans)
		return
	}
	if e.answerKV.Load() {
		stream, _ := body["stream"].(bool)
		ans := ownAnswer(e.name, stream)
		if stream {
			w.Header().Set("Content-Type", "text/event-stream")
		} else {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Length", fmt.Sprint(len(ans)))
		}
		_, _ = io.WriteString(w, ans)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	for _, ev := range streamEvents(e.name, 3) {
		_, _ = io.WriteString(w, ev)
	}
}

// ownAnswer is the answer of engine name with its kv_transfer_params
// (kvParamsJSON): a vLLM JSON completion has them at the top level; the
// stream carries them in every chunk, as an engine's fork may.
func ownAnswer(name string, stream bool) string {
	kv := kvParamsJSON(name)
	if !stream {
		return `{"id":"c-` + name + `","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"from ` + name + ` ✓"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5},"prompt_logprobs":null,"kv_transfer_params":` + kv + `}`
	}
	var b strings.Builder
	for i := range 3 {
		fmt.Fprintf(&b, `data: {"id":"c-%s","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"%s-%d ✓"}}],"kv_transfer_params":%s}`+"\n\n", name, name, i, kv)
	}
	b.WriteString("data: [DONE]\n\n")
	return b.String()
}

// kvParamsJSON is kvParams(name) in JSON.
func kvParamsJSON(name string) string {
	b, _ := json.Marshal(kvParams(name))
	return string(b)
}

// record keeps a completion request r, its body decoded; ok is false when
// r was answered instead (not a completion, or not JSON).
func (e *pdEngine) record(w http.ResponseWriter, r *http.Request) (body map[string]any, ok bool) {
	if !completionOnly(w, r) {
		return nil, false
	}
	raw, _ := io.ReadAll(r.Body)
	if err := json.Unmarshal(raw, &body); err != nil {
		http.Error(w, "bad json", http.StatusBadRequest)
		return nil, false
	}
	e.mu.Lock()
	e.got = append(e.got, pdLeg{body: body, header: r.Header.Clone(), raw: raw})
	e.mu.Unlock()
	return body, true
}

// legs returns what the engine received.
func (e *pdEngine) legs() []pdLeg {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]pdLeg(nil), e.got...)
}

// pdRig starts a router over prefill engines p0.. and decode engines d0..
// speaking protocol vllm.
func pdRig(t *testing.T, prefill, decode int, mod func(*config.Config)) (*rig, []*pdEngine, []*pdEngine) {
	t.Helper()
	r, pre, dec, _ := pdRigLogged(t, prefill, decode, mod)
	return r, pre, dec
}

// pdRigLogged is pdRig with the router's debug log captured.
func pdRigLogged(t *testing.T, prefill, decode int, mod func(*config.Config)) (*rig, []*pdEngine, []*pdEngine, *lockedBuffer) {
	t.Helper()
	var pre, dec []*pdEngine
	t.Setenv(config.AdminTokenEnv, "")
	logs := &lockedBuffer{}
	logger := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	r := newRigLog(t, "kvroute", 0, func(c *config.Config) {
		c.Admin.Token, c.Admin.Decisions = "pd-admin-token-for-tests", 16
		add := func(role string, n int) (out []*pdEngine) {
			for i := range n {
				e := newPDEngine(t, fmt.Sprintf("%c%d", role[0], i))
				c.Backends = append(c.Backends, config.Backend{URL: e.srv.URL, Name: e.name, Models: []string{"m"}, Role: role})
				out = append(out, e)
			}
			return out
		}
		pre, dec = add(config.RolePrefill, prefill), add(config.RoleDecode, decode)
		// These tests check the split's mechanics on short prompts,
		// which the conditional split serves whole.
		c.Disaggregation.Split = config.SplitAlways
		if mod != nil {
			mod(c)
		}
	}, logger)
	r.waitReady(http.StatusOK)
	return r, pre, dec, logs
}

// clientBody is a streaming chat request with the fields the prefill leg
// must change or drop.
const clientBody = `{"model":"m","messages":[{"role":"user","content":"hello ✓"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":64,"max_completion_tokens":64,"temperature":0.5}`

// jsonOf decodes s, failing the test when it is not JSON.
func jsonOf(t *testing.T, s string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// wantPrefill is the body vLLM's protocol gives the prefill leg of
// clientBody: one token, answered whole, asking for a remote decode.
func wantPrefill(t *testing.T) map[string]any {
	m := jsonOf(t, clientBody)
	m["stream"], m["max_tokens"], m["max_completion_tokens"] = false, 1.0, 1.0
	delete(m, "stream_options")
	m["kv_transfer_params"] = map[string]any{"do_remote_decode": true, "do_remote_prefill": false,
		"remote_engine_id": nil, "remote_block_ids": nil, "remote_host": nil, "remote_port": nil}
	return m
}

// wantDecode is the body of the decode leg after engine name's prefill.
func wantDecode(t *testing.T, name string) map[string]any {
	m := jsonOf(t, clientBody)
	m["kv_transfer_params"] = kvParams(name)
	return m
}

// TestVLLMSplit: a request to a fleet with a prefill and a decode engine
// runs as vLLM's two legs: the prefill engine gets the prefill body, the
// decode engine the client's body with the prefill answer's
// kv_transfer_params, both under the client's request id; the client gets
// the decode engine's stream byte for byte, and the reason header and the
// decision log name both legs.
func TestVLLMSplit(t *testing.T) {
	r, pre, dec := pdRig(t, 1, 1, nil)
	res := r.post("/v1/chat/completions", clientBody, "X-Request-Id", "req-pd-1")
	if res.status != 200 || string(res.body) != strings.Join(streamEvents("d0", 3), "") {
		t.Fatalf("status %d, body %q: want d0's stream", res.status, res.body)
	}
	p, d := pre[0].legs(), dec[0].legs()
	if len(p) != 1 || len(d) != 1 {
		t.Fatalf("prefill got %d requests, decode %d: want one each", len(p), len(d))
	}
	if !reflect.DeepEqual(p[0].body, wantPrefill(t)) {
		t.Errorf("prefill leg body %v\nwant %v", p[0].body, wantPrefill(t))
	}
	if !reflect.DeepEqual(d[0].body, wantDecode(t, "p0")) {
		t.Errorf("decode leg body %v\nwant %v", d[0].body, wantDecode(t, "p0"))
	}
	for i, h := range []http.Header{p[0].header, d[0].header} {
		if got := h.Get("X-Request-Id"); got != "req-pd-1" {
			t.Errorf("leg %d carries X-Request-Id %q, want the client's", i, got)
		}
		if h.Get("Content-Type") != "application/json" {
			t.Errorf("leg %d Content-Type %q", i, h.Get("Content-Type"))
		}
	}
	reason := res.header.Get(headerReason)
	if !strings.HasPrefix(reason, "prefill p0: ") || !strings.Contains(reason, "; decode d0: ") || res.header.Get(headerBackend) != "d0" {
		t.Errorf("reason %q, backend %q: want both legs named, d0 answering", reason, res.header.Get(headerBackend))
	}

	// Without a client id both legs carry the one the router made.
	r.post("/v1/chat/completions", clientBody)
	p, d = pre[0].legs(), dec[0].legs()
	if id := p[1].header.Get("X-Request-Id"); id == "" || d[1].header.Get("X-Request-Id") != id {
		t.Errorf("request ids %q and %q: want one, the same on both legs", id, d[1].header.Get("X-Request-Id"))
	}

	status, body := r.adminCall(http.MethodGet, "/admin/decisions", "pd-admin-token-for-tests")
	var log struct{ Decisions []admin.Decision }
	if status != 200 || json.Unmarshal(body, &log) != nil || len(log.Decisions) != 2 {
		t.Fatalf("GET /admin/decisions: %d %s", status, body)
	}
	if dd := log.Decisions[0]; dd.Backend != "d0" || !strings.HasPrefix(dd.Reason, "prefill p0: ") || !strings.Contains(dd.Reason, "; decode d0: ") {
		t.Errorf("decision %+v: want both legs", dd)
	}
}

// TestSplitVisible: where an operator looks (the response's headers, the
// access log), a split request names both legs' engines, a request whose
// prefill leg was skipped names no prefill engine and says why, and a
// request the conditional split keeps whole says so with its estimates.
func TestSplitVisible(t *testing.T) {
	t.Run("split", func(t *testing.T) {
		r, _, _, logs := pdRigLogged(t, 1, 1, nil)
		res := r.post("/v1/chat/completions", clientBody, "X-Request-Id", "vis-split")
		if res.status != 200 || res.header.Get(headerBackend) != "d0" || res.header.Get(headerPrefill) != "p0" {
			t.Fatalf("status %d, %s %q, %s %q: want d0 answering after p0's prefill", res.status,
				headerBackend, res.header.Get(headerBackend), headerPrefill, res.header.Get(headerPrefill))
		}
		status, body := r.adminCall(http.MethodGet, "/admin/backends", "pd-admin-token-for-tests")
		var list struct{ Backends []struct{ Name, Role string } }
		if status != http.StatusOK || json.Unmarshal(body, &list) != nil || len(list.Backends) != 2 ||
			list.Backends[0].Role != config.RolePrefill || list.Backends[1].Role != config.RoleDecode {
			t.Errorf("GET /admin/backends: %d %s: want p0 prefill, d0 decode", status, body)
		}
		if l := logs.String(); !strings.Contains(l, `"msg":"disaggregation on: requests may be split over a prefill and a decode engine","protocol":"vllm","split":"always","prefill":1,"decode":1,"both":0`) {
			t.Errorf("no startup line on the fleet's roles in:\n%s", l)
		}
		m := accessLine(t, logs, "vis-split")
		checkFields(t, "split", m, map[string]any{"backend": "d0", "prefill_backend": "p0", "reason": res.header.Get(headerReason)})
		if reason, _ := m["reason"].(string); !strings.HasPrefix(reason, "prefill p0: ") || !strings.Contains(reason, "; decode d0: ") {
			t.Errorf("access log reason %q: want both legs", reason)
		}
	})
	t.Run("prefill skipped", func(t *testing.T) {
		r, pre, _, logs := pdRigLogged(t, 1, 1, func(c *config.Config) { c.Retry.Attempts = 1 })
		pre[0].fail.Store(2)
		res := r.post("/v1/chat/completions", clientBody, "X-Request-Id", "vis-skipped")
		if res.status != 200 || res.header.Get(headerPrefill) != "" {
			t.Fatalf("status %d, %s %q: want none, the prefill leg was skipped", res.status, headerPrefill, res.header.Get(headerPrefill))
		}
		m := accessLine(t, logs, "vis-skipped")
		checkFields(t, "skipped", m, map[string]any{"backend": "d0", "prefill_backend": ""})
		if reason, _ := m["reason"].(string); !strings.HasPrefix(reason, "prefill skipped after failing on p0; decode d0 (whole): ") {
			t.Errorf("access log reason %q: want the prefill skipped", reason)
		}
	})
	t.Run("decided whole", func(t *testing.T) {
		r, pre, _, logs := pdRigLogged(t, 1, 1, func(c *config.Config) { c.Disaggregation.Split = config.SplitConditional })
		res := r.post("/v1/chat/completions", clientBody, "X-Request-Id", "vis-whole")
		if res.status != 200 || res.header.Get(headerPrefill) != "" || len(pre[0].legs()) != 0 {
			t.Fatalf("status %d, %s %q, %d prefill legs: want a short prompt served whole",
				res.status, headerPrefill, res.header.Get(headerPrefill), len(pre[0].legs()))
		}
		m := accessLine(t, logs, "vis-whole")
		if reason, _ := m["reason"].(string); !strings.HasPrefix(reason, "whole (") || !strings.Contains(reason, " <= split ") {
			t.Errorf("access log reason %q: want why it was kept whole, with both estimates", reason)
		}
	})
}

// TestVLLMPrefillRetried: a prefill engine that fails its leg is replaced
// by another prefill engine, and the decode leg carries that one's
// kv_transfer_params.
func TestVLLMPrefillRetried(t *testing.T) {
	r, pre, dec := pdRig(t, 2, 1, nil)
	pre[0].fail.Store(1)
	// The first request whose prefill leg p0 took shows the retry; the
	// policy may send some to p1 first.
	postUntil(t, r, pre[0], func(res result) {
		if res.status != 200 {
			t.Fatalf("status %d: %s", res.status, res.body)
		}
	})
	p1, d := pre[1].legs(), dec[0].legs()
	last := d[len(d)-1]
	if !reflect.DeepEqual(last.body, wantDecode(t, "p1")) || !reflect.DeepEqual(p1[len(p1)-1].body, wantPrefill(t)) {
		t.Errorf("after p0 failed: p1 got %v, decode got %v: want the prefill on p1 and its params", p1[len(p1)-1].body, last.body)
	}
	if len(d) != len(pre[1].legs()) {
		t.Errorf("decode legs %d, p1 prefill legs %d: want one decode per successful prefill", len(d), len(pre[1].legs()))
	}
}

// TestVLLMPrefillFallback: when no prefill engine can do the prefill, the
// request is served whole by the decode engine (the client's body as it
// was), and the reason says the prefill was skipped.
func TestVLLMPrefillFallback(t *testing.T) {
	r, pre, dec := pdRig(t, 1, 1, func(c *config.Config) { c.Retry.Attempts = 1 })
	pre[0].fail.Store(2)
	res := r.post("/v1/chat/completions", clientBody, "X-Request-Id", "req-pd-2")
	if res.status != 200 || string(res.body) != strings.Join(streamEvents("d0", 3), "") {
		t.Fatalf("status %d, body %q: want d0's stream", res.status, res.body)
	}
	d := dec[0].legs()
	if len(d) != 1 || !reflect.DeepEqual(d[0].body, jsonOf(t, clientBody)) || d[0].header.Get("X-Request-Id") != "req-pd-2" {
		t.Fatalf("decode got %v: want the client's own body once", d)
	}
	if reason := res.header.Get(headerReason); !strings.HasPrefix(reason, "prefill skipped after failing on p0; decode d0 (whole): ") {
		t.Errorf("reason %q: want the prefill skipped", reason)
	}
}

// TestVLLMDecodeRetried: a decode engine that fails before its first byte
// is replaced by another decode engine, with the kv_transfer_params of a
// fresh prefill (the failed engine may have pulled, and so freed, the
// first one's blocks).
func TestVLLMDecodeRetried(t *testing.T) {
	r, pre, dec := pdRig(t, 1, 2, nil)
	// Whichever decode engine the policy picks first closes the
	// connection before its first byte; the other answers.
	var decodes atomic.Int32
	for _, e := range dec {
		fail := func(req *http.Request) {
			if req.URL.Path != "/v1/chat/completions" {
				return // the router's scrapes and checks
			}
			if decodes.Add(1) == 1 {
				e.fail.Store(2)
			} else {
				e.fail.Store(0)
			}
		}
		e.seen.Store(&fail)
	}
	res := r.post("/v1/chat/completions", clientBody)
	var served *pdEngine
	for _, e := range dec {
		if e.name == res.header.Get(headerBackend) {
			served = e
		}
	}
	if res.status != 200 || served == nil || string(res.body) != strings.Join(streamEvents(served.name, 3), "") {
		t.Fatalf("status %d from %q, body %q: want the answering decode engine's stream", res.status, res.header.Get(headerBackend), res.body)
	}
	d := served.legs()
	if len(pre[0].legs()) != 2 || len(dec[0].legs())+len(dec[1].legs()) != 2 || !reflect.DeepEqual(d[len(d)-1].body, wantDecode(t, "p0")) {
		t.Errorf("%d prefills for %d+%d decode attempts, last decode body %v: want a fresh prefill for the retry",
			len(pre[0].legs()), len(dec[0].legs()), len(dec[1].legs()), d[len(d)-1].body)
	}
}

// postUntil posts clientBody, checking each answer, until engine e got a
// leg (the policy chooses which engine of a role goes first), failing the
// test when it gets none in 20 requests: a test that skipped would pass
// having checked nothing.
func postUntil(t *testing.T, r *rig, e *pdEngine, check func(result)) {
	t.Helper()
	for i := 0; len(e.legs()) == 0; i++ {
		if i == 20 {
			t.Fatalf("%s never chosen in 20 requests", e.name)
		}
		check(r.post("/v1/chat/completions", clientBody))
	}
}

// sgEngine is a fake SGLang engine of a disaggregated fleet: it records
// what it receives and, as SGLang's prefill and decode engines do, answers
// only once its peer of the pair has its request too (the decode engine
// pulls the KV cache from the prefill engine's bootstrap server): legs
// sent one after the other would never be answered (500 after 5 s).
type sgEngine struct {
	*pdEngine
	arrived chan struct{}
	peer    *sgEngine
}

func newSGEngine(t *testing.T, name string) *sgEngine {
	e := &sgEngine{pdEngine: &pdEngine{name: name}, arrived: make(chan struct{})}
	e.srv = httptest.NewServer(http.HandlerFunc(e.serve))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *sgEngine) serve(w http.ResponseWriter, r *http.Request) {
	if _, ok := e.record(w, r); !ok {
		return
	}
	close(e.arrived) // one request per engine in this test
	select {
	case <-e.peer.arrived:
	case <-time.After(5 * time.Second):
		http.Error(w, "no peer", http.StatusInternalServerError)
		return
	}
	if e.name[0] == 'p' {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, jsonAnswer(e.name))
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	for _, ev := range streamEvents(e.name, 3) {
		_, _ = io.WriteString(w, ev)
	}
}

// TestSGLangSplit: under protocol sglang both engines get, at once, the
// client's body with bootstrap_host (the prefill engine's host),
// bootstrap_port (disaggregation.bootstrap_port) and one bootstrap_room,
// under the client's request id; the client reads the decode engine's
// stream.
func TestSGLangSplit(t *testing.T) {
	pre, dec := newSGEngine(t, "p0"), newSGEngine(t, "d0")
	pre.peer, dec.peer = dec, pre
	prevRoom := disagg.SetRoom(func() uint64 { return 1<<63 - 1 })
	t.Cleanup(func() { disagg.SetRoom(prevRoom) })
	t.Setenv(config.AdminTokenEnv, "")
	r := newRig(t, "kvroute", 0, func(c *config.Config) {
		c.Disaggregation = config.Disaggregation{Protocol: config.ProtocolSGLang, BootstrapPort: 9123, Split: config.SplitAlways}
		c.Backends = append(c.Backends,
			config.Backend{URL: pre.srv.URL, Name: "p0", Models: []string{"m"}, Role: config.RolePrefill},
			config.Backend{URL: dec.srv.URL, Name: "d0", Models: []string{"m"}, Role: config.RoleDecode})
	})
	r.waitReady(http.StatusOK)
	res := r.post("/v1/chat/completions", clientBody, "X-Request-Id", "req-sg-1")
	if res.status != 200 || string(res.body) != strings.Join(streamEvents("d0", 3), "") {
		t.Fatalf("status %d, body %q: want d0's stream", res.status, res.body)
	}
	want := jsonOf(t, clientBody)
	want["bootstrap_host"], want["bootstrap_port"] = "127.0.0.1", 9123.0
	p, d := pre.legs(), dec.legs()
	if len(p) != 1 || len(d) != 1 {
		t.Fatalf("prefill got %d requests, decode %d: want one each", len(p), len(d))
	}
	// The room as a JSON number, exactly (a float64 would round it).
	for i, leg := range []pdLeg{p[0], d[0]} {
		if got := leg.header.Get("X-Request-Id"); got != "req-sg-1" {
			t.Errorf("leg %d carries X-Request-Id %q", i, got)
		}
		if !strings.Contains(string(leg.raw), `"bootstrap_room":9223372036854775807`) {
			t.Errorf("leg %d body %s: want bootstrap_room 9223372036854775807", i, leg.raw)
		}
		delete(leg.body, "bootstrap_room")
		if !reflect.DeepEqual(leg.body, want) {
			t.Errorf("leg %d body %v\nwant %v", i, leg.body, want)
		}
	}
	if reason := res.header.Get(headerReason); !strings.HasPrefix(reason, "prefill p0: ") || !strings.Contains(reason, "; decode d0: ") {
		t.Errorf("reason %q: want both legs", reason)
	}
}
