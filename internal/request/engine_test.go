package request

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
)

// TestEngineReading holds Parse to the engine's reading of bodies that a
// client can craft to be routed as one request and served as another
// (docs/reliability.md, "The router and the engine read one request"): a
// key that differs from a field's name by case or Unicode folding is an
// unknown field to the engine, and a repeated key's last value replaces
// the others whole.
func TestEngineReading(t *testing.T) {
	user := func(content string) string { return `{"role":"user","content":"` + content + `"}` }
	long := strings.Repeat("lorem ipsum ", 50000) // 600 KB
	tests := []struct {
		name string
		kind Kind
		body string
		want func(v *View) error
	}{
		{"STREAM is not stream", Chat, `{"messages":[` + user("hi") + `],"stream":false,"STREAM":true}`, stream(false)},
		{"ſtream is not stream", Chat, `{"messages":[` + user("hi") + `],"stream":false,"ſtream":true}`, stream(false)},
		{"Stream alone is not stream", Completion, `{"prompt":"p","Stream":true}`, stream(false)},
		{"escaped stream is stream", Chat, `{"messages":[` + user("hi") + `],"str\u0065am":true}`, stream(true)},
		{"last stream wins", Chat, `{"messages":[` + user("hi") + `],"stream":true,"stream":false}`, stream(false)},
		{"null stream after true", Chat, `{"messages":[` + user("hi") + `],"stream":true,"stream":null}`, stream(false)},
		{"MESSAGES are not messages", Chat, `{"model":"m","messages":[` + user(long) + `],"MESSAGES":[{"content":"hi"}]}`, func(v *View) error {
			if v.PromptTokens < len(long)/BytesPerToken || v.FirstUser != long {
				return fmt.Errorf("%d prompt tokens, first user message of %d bytes; want the %d-byte message", v.PromptTokens, len(v.FirstUser), len(long))
			}
			return nil
		}},
		{"MODEL is not model", Chat, `{"model":"a","MODEL":"b","messages":[` + user("hi") + `]}`, model("a")},
		{"Model alone is not model", Completion, `{"Model":"b","prompt":"p"}`, model("")},
		{"last model wins", Completion, `{"model":"a","model":"b","prompt":"p"}`, model("b")},
		{"MAX_TOKENS is not max_tokens", Completion, `{"prompt":"p","max_tokens":7,"MAX_TOKENS":100000}`, func(v *View) error {
			if v.MaxTokens != 7 {
				return fmt.Errorf("max tokens %d, want 7", v.MaxTokens)
			}
			return nil
		}},
		{"Content of a message is not content", Chat, `{"messages":[{"role":"user","content":"` + long + `","Content":"hi"}]}`, func(v *View) error {
			if v.FirstUser != long {
				return fmt.Errorf("first user message of %d bytes, want %d", len(v.FirstUser), len(long))
			}
			return nil
		}},
		{"TEXT of a part is not text", Chat, `{"messages":[{"role":"user","content":[{"type":"text","text":"a","TEXT":"b"}]}]}`, func(v *View) error {
			if v.FirstUser != "a" {
				return fmt.Errorf("first user message %q, want %q", v.FirstUser, "a")
			}
			return nil
		}},
		{"STREAM_OPTIONS are not stream_options", Chat, `{"messages":[` + user("hi") + `],"stream":true,"STREAM_OPTIONS":{"include_usage":true}}`, func(v *View) error {
			if v.IncludeUsage {
				return fmt.Errorf("include_usage set")
			}
			return nil
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, e := Parse(tt.kind, []byte(tt.body), Options{})
			if e != nil {
				t.Fatalf("Parse: %v", e)
			}
			if err := tt.want(v); err != nil {
				t.Fatal(err)
			}
			engineAgrees(t, tt.kind, []byte(tt.body))
		})
	}
}

func stream(want bool) func(v *View) error {
	return func(v *View) error {
		if v.Stream != want {
			return fmt.Errorf("stream %v, want %v", v.Stream, want)
		}
		return nil
	}
}

func model(want string) func(v *View) error {
	return func(v *View) error {
		if v.Model != want {
			return fmt.Errorf("model %q, want %q", v.Model, want)
		}
		return nil
	}
}

// FuzzEngineReading is the differential test of Parse against Python's
// json.loads, which the Python engines read a body with: a long-lived
// python3 (testdata/jsonloads.py) reads each body with json.loads and
// derives the view from the dict it gets. Parse must refuse every body
// json.loads refuses, and the bodies it refuses on purpose (see scan.go);
// every body it accepts must give the view Python derives, field by field;
// and a view error must have the code Python finds. It skips when
// /usr/bin/python3 is missing.
func FuzzEngineReading(f *testing.F) {
	for _, b := range seedBodies(f) {
		f.Add(b, false)
		f.Add(b, true)
	}
	for _, s := range []string{
		`{"stream":false,"STREAM":true,"messages":[{"role":"user","content":"x"}]}`,
		`{"model":"a","MODEL":"b","m\u006fdel":"c","prompt":["a","b"]}`,
		`{"messages":[{"role":"user","content":"a"}],"MESSAGES":[{"content":"hi"}],"user":{"id":[1, 2]}}`,
		`{"prompt":[[1,2],[3]],"max_tokens":5,"max_tokens":null,"stream_options":{"include_usage":true}}`,
		`{"tools":[{"b" : 1, "a":[2.50, "\u00e9"], "a":0}],"messages":[{"role":"user","content":[{"type":"text","text":"t"},{"type":"image_url"}]}]}`,
		`{"prompt":"p","x":NaN}`,
		`{"prompt":"\ud800"}`,
		"\xef\xbb\xbf{\"prompt\":\"p\"}",
		"{\"prompt\":\"p\"}\v",
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, body []byte, completion bool) {
		k := Chat
		if completion {
			k = Completion
		}
		engineAgrees(t, k, body)
	})
}

// engineAgrees fails unless Parse and the engine's reading agree on body
// (see FuzzEngineReading); it skips without python3.
func engineAgrees(t *testing.T, k Kind, body []byte) {
	t.Helper()
	const session = "user"
	v, e := Parse(k, body, Options{SessionField: session})
	var tools, key string
	if e == nil {
		tools, key = parsedTools(k, body), v.SessionKey
	}
	got := engine(t, k, body, session, tools, key)
	switch {
	case !got.Loads && e == nil:
		t.Fatalf("%s body %q: json.loads refuses it (%s), Parse gives %+v", k, body, got.Why, v)
	case got.Strict != "" && (e == nil || e.Code != "invalid_json"):
		t.Fatalf("%s body %q: refused on purpose (%s), Parse gives %+v, %v", k, body, got.Strict, v, e)
	case got.Code != "" && (e == nil || e.Code != got.Code):
		t.Fatalf("%s body %q: the engine's reading refuses it with %s, Parse gives %+v, %v", k, body, got.Code, v, e)
	case got.View != nil && e != nil:
		t.Fatalf("%s body %q: Parse refuses it (%v), the engine reads %s", k, body, e, got.View)
	case got.View != nil:
		var want View
		dec := json.NewDecoder(bytes.NewReader(got.View))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&want); err != nil {
			t.Fatalf("%s body %q: the engine's reading differs: %s", k, body, got.View)
		}
		want.Kind = k
		if *v != want {
			t.Fatalf("%s body %q: Parse gives\n%+v\nthe engine reads\n%+v", k, body, *v, want)
		}
	}
}

// parsedTools is the text of body's tools as Parse keeps them, one
// compact JSON value a line.
func parsedTools(k Kind, body []byte) string {
	d := new(decoder)
	d.reset(k, trimSpace(body), Options{})
	if !d.body() {
		return ""
	}
	var sb strings.Builder
	d.writeSegs(&sb, d.tools.lo, d.tools.hi)
	return sb.String()
}

// engineAnswer is testdata/jsonloads.py's answer.
type engineAnswer struct {
	Loads  bool
	Why    string
	Strict string
	Code   string
	View   json.RawMessage
}

// oracle is one python3 process running testdata/jsonloads.py, shared by
// the tests of this process.
var oracle struct {
	sync.Mutex
	once sync.Once
	err  error
	in   io.Writer
	out  *bufio.Reader
}

func engine(t *testing.T, k Kind, body []byte, session, tools, key string) engineAnswer {
	t.Helper()
	const python = "/usr/bin/python3"
	if _, err := os.Stat(python); err != nil {
		t.Skipf("the engine's reading needs %s (Debian's python3): %v", python, err)
	}
	oracle.once.Do(func() {
		cmd := exec.Command(python, "testdata/jsonloads.py")
		cmd.Stderr = os.Stderr
		in, err := cmd.StdinPipe()
		if err != nil {
			oracle.err = err
			return
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			oracle.err = err
			return
		}
		oracle.in, oracle.out, oracle.err = in, bufio.NewReader(out), cmd.Start()
		// The process ends when this one does and its stdin closes.
	})
	if oracle.err != nil {
		t.Fatalf("start %s: %v", python, oracle.err)
	}
	oracle.Lock()
	defer oracle.Unlock()
	head, _ := json.Marshal(map[string]any{"kind": k.String(), "n": len(body), "session": session, "tools": tools, "session_key": key})
	if _, err := oracle.in.Write(append(append(head, '\n'), body...)); err != nil {
		t.Fatalf("write to %s: %v", python, err)
	}
	line, err := oracle.out.ReadBytes('\n')
	if err != nil {
		t.Fatalf("read from %s: %v", python, err)
	}
	var a engineAnswer
	if err := json.Unmarshal(line, &a); err != nil {
		t.Fatalf("answer %q: %v", line, err)
	}
	return a
}
