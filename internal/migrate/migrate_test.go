package migrate

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/kvroute/kvroute/internal/request"
)

func view(t *testing.T, kind request.Kind, body string) *request.View {
	t.Helper()
	v, e := request.Parse(kind, []byte(body), request.Options{})
	if e != nil {
		t.Fatalf("parse %s: %v", body, e)
	}
	return v
}

func TestBody(t *testing.T) {
	cases := []struct {
		name string
		kind request.Kind
		body string
		text string
		sent int
		want string // "" when refused
		err  error
	}{
		{"chat", request.Chat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":10}`, " the and", 2,
			`{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":" the and"}],"stream":true,"max_tokens":8,"continue_final_message":true,"add_generation_prompt":false}`, nil},
		{"chat without budget", request.Chat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`, "a\"b", 1,
			`{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"a\"b"}],"stream":true,"continue_final_message":true,"add_generation_prompt":false}`, nil},
		{"max_completion_tokens, min_tokens, generation prompt", request.Chat,
			`{"model":"m","messages":[ {"role":"user","content":"hi"} ] ,"stream":true,"max_tokens":99,"max_completion_tokens":10,"min_tokens":5,"add_generation_prompt":true,"seed":7}`, "x", 3,
			`{"model":"m","messages":[ {"role":"user","content":"hi"} ,{"role":"assistant","content":"x"}],"stream":true,"seed":7,"max_completion_tokens":7,"min_tokens":2,"continue_final_message":true,"add_generation_prompt":false}`, nil},
		{"repeated key", request.Chat, `{"model":"a","model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`, "x", 1,
			`{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"x"}],"stream":true,"continue_final_message":true,"add_generation_prompt":false}`, nil},
		{"completion", request.Completion, `{"model":"m","prompt":"once","stream":true,"max_tokens":4,"stream_options":{"include_usage":true}}`, " upon", 1,
			`{"model":"m","prompt":"once upon","stream":true,"stream_options":{"include_usage":true},"max_tokens":3}`, nil},
		{"tool_choice none", request.Chat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"none"}`, "x", 1,
			`{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"x"}],"stream":true,"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"none","continue_final_message":true,"add_generation_prompt":false}`, nil},
		{"n", request.Chat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"n":2}`, "x", 1, "", RefuseChoices},
		{"n 1", request.Chat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"n":1}`, "x", 1,
			`{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"x"}],"stream":true,"n":1,"continue_final_message":true,"add_generation_prompt":false}`, nil},
		{"best_of", request.Completion, `{"model":"m","prompt":"p","stream":true,"best_of":3}`, "x", 1, "", RefuseChoices},
		{"echo", request.Completion, `{"model":"m","prompt":"p","stream":true,"echo":true}`, "x", 1, "", RefuseEcho},
		{"prompt logprobs", request.Chat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"prompt_logprobs":1}`, "x", 1, "", RefuseLogprobs},
		{"guided", request.Chat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"guided_json":{}}`, "x", 1, "", RefuseGuided},
		{"structured outputs", request.Chat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"structured_outputs":{"regex":"a"}}`, "x", 1, "", RefuseGuided},
		{"json mode", request.Chat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"response_format":{"type":"json_object"}}`, "x", 1, "", RefuseGuided},
		{"text format", request.Chat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"response_format":{"type":"text"}}`, "x", 1,
			`{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"x"}],"stream":true,"response_format":{"type":"text"},"continue_final_message":true,"add_generation_prompt":false}`, nil},
		{"tools", request.Chat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"tools":[{"type":"function","function":{"name":"f"}}]}`, "x", 1, "", RefuseTools},
		{"client continuation", request.Chat, `{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"a"}],"stream":true,"continue_final_message":true}`, "x", 1, "", RefuseContinued},
		{"token prompt", request.Completion, `{"model":"m","prompt":[1,2,3],"stream":true}`, "x", 1, "", RefusePrompt},
		{"prompts", request.Completion, `{"model":"m","prompt":["a","b"],"stream":true}`, "x", 1, "", RefusePrompt},
		{"continuous usage", request.Chat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}`, "x", 1, "", RefuseUsage},
		{"not a stream", request.Chat, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, "x", 1, "", RefuseNotStream},
		{"budget spent", request.Chat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":3}`, "xyz", 3, "", RefuseBudget},
		{"responses", request.Responses, `{"model":"m","input":"hi","stream":true}`, "x", 1, "", RefuseKind},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := view(t, c.kind, c.body)
			got, err := Body(v, []byte(c.body), c.text, c.sent)
			if c.err != nil {
				if !errors.Is(err, c.err) {
					t.Fatalf("got %s, %v; want %v", got, err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != c.want {
				t.Fatalf("got\n%s\nwant\n%s", got, c.want)
			}
			// The continuation parses, and its prompt is the original's
			// followed by the text: the original engine's cache is its
			// prefix.
			nv := view(t, c.kind, string(got))
			if nv.Prompt != v.Prompt+c.text {
				t.Fatalf("continuation prompt %q, want %q", nv.Prompt, v.Prompt+c.text)
			}
			if c.kind == request.Chat && nv.Continues != len(c.text) {
				t.Fatalf("continues %d, want %d", nv.Continues, len(c.text))
			}
		})
	}
}

// chunk is a chat chunk of a stream with id, created.
func chunk(id string, created int, delta, finish string) string {
	f := "null"
	if finish != "" {
		f = `"` + finish + `"`
	}
	return `data: {"id":"` + id + `","object":"chat.completion.chunk","created":` + itoa(created) + `,"model":"m","choices":[{"index":0,"delta":` + delta + `,"finish_reason":` + f + "}]}\n\n"
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// breaking is a body that gives its bytes in reads of at most step, then
// fails with err.
type breaking struct {
	b    []byte
	step int
	err  error
}

func (r *breaking) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, r.err
	}
	n := copy(p[:min(len(p), r.step)], r.b)
	r.b = r.b[n:]
	return n, nil
}

func (r *breaking) Close() error { return nil }

// TestSplice checks the client's stream of an answer moved between
// engines: one id and creation, one role chunk, the text whole, the usage
// as of one engine, one [DONE]; and the events of the broken engine cut at
// an event's boundary.
func TestSplice(t *testing.T) {
	first := chunk("a", 1, `{"role":"assistant","content":""}`, "") +
		chunk("a", 1, `{"content":" the"}`, "") +
		chunk("a", 1, `{"content":" a\"nd"}`, "") +
		`data: {"id":"a","obj` // broken inside an event
	second := chunk("b", 2, `{"role":"assistant","content":""}`, "") +
		chunk("b", 2, `{"content":" for"}`, "") +
		chunk("b", 2, `{"content":" you"}`, "length") +
		`data: {"id":"b","object":"chat.completion.chunk","created":2,"model":"m","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":2,"total_tokens":14,"prompt_tokens_details":{"cached_tokens":8}}}` + "\n\n" +
		"data: [DONE]\n\n"
	for _, step := range []int{1, 7, 1 << 20} {
		s := NewStream([]byte(first[:5]), nil, &breaking{b: []byte(first[5:]), step: step, err: io.ErrUnexpectedEOF})
		got, err := io.ReadAll(s)
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("step %d: err %v", step, err)
		}
		if want := first[:strings.LastIndex(first, "data:")]; string(got) != want {
			t.Fatalf("step %d: first leg %q, want %q", step, got, want)
		}
		if s.Text() != ` the a"nd` || s.Tokens() != 2 || s.Finished() {
			t.Fatalf("step %d: text %q tokens %d finished %v", step, s.Text(), s.Tokens(), s.Finished())
		}
		s.Swap(nil, nil, &breaking{b: []byte(second), step: step, err: io.EOF})
		rest, err := io.ReadAll(s)
		if err != nil {
			t.Fatal(err)
		}
		want := `data: {"choices":[{"delta":{"content":" for"},"finish_reason":null,"index":0}],"created":1,"id":"a","model":"m","object":"chat.completion.chunk"}` + "\n\n" +
			`data: {"choices":[{"delta":{"content":" you"},"finish_reason":"length","index":0}],"created":1,"id":"a","model":"m","object":"chat.completion.chunk"}` + "\n\n" +
			`data: {"choices":[],"created":1,"id":"a","model":"m","object":"chat.completion.chunk","usage":{"prompt_tokens":10,"completion_tokens":4,"total_tokens":14}}` + "\n\n" +
			"data: [DONE]\n\n"
		if string(rest) != want {
			t.Fatalf("step %d: second leg\n%s\nwant\n%s", step, rest, want)
		}
		if s.Text() != ` the a"nd for you` || s.Tokens() != 4 || !s.Finished() || !s.Done() || s.Moves() != 1 {
			t.Fatalf("step %d: text %q tokens %d", step, s.Text(), s.Tokens())
		}
	}
}

// TestSpliceEngineError: an engine's error event (vLLM's when its engine
// dies) breaks the stream: neither it nor the [DONE] after it reaches the
// client.
func TestSpliceEngineError(t *testing.T) {
	body := chunk("a", 1, `{"content":"x"}`, "") +
		`data: {"error":{"message":"engine dead","type":"InternalServerError","code":500}}` + "\n\n" + "data: [DONE]\n\n"
	s := NewStream(nil, nil, &breaking{b: []byte(body), step: 1 << 20, err: io.EOF})
	got, err := io.ReadAll(s)
	if !errors.Is(err, ErrEngineError) || string(got) != chunk("a", 1, `{"content":"x"}`, "") {
		t.Fatalf("got %q, %v", got, err)
	}
}

// TestSpliceFinished: an answer whose engine broke after its finish is
// ended with [DONE] (End), nothing continued; a tool call is noted as
// more than text.
func TestSpliceFinished(t *testing.T) {
	body := chunk("a", 1, `{"content":"x"}`, "stop")
	s := NewStream(nil, nil, &breaking{b: []byte(body), step: 3, err: io.ErrUnexpectedEOF})
	if _, err := io.ReadAll(s); err == nil || !s.Finished() {
		t.Fatalf("err %v finished %v", err, s.Finished())
	}
	s.End()
	got, err := io.ReadAll(s)
	if err != nil || string(got) != "data: [DONE]\n\n" {
		t.Fatalf("got %q %v", got, err)
	}
	tool := chunk("a", 1, `{"tool_calls":[{"index":0,"id":"c","function":{"name":"f","arguments":""}}]}`, "")
	s = NewStream(nil, nil, &breaking{b: []byte(tool), step: 99, err: io.ErrUnexpectedEOF})
	_, _ = io.ReadAll(s)
	if !errors.Is(s.Refused(), RefuseNotContent) {
		t.Fatalf("refused %v", s.Refused())
	}
}

// TestSpliceCompletion: a completion stream, whose chunks carry text.
func TestSpliceCompletion(t *testing.T) {
	c := func(id, text, finish string) string {
		f := "null"
		if finish != "" {
			f = `"` + finish + `"`
		}
		return `data: {"id":"` + id + `","object":"text_completion","created":5,"model":"m","choices":[{"index":0,"text":"` + text + `","logprobs":null,"finish_reason":` + f + "}]}\r\n\r\n"
	}
	s := NewStream(nil, nil, &breaking{b: []byte(c("a", "x", "") + c("a", "y", "")), step: 5, err: io.ErrUnexpectedEOF})
	first, _ := io.ReadAll(s)
	s.Swap(nil, nil, &breaking{b: []byte(c("b", "z", "stop") + "data: [DONE]\r\n\r\n"), step: 5, err: io.EOF})
	rest, err := io.ReadAll(s)
	if err != nil || s.Text() != "xyz" || !strings.Contains(string(rest), `"id":"a"`) || strings.Contains(string(rest), `"id":"b"`) ||
		!strings.HasSuffix(string(rest), "data: [DONE]\r\n\r\n") || string(first) != c("a", "x", "")+c("a", "y", "") {
		t.Fatalf("first %q rest %q err %v text %q", first, rest, err, s.Text())
	}
}

// FuzzStream feeds a Stream any bytes from two engines, broken anywhere:
// it never panics, hands on whole events only before a break, and the
// text it reports is what its first engine's events carried.
func FuzzStream(f *testing.F) {
	f.Add([]byte(chunk("a", 1, `{"role":"assistant","content":"x"}`, "")), []byte(chunk("b", 2, `{"content":"y"}`, "stop")+"data: [DONE]\n\n"), 3)
	f.Add([]byte("data: {\"choices\":[{\"text\":\"\\u00e9\\\"\"}]}\r\n\r\n: c\n\ndata: [DONE]\n\n"), []byte(`data: {"choices":null,"usage":{"prompt_tokens":-1}}`+"\n\n"), 1)
	f.Add([]byte(`data: {"error":{}}`+"\n\n"), []byte("data: {\"id\":1,\"choices\":[{\"delta\":[]}]}\n\n"), 2)
	f.Fuzz(func(t *testing.T, a, b []byte, step int) {
		step = max(1, step%64+1)
		s := NewStream(nil, nil, &breaking{b: a, step: step, err: io.ErrUnexpectedEOF})
		got, err := io.ReadAll(s)
		if err == nil {
			t.Fatal("a broken body read as whole")
		}
		if errors.Is(err, io.ErrUnexpectedEOF) && len(got) > 0 {
			if !endsEvent(got) {
				t.Fatalf("a partial event was handed on: %q", got)
			}
		}
		s.Swap(nil, nil, &breaking{b: b, step: step, err: io.EOF})
		_, _ = io.ReadAll(s)
		_ = s.Text()
	})
}

// FuzzBody builds continuations of any chat or completion body: never a
// panic, and a continuation that parses with the text at its prompt's end.
func FuzzBody(f *testing.F) {
	f.Add(true, []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":9}`), "x\u2028", 2)
	f.Add(false, []byte(`{"model":"m","prompt":"p","stream":true,"min_tokens":3}`), "\xff", 1)
	f.Fuzz(func(t *testing.T, chat bool, body []byte, text string, sent int) {
		kind := request.Completion
		if chat {
			kind = request.Chat
		}
		v, e := request.Parse(kind, body, request.Options{})
		if e != nil {
			return
		}
		got, err := Body(v, body, text, sent)
		if err != nil {
			return
		}
		nv, e := request.Parse(kind, got, request.Options{})
		if e != nil {
			t.Fatalf("continuation %s does not parse: %v", got, e)
		}
		// JSON carries valid UTF-8 only (an invalid byte becomes U+FFFD).
		if utf8.ValidString(text) && !strings.HasSuffix(nv.Prompt, text) {
			t.Fatalf("continuation prompt %q does not end with %q", nv.Prompt, text)
		}
	})
}

// endsEvent reports whether b ends at an empty line: the end of an event.
func endsEvent(b []byte) bool {
	for _, end := range []string{"\n\n", "\n\r\n"} {
		if bytes.HasSuffix(b, []byte(end)) {
			return true
		}
	}
	return string(b) == "\n" || string(b) == "\r\n"
}

func TestLimits(t *testing.T) {
	cases := []struct {
		name  string
		l     Limits
		free  []bool // each attempt's freedom, in order
		want  []bool
		spent int
	}{
		{"off", Limits{}, []bool{true, false}, []bool{false, false}, 0},
		{"two", Limits{MaxAttempts: 2}, []bool{false, false, false}, []bool{true, true, false}, 2},
		{"drain's first free", Limits{MaxAttempts: 1}, []bool{true, false, false}, []bool{true, true, false}, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			spent := 0
			for i, f := range c.free {
				if got := c.l.Attempt(&spent, f); got != c.want[i] {
					t.Fatalf("attempt %d (free %v): %v, want %v", i, f, got, c.want[i])
				}
			}
			if spent != c.spent {
				t.Fatalf("spent %d, want %d", spent, c.spent)
			}
		})
	}
	l := Limits{MaxAttempts: 1, MaxContextTokens: 100}
	if l.Fits(100) != nil || !errors.Is(l.Fits(101), ErrTooLong) || (Limits{}).Fits(1<<30) != nil {
		t.Fatal("Fits: want nil at the bound, ErrTooLong over it, nil without one")
	}
}
