package lifecycle

import (
	"strings"
	"testing"
	"time"
)

// tallyOf reads body through a tally in pieces of at most step bytes.
func tallyOf(body []byte, sse bool, step int) *Tally { return agentTallyOf(body, sse, false, step) }

// agentTallyOf is tallyOf for a Responses or Messages body when agent.
func agentTallyOf(body []byte, sse, agent bool, step int) *Tally {
	t := &Tally{SSE: sse, Agent: agent}
	now := time.Unix(0, 0)
	for len(body) > 0 {
		n := min(step, len(body))
		t.Note(body[:n], now)
		body = body[n:]
	}
	t.Finish()
	return t
}

func TestTally(t *testing.T) {
	stream := ": comment\n\n" +
		`data: {"model":"llama","choices":[{"delta":{"role":"assistant","content":""}}]}` + "\n\n" +
		`data: {"model":"llama","choices":[{"delta":{"content":"a"}}]}` + "\r\n\r\n" +
		`data: {"model":"llama","choices":[{"text":"b"}]}` + "\n\n" +
		`data: {"model":"llama","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":9,"total_tokens":16}}` + "\n\n" +
		"data: [DONE]\n\n"
	json := `{"id":"x","model":"llama","choices":[{"message":{"content":"the \"usage\":{ in text"}}],"usage":{"prompt_tokens":5,"completion_tokens":6,"total_tokens":11},"kv_transfer_params":null}`
	tests := []struct {
		name               string
		body               string
		sse                bool
		chunks, out, in    int
		model              string
		usage              bool
		longLineSkippedToo bool
	}{
		{name: "stream with usage", body: stream, sse: true, chunks: 2, out: 9, in: 7, model: "llama", usage: true},
		{name: "stream without usage", body: strings.Replace(stream, `"usage"`, `"nousage"`, 1), sse: true, chunks: 2, out: 2, model: "llama"},
		{name: "JSON", body: json, out: 6, in: 5, model: "llama", usage: true},
		{name: "JSON with a long text before the usage", body: `{"model":"m","choices":[{"text":"` + strings.Repeat("x", 100<<10) + `"}],"usage":{"prompt_tokens":1,"completion_tokens":2}}`, out: 2, in: 1, model: "m", usage: true},
		{name: "stream with a line over the bound", body: "data: {\"choices\":[{\"text\":\"" + strings.Repeat("y", maxTallyLine) + "\"}]}\n\n" + `data: {"choices":[{"text":"z"}]}` + "\n\n", sse: true, chunks: 1, out: 1},
	}
	for _, tt := range tests {
		for _, step := range []int{1, 7, 4096, len(tt.body)} {
			got := tallyOf([]byte(tt.body), tt.sse, step)
			if got.chunks != tt.chunks || got.Output() != tt.out || got.model != tt.model || (got.usage != nil) != tt.usage {
				t.Errorf("%s, step %d: chunks %d, output %d, model %q, usage %v; want %d, %d, %q, %v",
					tt.name, step, got.chunks, got.Output(), got.model, got.usage, tt.chunks, tt.out, tt.model, tt.usage)
			}
			if tt.usage && got.usage.PromptTokens != tt.in {
				t.Errorf("%s, step %d: prompt tokens %d, want %d", tt.name, step, got.usage.PromptTokens, tt.in)
			}
			if len(got.line) > maxTallyLine || len(got.tail) > tallyTail {
				t.Errorf("%s, step %d: holds %d line and %d tail bytes", tt.name, step, len(got.line), len(got.tail))
			}
		}
	}
}

// TestTallyCached: the engine's reported cached tokens are read from
// vLLM's and SGLang's usage (streamed and whole) and from llama.cpp's
// timings (cache_n, or its prompt tokens less prompt_n), and a response
// that reports none reads as none, never as a hit of 0.
func TestTallyCached(t *testing.T) {
	usage := `"usage":{"prompt_tokens":100,"completion_tokens":3,"total_tokens":103,"prompt_tokens_details":{"cached_tokens":64}}`
	llama := `"usage":{"completion_tokens":3,"prompt_tokens":100,"total_tokens":103},"timings":{"prompt_n":30,"prompt_ms":12.5,"predicted_n":3}`
	llamaNew := `"timings":{"cache_n":80,"prompt_n":20,"prompt_ms":12.5},"usage":{"completion_tokens":3,"prompt_tokens":100,"total_tokens":103}`
	stream := func(last string) string {
		return `data: {"choices":[{"delta":{"content":"a"}}]}` + "\n\n" + `data: {"choices":[],` + last + "}\n\ndata: [DONE]\n\n"
	}
	tests := []struct {
		name   string
		body   string
		sse    bool
		cached int
		ok     bool
	}{
		{"vLLM stream", stream(usage), true, 64, true},
		{"vLLM JSON", `{"model":"m","choices":[{"message":{"content":"hi"}}],` + usage + `}`, false, 64, true},
		{"vLLM without prompt details", `{"model":"m","choices":[],"usage":{"prompt_tokens":100,"completion_tokens":3,"prompt_tokens_details":null}}`, false, 0, false},
		{"llama.cpp stream", stream(llama), true, 70, true},
		{"llama.cpp JSON", `{"choices":[{"message":{"content":"hi"}}],"created":1,` + llama + `}`, false, 70, true},
		{"llama.cpp with cache_n", `{"choices":[],` + llamaNew + `}`, false, 80, true},
		{"llama.cpp stream with cache_n", stream(llamaNew), true, 80, true},
		{"no usage", stream(`"x":1`), true, 0, false},
	}
	for _, tt := range tests {
		for _, step := range []int{1, 5, len(tt.body)} {
			c, prompt, ok := tallyOf([]byte(tt.body), tt.sse, step).Cached()
			if c != tt.cached || ok != tt.ok || (ok && prompt != 100) {
				t.Errorf("%s, step %d: cached %d of %d, ok %v; want %d of 100, %v", tt.name, step, c, prompt, ok, tt.cached, tt.ok)
			}
		}
	}
}

// FuzzTally: whatever a backend sends, the tally neither panics nor holds
// more than its bounds, and reads the same however the bytes are split.
func FuzzTally(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"usage\":{\"completion_tokens\":3}}\n\n"), true, 3)
	f.Add([]byte(`{"model":"m","usage":{"prompt_tokens":1}}`), false, 5)
	f.Add([]byte("data: {\"usage\":{\"prompt_tokens\":9},\"timings\":{\"prompt_n\":4}}\n\n"), true, 2)
	f.Add([]byte(`{"usage":{"prompt_tokens":9,"prompt_tokens_details":{"cached_tokens":-3}},"timings":{"cache_n":5}}`), false, 4)
	// A negative step reads the body as a Responses or Messages answer.
	f.Add([]byte("event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\"}}\n\nevent: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"a\"}\n\nevent: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":4,\"output_tokens\":1,\"input_tokens_details\":{\"cached_tokens\":-2}}}}\n\n"), true, -3)
	f.Add([]byte("data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":7}}}\n\ndata: {\"type\":\"content_block_delta\"}\n\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":2,\"cache_read_input_tokens\":5}}\n\n"), true, -5)
	f.Add([]byte(`{"id":"resp_9","usage":{"input_tokens":3,"output_tokens":1}}`), false, -2)
	f.Fuzz(func(t *testing.T, body []byte, sse bool, step int) {
		agent := step < 0
		step = 1 + abs(step)%64
		whole, split := agentTallyOf(body, sse, agent, len(body)+1), agentTallyOf(body, sse, agent, step)
		if agent && sse && whole.responseID != split.responseID {
			t.Fatalf("response id %q whole, %q split by %d", whole.responseID, split.responseID, step)
		}
		if len(split.line) > maxTallyLine || len(split.tail) > tallyTail {
			t.Fatalf("holds %d line and %d tail bytes", len(split.line), len(split.tail))
		}
		if sse && (whole.chunks != split.chunks || whole.Output() != split.Output()) {
			t.Fatalf("whole: %d chunks, output %d; split by %d: %d, %d", whole.chunks, whole.Output(), step, split.chunks, split.Output())
		}
		wc, wp, wok := whole.Cached()
		sc, sp, sok := split.Cached()
		if sse && (wc != sc || wp != sp || wok != sok) {
			t.Fatalf("whole: cached %d of %d (%v); split by %d: %d of %d (%v)", wc, wp, wok, step, sc, sp, sok)
		}
		if wc < 0 || sc < 0 {
			t.Fatalf("negative cached tokens %d, %d", wc, sc)
		}
	})
}

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}

// BenchmarkTally is the tally's cost per event of a chat stream read one
// event per read, as the relay reads a stream flushed event by event.
func BenchmarkTally(b *testing.B) {
	chunk := []byte(`data: {"id":"c-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" token"},"finish_reason":null}]}` + "\n\n")
	const events = 500
	b.ReportAllocs()
	for b.Loop() {
		t := &Tally{SSE: true}
		for range events {
			t.Note(chunk, time.Now())
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*events), "ns/event")
}

// TestTallyAgents: the tally reads the Responses and Messages APIs'
// answers: text deltas as token chunks, their usage (Anthropic's split
// between message_start and message_delta), the cached tokens each
// reports, and a Responses answer's id.
func TestTallyAgents(t *testing.T) {
	for _, c := range []struct {
		name                    string
		body                    string
		sse                     bool
		chunks, out, in, cached int
		id                      string
	}{
		{"responses stream", "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\",\"usage\":null}}\n\n" +
			"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"a\"}\n\n" +
			"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"b\"}\n\n" +
			"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_1\",\"usage\":{\"input_tokens\":40,\"output_tokens\":2,\"input_tokens_details\":{\"cached_tokens\":32}}}}\n\n",
			true, 2, 2, 40, 32, "resp_1"},
		{"messages stream", "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"usage\":{\"input_tokens\":50,\"output_tokens\":1}}}\n\n" +
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"x\"}}\n\n" +
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":3,\"cache_read_input_tokens\":48}}\n\n",
			true, 1, 3, 50, 48, ""},
		{"responses JSON", `{"id":"resp_2","object":"response","output":[],"usage":{"input_tokens":9,"output_tokens":4,"input_tokens_details":{"cached_tokens":0}}}`,
			false, 0, 4, 9, 0, "resp_2"},
	} {
		tl := agentTallyOf([]byte(c.body), c.sse, true, 7)
		cached, in, ok := tl.Cached()
		if tl.chunks != c.chunks || tl.Output() != c.out || in != c.in || cached != c.cached || !ok || tl.responseID != c.id {
			t.Errorf("%s: %d chunks, %d out, %d in, %d cached (%v), id %q", c.name, tl.chunks, tl.Output(), in, cached, ok, tl.responseID)
		}
	}
}
