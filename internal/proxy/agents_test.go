package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/openai"
)

// emulatedRig is a router with policy pol in front of n emulated engines
// named e0..e{n-1}, serving model "m".
func emulatedRig(t *testing.T, pol string, n int, mod func(*config.Config)) *rig {
	t.Helper()
	p, err := engine.LookupPreset("h100-llama3-8b")
	if err != nil {
		t.Fatal(err)
	}
	var backends []config.Backend
	for i := range n {
		em, err := emulator.New(emulator.Config{Preset: p, TimeScale: 50, Model: "m"})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(em.Handler())
		t.Cleanup(func() { srv.CloseClientConnections(); _ = em.Close(); srv.Close() })
		backends = append(backends, config.Backend{URL: srv.URL, Name: fmt.Sprintf("e%d", i)})
	}
	return newRig(t, pol, 0, func(c *config.Config) {
		c.Backends = backends
		if mod != nil {
			mod(c)
		}
	})
}

// do sends a request with method to path through the router.
func (r *rig) do(method, path, body string) result {
	r.t.Helper()
	req, err := http.NewRequest(method, r.base+path, strings.NewReader(body))
	if err != nil {
		r.t.Fatal(err)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		r.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, rerr := io.ReadAll(resp.Body)
	return result{status: resp.StatusCode, header: resp.Header, body: b, readErr: rerr}
}

// responseID reads the id of a Responses answer: a JSON body's, or a
// stream's response.created event's.
func responseID(t *testing.T, res result) string {
	t.Helper()
	body := res.body
	if strings.HasPrefix(res.header.Get("Content-Type"), "text/event-stream") {
		for _, line := range strings.Split(string(res.body), "\n") {
			if d, ok := strings.CutPrefix(line, "data: "); ok && strings.Contains(d, `"response.created"`) {
				var ev openai.ResponseEvent
				if err := json.Unmarshal([]byte(d), &ev); err != nil || ev.Response == nil {
					t.Fatalf("created event %s", d)
				}
				return ev.Response.ID
			}
		}
		t.Fatalf("no response.created event in %s", body)
	}
	var obj openai.ResponseObject
	if err := json.Unmarshal(body, &obj); err != nil || obj.ID == "" {
		t.Fatalf("answer %d %s", res.status, body)
	}
	return obj.ID
}

// TestResponsesFollowTheirEngine: under round robin, which would send a
// continuation to another engine two times in three, every request with
// previous_response_id goes to the engine that stored the response,
// streamed or not, as do the requests on a stored response; an id the
// router does not know, or whose engine left the fleet, is the engine's
// own 404.
func TestResponsesFollowTheirEngine(t *testing.T) {
	r := emulatedRig(t, "round-robin", 3, nil)
	r.waitReady(http.StatusOK)
	for conv := range 4 {
		prev, home := "", ""
		for turn := range 4 {
			body := map[string]any{"model": "m", "input": fmt.Sprintf("conversation %d turn %d: %s", conv, turn, words("x", 40)),
				"max_output_tokens": 3, "stream": (conv+turn)%2 == 1}
			if prev != "" {
				body["previous_response_id"] = prev
			}
			b, _ := json.Marshal(body)
			res := r.post("/v1/responses", string(b))
			if res.status != http.StatusOK {
				t.Fatalf("conversation %d turn %d: %d %s", conv, turn, res.status, res.body)
			}
			if home == "" {
				home = res.header.Get(headerBackend)
			} else if got := res.header.Get(headerBackend); got != home {
				t.Fatalf("conversation %d turn %d went to %s, its responses live on %s", conv, turn, got, home)
			}
			prev = responseID(t, res)
		}
		// The requests on the stored response go to its engine too.
		for _, c := range []struct {
			method, path string
			status       int
		}{
			{"GET", "/v1/responses/" + prev, 200},
			{"GET", "/v1/responses/" + prev + "/input_items", 200},
			{"POST", "/v1/responses/" + prev + "/cancel", 400},
			{"DELETE", "/v1/responses/" + prev, 200},
			{"GET", "/v1/responses/" + prev, 404},
		} {
			res := r.do(c.method, c.path, "")
			if res.status != c.status || res.header.Get(headerBackend) != home {
				t.Fatalf("%s %s: %d from %q %s, want %d from %s", c.method, c.path, res.status, res.header.Get(headerBackend), res.body, c.status, home)
			}
		}
	}
	checkNotFound := func(res result, id string) {
		t.Helper()
		var e openai.ErrorBody
		if err := json.Unmarshal(res.body, &e); err != nil || res.status != 404 || e.Error.Type != openai.TypeInvalidRequest ||
			e.Error.Code != float64(404) || e.Error.Message != "Response with id '"+id+"' not found." {
			t.Fatalf("%d %s, want vLLM's 404", res.status, res.body)
		}
	}
	checkNotFound(r.do("GET", "/v1/responses/resp_unknown", ""), "resp_unknown")
	if res := r.do("PUT", "/v1/responses/resp_unknown", ""); res.status != http.StatusMethodNotAllowed {
		t.Fatalf("PUT: %d", res.status)
	}

	// The engine of a stored response leaves the fleet: its
	// continuation is the engine's 404, not a turn on an engine that
	// never saw the conversation.
	res := r.post("/v1/responses", `{"model":"m","input":"hello","max_output_tokens":2}`)
	id, home := responseID(t, res), res.header.Get(headerBackend)
	next := *r.srv.cfg
	next.Backends = nil
	for _, b := range r.srv.cfg.Backends {
		if b.Name != home {
			next.Backends = append(next.Backends, b)
		}
	}
	if err := r.srv.Reload(&next); err != nil {
		t.Fatal(err)
	}
	checkNotFound(r.post("/v1/responses", `{"model":"m","input":"more","previous_response_id":"`+id+`"}`), id)
}

// TestMessagesThroughRouter: the Messages API through the router, streamed
// and not, with the router's own errors in Anthropic's shape, and
// count_tokens passed through.
func TestMessagesThroughRouter(t *testing.T) {
	r := emulatedRig(t, "kvroute", 2, func(c *config.Config) {
		c.Passthrough.Allow = append(c.Passthrough.Allow, "POST /v1/messages/count_tokens")
	})
	r.waitReady(http.StatusOK)
	res := r.post("/v1/messages", `{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`)
	var m openai.MessagesResponse
	if err := json.Unmarshal(res.body, &m); res.status != 200 || err != nil || m.Type != "message" {
		t.Fatalf("answer %d %s", res.status, res.body)
	}
	res = r.post("/v1/messages", `{"model":"m","max_tokens":2,"stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	if res.status != 200 || !strings.Contains(string(res.body), "event: message_stop") {
		t.Fatalf("stream %d %s", res.status, res.body)
	}
	for _, c := range []struct {
		body   string
		status int
	}{
		{`{"model":"m","messages":[{"role":"user","content":"hi"}]}`, 400},
		{`{"max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`, 400},
		{`{"model":"nope","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`, 404},
		{`not json`, 400},
	} {
		res := r.post("/v1/messages", c.body)
		var e openai.AnthropicError
		if err := json.Unmarshal(res.body, &e); err != nil || res.status != c.status || e.Type != "error" || e.Error.Type == "" || e.Error.Message == "" {
			t.Fatalf("%s: %d %s, want %d in Anthropic's shape", c.body, res.status, res.body, c.status)
		}
	}
	res = r.post("/v1/messages/count_tokens", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	if res.status != 200 || !strings.Contains(string(res.body), "input_tokens") {
		t.Fatalf("count_tokens %d %s", res.status, res.body)
	}
}

// TestAgentSessionHeaders: each agent's session header, and one added by
// session.headers, keys the session as X-Session-ID does; session.header
// wins over them, and a Responses request's prompt_cache_key keys it when
// no header does.
func TestAgentSessionHeaders(t *testing.T) {
	r := newRig(t, "session-hash", 4, func(c *config.Config) {
		c.Session.Headers = append(c.Session.Headers, "X-Agent-Run")
	})
	for i, h := range []string{"X-Session-ID", "x-claude-code-session-id", "session-id", "x-session-affinity", "X-Agent-Run", "prompt_cache_key"} {
		for s := range 4 {
			key := fmt.Sprintf("%s-conv-%d", h, s)
			first := ""
			for turn := range 4 {
				// Turns share no text: only the session key keeps them
				// together.
				prompt := words(fmt.Sprintf("%d-%s-turn%d", i, key, turn), 200)
				var res result
				if h == "prompt_cache_key" {
					res = r.post("/v1/responses", `{"model":"shared","input":"`+prompt+`","prompt_cache_key":"`+key+`"}`)
				} else {
					res = r.post("/v1/chat/completions", chat("shared", false, prompt), h, key)
				}
				got := res.header.Get(headerBackend)
				if res.status != 200 || got == "" {
					t.Fatalf("%s: status %d %s", h, res.status, res.body)
				}
				if first == "" {
					first = got
				} else if got != first {
					t.Fatalf("%s %s turn %d went to %s, earlier turns to %s", h, key, turn, got, first)
				}
			}
		}
	}
	// session.header wins: two requests with the same X-Session-ID and
	// different agent headers stay together.
	first := r.post("/v1/chat/completions", chat("shared", false, "a"), "X-Session-ID", "k", "session-id", "other-1").header.Get(headerBackend)
	for i := range 6 {
		res := r.post("/v1/chat/completions", chat("shared", false, words(fmt.Sprint(i), 50)), "X-Session-ID", "k", "session-id", fmt.Sprintf("other-%d", i+2))
		if got := res.header.Get(headerBackend); got != first {
			t.Fatalf("X-Session-ID did not win over session-id: %s, then %s", first, got)
		}
	}
}

// TestLoadRoutedEndpoints: the engines' other endpoints (embeddings,
// rerank at /rerank, tokenize at /tokenize, Anthropic's count_tokens) are
// routed by load among the engines serving the model, counted, and retried
// on another engine before their first byte, as completions are.
func TestLoadRoutedEndpoints(t *testing.T) {
	r := newRig(t, "round-robin", 2, nil)
	r.waitReady(http.StatusOK)
	r.backends[0].setMode(modeClose)
	for _, path := range []string{"/v1/embeddings", "/rerank", "/tokenize", "/v1/messages/count_tokens"} {
		for i := range 4 {
			body := fmt.Sprintf(`{"model":"shared","input":"x%d"}`, i)
			res := r.post(path, body)
			if res.status != http.StatusOK || string(res.body) != body || res.header.Get(headerBackend) != "b1" {
				t.Fatalf("%s: %d from %q %s, want the echo from b1 (b0 closes every connection)", path, res.status, res.header.Get(headerBackend), res.body)
			}
		}
	}
	if got := counterValue(r.srv.metrics.retries); got == 0 {
		t.Fatalf("retries counted %v", got)
	}
}

// TestMessagesAuthErrorShape: the router's own refusals before any
// exchange (here the API key check) are in Anthropic's shape on the
// Messages API's paths, in OpenAI's elsewhere.
func TestMessagesAuthErrorShape(t *testing.T) {
	r := limitedRig(t, "the-key", "", 1000)
	for _, path := range []string{"/v1/messages", "/v1/messages/count_tokens", "/v1/chat/completions"} {
		res := r.post(path, `{"model":"shared","max_tokens":1,"messages":[{"role":"user","content":"x"}]}`)
		var a openai.AnthropicError
		var o openai.ErrorBody
		anthropic := json.Unmarshal(res.body, &a) == nil && a.Type == "error" && a.Error.Type == "authentication_error"
		oai := json.Unmarshal(res.body, &o) == nil && o.Error.Type == openai.TypeAuthentication
		if res.status != http.StatusUnauthorized || anthropic != strings.HasPrefix(path, "/v1/messages") || !oai && !anthropic {
			t.Fatalf("%s: %d %s", path, res.status, res.body)
		}
	}
}
