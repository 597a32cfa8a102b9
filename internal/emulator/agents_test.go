package emulator

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/request"
)

// namedEvents reads a stream of named server-sent events into their names
// and data payloads; every data line must follow its event line.
func namedEvents(t *testing.T, r io.Reader) (names, data []string) {
	t.Helper()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
		case strings.HasPrefix(line, "event: "):
			names = append(names, strings.TrimPrefix(line, "event: "))
		case strings.HasPrefix(line, "data: ") && len(names) == len(data)+1:
			data = append(data, strings.TrimPrefix(line, "data: "))
		default:
			t.Fatalf("line %q out of place", line)
		}
	}
	if len(names) != len(data) {
		t.Fatalf("%d events, %d data lines", len(names), len(data))
	}
	return names, data
}

func decodeJSON[T any](t *testing.T, resp *http.Response) T {
	t.Helper()
	defer resp.Body.Close()
	var v T
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestResponsesStore checks the Responses API's store: a stored response
// is continued by previous_response_id on its engine, with the prompt the
// chat rendering of the whole conversation (so the engine reuses the
// first turn's cache), and is unknown, in vLLM's 404 shape, elsewhere.
func TestResponsesStore(t *testing.T) {
	_, hs := newTestServer(t, 50)
	_, other := newTestServer(t, 50)
	ctx := context.Background()
	long := strings.Repeat("a long shared context to be cached ", 40)
	first := decodeJSON[openai.ResponseObject](t, post(t, ctx, hs.URL+"/v1/responses",
		map[string]any{"instructions": "Be brief.", "input": long, "max_output_tokens": 8}))
	if first.Status == "" || !strings.HasPrefix(first.ID, "resp_") || len(first.Output) != 1 || first.Usage == nil {
		t.Fatalf("answer %+v", first)
	}
	out := first.Output[0].Content[0].Text
	parsed, _ := request.Parse(request.Responses, []byte(`{"instructions":"Be brief.","input":`+quote(long)+`}`), request.Options{})
	if first.Usage.InputTokens != engine.Tokens(parsed.Prompt) {
		t.Fatalf("input tokens %d, want the parsed prompt's %d", first.Usage.InputTokens, engine.Tokens(parsed.Prompt))
	}

	second := decodeJSON[openai.ResponseObject](t, post(t, ctx, hs.URL+"/v1/responses",
		map[string]any{"input": "and then?", "previous_response_id": first.ID, "max_output_tokens": 4}))
	chat, _ := request.Parse(request.Chat, []byte(`{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":`+quote(long)+`},
		{"role":"assistant","content":`+quote(out)+`},{"role":"user","content":"and then?"}]}`), request.Options{})
	if second.Usage.InputTokens != engine.Tokens(chat.Prompt) {
		t.Fatalf("continuation's input tokens %d, want the whole conversation's %d", second.Usage.InputTokens, engine.Tokens(chat.Prompt))
	}
	if c := second.Usage.InputTokensDetails.CachedTokens; c < engine.Tokens(parsed.Prompt)/engine.BlockSize*engine.BlockSize-engine.BlockSize {
		t.Fatalf("continuation reused %d cached tokens of the first turn's %d", c, first.Usage.InputTokens)
	}

	resp := post(t, ctx, other.URL+"/v1/responses", map[string]any{"input": "x", "previous_response_id": first.ID})
	e := decodeError(t, resp)
	if resp.StatusCode != http.StatusNotFound || e.Type != openai.TypeInvalidRequest || e.Message != "Response with id '"+first.ID+"' not found." {
		t.Fatalf("elsewhere: %d %+v", resp.StatusCode, e)
	}

	// Not stored: not continued.
	unstored := decodeJSON[openai.ResponseObject](t, post(t, ctx, hs.URL+"/v1/responses", map[string]any{"input": "x", "store": false, "max_output_tokens": 1}))
	if resp := post(t, ctx, hs.URL+"/v1/responses", map[string]any{"input": "x", "previous_response_id": unstored.ID}); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("continuing an unstored response: %d", resp.StatusCode)
	}

	get := func(method, path string) *http.Response {
		req, _ := http.NewRequest(method, hs.URL+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	if got := decodeJSON[openai.ResponseObject](t, get("GET", "/v1/responses/"+first.ID)); got.ID != first.ID {
		t.Fatalf("GET gave %+v", got)
	}
	items := decodeJSON[struct{ Data []map[string]any }](t, get("GET", "/v1/responses/"+first.ID+"/input_items"))
	if len(items.Data) != 1 || items.Data[0]["role"] != "user" {
		t.Fatalf("input items %+v", items)
	}
	if resp := get("POST", "/v1/responses/"+first.ID+"/cancel"); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("cancel of a finished response: %d", resp.StatusCode)
	}
	if resp := get("DELETE", "/v1/responses/"+first.ID); resp.StatusCode != http.StatusOK {
		t.Fatalf("DELETE: %d", resp.StatusCode)
	}
	for _, m := range []string{"GET", "DELETE"} {
		if resp := get(m, "/v1/responses/"+first.ID); resp.StatusCode != http.StatusNotFound {
			t.Fatalf("%s after DELETE: %d", m, resp.StatusCode)
		}
	}
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// TestResponsesStream checks a streamed response's named events, vLLM's
// order, and that its completed event carries the usage and stores it.
func TestResponsesStream(t *testing.T) {
	_, hs := newTestServer(t, 50)
	resp := post(t, context.Background(), hs.URL+"/v1/responses", map[string]any{"input": "hi", "stream": true, "max_output_tokens": 1})
	defer resp.Body.Close()
	names, data := namedEvents(t, resp.Body)
	want := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
		"response.output_text.delta",
		"response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed"}
	if strings.Join(names, ",") != strings.Join(want, ",") {
		t.Fatalf("events %v, want %v", names, want)
	}
	var done openai.ResponseEvent
	if err := json.Unmarshal([]byte(data[len(data)-1]), &done); err != nil {
		t.Fatal(err)
	}
	var created openai.ResponseEvent
	_ = json.Unmarshal([]byte(data[0]), &created)
	if done.Response == nil || done.Response.Usage == nil || done.Response.Usage.OutputTokens != 1 || done.SequenceNumber != len(data)-1 ||
		created.Response == nil || created.Response.ID != done.Response.ID {
		t.Fatalf("completed event %s", data[len(data)-1])
	}
	if r := post(t, context.Background(), hs.URL+"/v1/responses", map[string]any{"input": "x", "previous_response_id": done.Response.ID, "max_output_tokens": 1}); r.StatusCode != http.StatusOK {
		t.Fatalf("continuing a streamed response: %d", r.StatusCode)
	}
}

// TestMessages checks the Messages API: Anthropic's answer, its stream
// events with the usage in message_delta, count_tokens, and errors in
// Anthropic's shape.
func TestMessages(t *testing.T) {
	_, hs := newTestServer(t, 50)
	ctx := context.Background()
	msgs := []map[string]any{{"role": "user", "content": "hello"}}
	m := decodeJSON[openai.MessagesResponse](t, post(t, ctx, hs.URL+"/v1/messages", map[string]any{"system": "s", "messages": msgs, "max_tokens": 1}))
	if m.Type != "message" || len(m.Content) != 1 || m.StopReason == nil || *m.StopReason != "max_tokens" || m.Usage.OutputTokens != 1 || m.Usage.InputTokens == 0 {
		t.Fatalf("answer %+v", m)
	}
	count := decodeJSON[map[string]int](t, post(t, ctx, hs.URL+"/v1/messages/count_tokens", map[string]any{"system": "s", "messages": msgs}))
	if count["input_tokens"] != m.Usage.InputTokens {
		t.Fatalf("count_tokens %v, the answer's usage %d", count, m.Usage.InputTokens)
	}
	resp := post(t, ctx, hs.URL+"/v1/messages", map[string]any{"messages": msgs, "max_tokens": 1, "stream": true})
	names, data := namedEvents(t, resp.Body)
	resp.Body.Close()
	want := "message_start,content_block_start,content_block_delta,content_block_stop,message_delta,message_stop"
	if strings.Join(names, ",") != want {
		t.Fatalf("events %v, want %s", names, want)
	}
	var delta openai.MessagesEvent
	if err := json.Unmarshal([]byte(data[4]), &delta); err != nil || delta.Usage == nil || delta.Usage.OutputTokens != 1 {
		t.Fatalf("message_delta %s", data[4])
	}
	for _, b := range []map[string]any{
		{"messages": msgs},
		{"messages": []any{}, "max_tokens": 1},
		{"model": "other", "messages": msgs, "max_tokens": 1},
	} {
		resp := post(t, ctx, hs.URL+"/v1/messages", b)
		e := decodeJSON[openai.AnthropicError](t, resp)
		if resp.StatusCode/100 != 4 || e.Type != "error" || e.Error.Type == "" || e.Error.Message == "" {
			t.Fatalf("%v: %d %+v", b, resp.StatusCode, e)
		}
	}
}
