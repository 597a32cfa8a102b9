package proxy

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/disagg"
	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/request"
)

// emuEngine is an emulated engine (kvroute engine) of a disaggregated
// fleet on loopback that records every completion it receives (headers,
// body) and the bytes it answered.
type emuEngine struct {
	*emulator.Server
	name, url string
	ts        *httptest.Server
	// arrived, when set (under mu), is called with the number of
	// completions received so far as each arrives.
	arrived  func(n int)
	killOnce sync.Once
	mu       sync.Mutex
	seen     int
	got      []emuLeg
	// grew is closed and replaced (under mu) each time got grows.
	grew chan struct{}
}

// emuLeg is one completion an emulated engine received and answered.
type emuLeg struct {
	header       http.Header
	body, answer []byte
}

// teeWriter keeps a copy of what a handler writes; Unwrap lets the
// handler flush through it.
type teeWriter struct {
	http.ResponseWriter
	buf bytes.Buffer
}

func (w *teeWriter) Write(b []byte) (int, error) {
	w.buf.Write(b)
	return w.ResponseWriter.Write(b)
}

func (w *teeWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// startEmu starts an emulated engine of role named name (its engine id
// "engine-"+name), its prefill answers naming its own address.
func startEmu(t *testing.T, name, role string, p engine.Preset) *emuEngine {
	t.Helper()
	ts := httptest.NewUnstartedServer(nil)
	s, err := emulator.New(emulator.Config{Preset: p, TimeScale: 20, Role: role, EngineID: "engine-" + name,
		SideChannel: ts.Listener.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	e := &emuEngine{Server: s, name: name, grew: make(chan struct{})}
	h := s.Handler()
	ts.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "completions") {
			h.ServeHTTP(w, r)
			return
		}
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		e.mu.Lock()
		e.seen++
		n, arrived := e.seen, e.arrived
		e.mu.Unlock()
		if arrived != nil {
			arrived(n)
		}
		tw := &teeWriter{ResponseWriter: w}
		h.ServeHTTP(tw, r)
		e.mu.Lock()
		e.got = append(e.got, emuLeg{header: r.Header.Clone(), body: body, answer: tw.buf.Bytes()})
		close(e.grew)
		e.grew = make(chan struct{})
		e.mu.Unlock()
	})
	ts.Start()
	e.url, e.ts = ts.URL, ts
	t.Cleanup(e.kill)
	return e
}

// kill stops the engine as a crash would: its requests in flight are cut
// and it accepts no more connections.
func (e *emuEngine) kill() {
	e.killOnce.Do(func() {
		e.Server.Close()
		e.ts.CloseClientConnections()
		e.ts.Close()
	})
}

// legs returns what the engine received.
func (e *emuEngine) legs() []emuLeg {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]emuLeg(nil), e.got...)
}

// legsAtLeast returns what the engine received once it has answered at
// least n completions. The router may read an answer to its end before
// the engine's handler has returned and recorded it (a SGLang prefill
// leg, sent beside its decode leg, is not waited for by the client's
// answer at all), so a test that counts legs right after the client's
// answer waits for them; the bound only keeps a lost leg from hanging
// the test.
func (e *emuEngine) legsAtLeast(t *testing.T, n int) []emuLeg {
	t.Helper()
	bound := time.NewTimer(time.Minute)
	defer bound.Stop()
	for {
		e.mu.Lock()
		got, grew := len(e.got), e.grew
		e.mu.Unlock()
		if got >= n {
			return e.legs()
		}
		select {
		case <-grew:
		case <-bound.C:
			t.Fatalf("engine %s answered %d completions in a minute, want at least %d", e.name, got, n)
		}
	}
}

// emuPreset is h100-llama3-8b with a 2 ms transfer latency.
func emuPreset(t *testing.T) engine.Preset {
	t.Helper()
	p, err := engine.LookupPreset("h100-llama3-8b")
	if err != nil {
		t.Fatal(err)
	}
	p.KVTransferLatency = 2 * time.Millisecond
	return p
}

// emuRig starts a router speaking protocol over emulated engines, one
// backend entry each, splitting every request a prefill engine can take.
func emuRig(t *testing.T, protocol string, engines ...*emuEngine) *rig {
	t.Helper()
	return emuRigWith(t, protocol, func(c *config.Config) { c.Disaggregation.Split = config.SplitAlways }, engines...)
}

// emuRigWith is emuRig with the disaggregation section as mod leaves it.
func emuRigWith(t *testing.T, protocol string, mod func(*config.Config), engines ...*emuEngine) *rig {
	t.Helper()
	t.Setenv(config.AdminTokenEnv, "")
	r := newRig(t, "kvroute", 0, func(c *config.Config) {
		c.Disaggregation.Protocol = protocol
		c.Disaggregation.BootstrapPort = 8998
		mod(c)
		for _, e := range engines {
			role := config.RoleDecode
			if strings.HasPrefix(e.name, "p") {
				role = config.RolePrefill
			}
			c.Backends = append(c.Backends, config.Backend{URL: e.url, Name: e.name, Models: []string{e.Model()}, Role: role})
		}
	})
	r.waitReady(http.StatusOK)
	return r
}

// checkLegHeaders: the leg carries the client's request id, its
// Authorization, and a JSON body of exactly its length.
func checkLegHeaders(t *testing.T, which string, leg emuLeg, id string) {
	t.Helper()
	h := leg.header
	if h.Get("X-Request-Id") != id || h.Get("Authorization") != "Bearer sk-e2e" || h.Get("Content-Type") != "application/json" ||
		h.Get("Content-Length") != strconv.Itoa(len(leg.body)) {
		t.Errorf("%s leg headers %v: want X-Request-Id %q, the client's Authorization, JSON of %d bytes", which, h, id, len(leg.body))
	}
}

// e2eContent is a user message of several KV blocks with characters the
// legs must carry as the client wrote them (no JSON escaping needed).
var e2eContent = "<b>hello ✓</b> & " + strings.Repeat("the quick brown fox jumps over the lazy dog. ", 8)

// TestVLLMSplitEmulated: a router in front of an emulated prefill and an
// emulated decode engine (vLLM's NixlConnector protocol). Both legs' bodies
// are checked byte for byte: the prefill leg is the client's body as vLLM's
// toy_proxy_server.py rewrites it (stream false, max_tokens and
// max_completion_tokens 1, no stream_options, no min_tokens, the
// kv_transfer_params asking for a remote decode); the decode leg is the
// client's body with the prefill answer's kv_transfer_params (llm-d's
// connector_nixlv2.go and the toy proxy both pass them on). Both are the
// client's members as it wrote them, in its order, then the members the
// leg sets (the engines read JSON: key order is free; the client's
// strings stay as they were, where llm-d's sidecar would write < as
// \u003c). Both legs carry the client's X-Request-Id. The decode engine
// receives the prompt's KV cache instead of computing it, and the client
// reads its stream byte for byte.
func TestVLLMSplitEmulated(t *testing.T) {
	pre, dec := startEmu(t, "p0", emulator.RolePrefill, emuPreset(t)), startEmu(t, "d0", emulator.RoleDecode, emuPreset(t))
	r := emuRig(t, config.ProtocolVLLM, pre, dec)
	model := pre.Model()
	client := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"%s"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":8,"max_completion_tokens":8,"min_tokens":2,"temperature":0.5,"ignore_eos":true}`, model, e2eContent)
	res := r.post("/v1/chat/completions", client, "X-Request-Id", "req-e2e-1", "Authorization", "Bearer sk-e2e")
	if res.status != 200 {
		t.Fatalf("status %d: %s", res.status, res.body)
	}
	p, d := pre.legsAtLeast(t, 1), dec.legsAtLeast(t, 1)
	if len(p) != 1 || len(d) != 1 {
		t.Fatalf("prefill engine got %d requests, decode engine %d: want one each", len(p), len(d))
	}
	messages := fmt.Sprintf(`[{"role":"user","content":"%s"}]`, e2eContent)
	wantPrefill := fmt.Sprintf(`{"model":%q,"messages":%s,"temperature":0.5,"ignore_eos":true,"stream":false,"max_tokens":1,"max_completion_tokens":1,"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}}`, model, messages)
	if string(p[0].body) != wantPrefill {
		t.Errorf("prefill leg\n%s\nwant\n%s", p[0].body, wantPrefill)
	}

	// The prefill engine's answer names its engine, the prompt's blocks
	// (a fresh engine's first ones), the request, and its address.
	v, perr := request.Parse(request.Chat, []byte(client), request.Options{})
	if perr != nil {
		t.Fatal(perr)
	}
	n := engine.Tokens(v.Prompt)
	ids := make([]string, (n+engine.BlockSize-1)/engine.BlockSize)
	for i := range ids {
		ids[i] = strconv.Itoa(i)
	}
	host, port, _ := strings.Cut(strings.TrimPrefix(pre.url, "http://"), ":")
	answerID, _ := jsonOf(t, string(p[0].answer))["id"].(string)
	if answerID == "" {
		t.Fatalf("prefill answer %s: want a completion", p[0].answer)
	}
	wantAnswer := fmt.Sprintf(`"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[[%s]],"remote_engine_id":"engine-p0","remote_request_id":%q,"remote_host":%q,"remote_port":%s,"tp_size":1}`,
		strings.Join(ids, ","), answerID, host, port)
	if !bytes.Contains(p[0].answer, []byte(wantAnswer)) {
		t.Errorf("prefill answer %s\nwant it to carry %s", p[0].answer, wantAnswer)
	}
	wantDecode := strings.TrimSuffix(client, "}") + fmt.Sprintf(`,"kv_transfer_params":{"do_remote_decode":false,"do_remote_prefill":true,"remote_block_ids":[[%s]],"remote_engine_id":"engine-p0","remote_host":%q,"remote_port":%s,"remote_request_id":%q,"tp_size":1}}`,
		strings.Join(ids, ","), host, port, answerID)
	if string(d[0].body) != wantDecode {
		t.Errorf("decode leg\n%s\nwant\n%s", d[0].body, wantDecode)
	}
	checkLegHeaders(t, "prefill", p[0], "req-e2e-1")
	checkLegHeaders(t, "decode", d[0], "req-e2e-1")
	if !bytes.Equal(res.body, d[0].answer) {
		t.Errorf("client got\n%s\nthe decode engine sent\n%s", res.body, d[0].answer)
	}
	// The decode engine received the prompt instead of computing it.
	if st := dec.Stats(); st.KVTransferTokens != int64(n) || st.PrefillTokensComputed != 1 {
		t.Errorf("decode engine received %d tokens and computed %d: want %d and 1", st.KVTransferTokens, st.PrefillTokensComputed, n)
	}
	if !strings.Contains(string(res.body), fmt.Sprintf(`"prompt_tokens_details":{"cached_tokens":%d}`, n-1)) {
		t.Errorf("usage of %s: want %d cached tokens (the prompt less one, as vLLM reports a received prompt)", res.body, n-1)
	}
}

// TestSGLangSplitEmulated: under protocol sglang both emulated engines get
// the client's body with bootstrap_host (the prefill engine's host),
// bootstrap_port (disaggregation.bootstrap_port) and one bootstrap_room, as
// SGLang's router's bootstrap_injector.rs adds them: scalars for one
// sequence, lists of one a sequence for a batch (n above 1). Byte for
// byte: the client's members as written, then the three bootstrap ones
// (SGLang's router re-encodes the body with serde_json; the engines read
// JSON, whose key order is free).
func TestSGLangSplitEmulated(t *testing.T) {
	pre, dec := startEmu(t, "p0", emulator.RoleBoth, emuPreset(t)), startEmu(t, "d0", emulator.RoleBoth, emuPreset(t))
	r := emuRig(t, config.ProtocolSGLang, pre, dec)
	next := uint64(1<<63 - 4)
	prevRoom := disagg.SetRoom(func() uint64 { next++; return next })
	t.Cleanup(func() { disagg.SetRoom(prevRoom) })
	model := pre.Model()
	messages := fmt.Sprintf(`[{"role":"user","content":"%s"}]`, e2eContent)
	tests := []struct{ name, extra, host, port, room string }{
		{"one sequence", ``, `"127.0.0.1"`, `8998`, `9223372036854775805`},
		{"n of 2", `,"n":2`, `["127.0.0.1","127.0.0.1"]`, `[8998,8998]`, `[9223372036854775806,9223372036854775807]`},
	}
	for i, tt := range tests {
		client := fmt.Sprintf(`{"model":%q,"messages":%s,"max_tokens":4%s,"stream":true}`, model, messages, tt.extra)
		id := fmt.Sprintf("req-sg-%d", i)
		res := r.post("/v1/chat/completions", client, "X-Request-Id", id, "Authorization", "Bearer sk-e2e")
		if res.status != 200 {
			t.Fatalf("%s: status %d: %s", tt.name, res.status, res.body)
		}
		want := strings.TrimSuffix(client, "}") + fmt.Sprintf(`,"bootstrap_host":%s,"bootstrap_port":%s,"bootstrap_room":%s}`, tt.host, tt.port, tt.room)
		p, d := pre.legsAtLeast(t, i+1), dec.legsAtLeast(t, i+1)
		if len(p) != i+1 || len(d) != i+1 {
			t.Fatalf("%s: prefill engine got %d requests, decode engine %d", tt.name, len(p), len(d))
		}
		for which, leg := range map[string]emuLeg{"prefill": p[i], "decode": d[i]} {
			if string(leg.body) != want {
				t.Errorf("%s: %s leg\n%s\nwant\n%s", tt.name, which, leg.body, want)
			}
			checkLegHeaders(t, which, leg, id)
		}
		if !bytes.Equal(res.body, d[i].answer) {
			t.Errorf("%s: the client did not get the decode engine's answer", tt.name)
		}
	}
}

// TestPrefillEngineKilled: a P/D fleet (two emulated prefill engines, one
// decode engine) under a bounded load of streaming requests; one prefill
// engine is killed while it serves a prefill leg. Prefill legs stream
// nothing to the client, so every request must complete (its prefill
// retried on the other prefill engine, or the request served whole by the
// decode engine) or fail with an error the client can read: none hangs,
// none ends without its [DONE].
func TestPrefillEngineKilled(t *testing.T) {
	const requests, clients, killAt = 48, 6, 4
	p := emuPreset(t)
	p0, p1 := startEmu(t, "p0", emulator.RolePrefill, p), startEmu(t, "p1", emulator.RolePrefill, p)
	dec := startEmu(t, "d0", emulator.RoleDecode, p)
	r := emuRig(t, config.ProtocolVLLM, p0, p1, dec)
	killed := make(chan struct{})
	p0.mu.Lock()
	p0.arrived = func(n int) {
		if n == killAt {
			// While this prefill leg is in flight.
			go func() { p0.kill(); close(killed) }()
		}
	}
	p0.mu.Unlock()

	type outcome struct {
		status int
		body   []byte
		err    error
	}
	out := make([]outcome, requests)
	var wg sync.WaitGroup
	next := make(chan int)
	for range clients {
		wg.Go(func() {
			for i := range next {
				body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"request %d: %s"}],"stream":true,"max_tokens":6,"ignore_eos":true}`,
					p.Model, i, e2eContent)
				req, err := http.NewRequest(http.MethodPost, r.base+"/v1/chat/completions", strings.NewReader(body))
				if err != nil {
					out[i].err = err
					continue
				}
				req.Header.Set("Content-Type", "application/json")
				resp, err := r.client.Do(req)
				if err != nil {
					out[i].err = err
					continue
				}
				out[i].status = resp.StatusCode
				out[i].body, out[i].err = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
		})
	}
	for i := range requests {
		next <- i
	}
	close(next)
	wg.Wait()
	select {
	case <-killed:
	default:
		t.Skipf("p0 got fewer than %d prefill legs: the policy sent them elsewhere, nothing was killed", killAt)
	}
	completed, failed := 0, 0
	for i, o := range out {
		switch {
		case o.err != nil:
			t.Errorf("request %d lost: %v (after %d bytes)", i, o.err, len(o.body))
		case o.status == http.StatusOK:
			if !bytes.HasSuffix(o.body, []byte("data: [DONE]\n\n")) || strings.Count(string(o.body), `"content":`) < 6 {
				t.Errorf("request %d: 200 but its stream ended early: %q", i, o.body)
			}
			completed++
		default:
			if m := jsonOf(t, string(o.body)); m["error"] == nil {
				t.Errorf("request %d: status %d without an OpenAI error: %s", i, o.status, o.body)
			}
			failed++
		}
	}
	after := len(p1.legs())
	t.Logf("%d requests: %d completed, %d failed cleanly; p0 took %d prefill legs before it was killed, p1 %d, the decode engine %d requests",
		requests, completed, failed, killAt, after, len(dec.legs()))
	if completed != requests {
		t.Errorf("%d of %d requests completed: a prefill engine's death must not fail a request that streamed nothing", completed, requests)
	}
}
