package request

import (
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/kvroute/kvroute/internal/racetest"
)

// chatWith is a chat body whose one user message has the JSON text content
// as its content.
func chatWith(content string) string {
	return `{"messages":[{"role":"user","content":` + content + `}]}`
}

// TestParseEdges holds Parse to its reference on the corners of JSON and
// of its reading as the engine's json.loads reads it, and says what each
// gives.
func TestParseEdges(t *testing.T) {
	deep := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	tests := []struct {
		name string
		kind Kind
		body string
		// prompt is the wanted prompt text of a chat (without the
		// template around the user message) or completion; code is the
		// wanted error code instead.
		prompt, code string
	}{
		// Escapes and surrogates.
		{"simple escapes", Chat, chatWith(`"a\"b\\c\/d\be\ff\ng\rh\ti"`), "a\"b\\c/d\be\ff\ng\rh\ti", ""},
		{"unicode escape", Chat, chatWith(`"\u00e9\u20AC\u0000"`), "é€\x00", ""},
		{"surrogate pair", Chat, chatWith(`"\ud83d\ude00"`), "😀", ""},
		// A lone surrogate is a character of json.loads's text that UTF-8
		// cannot hold: refused, wherever it is.
		{"lone high surrogate", Chat, chatWith(`"\ud83dx"`), "", "invalid_json"},
		{"lone low surrogate", Chat, chatWith(`"\ude00\ud83d"`), "", "invalid_json"},
		{"high then non-surrogate escape", Chat, chatWith(`"\ud83d\u0041"`), "", "invalid_json"},
		{"two high surrogates", Chat, chatWith(`"\ud83d\ud83d\ude00"`), "", "invalid_json"},
		{"high surrogate at the end", Chat, chatWith(`"\ud83d"`), "", "invalid_json"},
		{"lone surrogate in a skipped string", Chat, `{"x":"\udfff",` + chatWith(`"x"`)[1:], "", "invalid_json"},
		{"lone surrogate in a key", Chat, `{"\ud800":1,` + chatWith(`"x"`)[1:], "", "invalid_json"},
		{"invalid escape", Chat, chatWith(`"\x"`), "", "invalid_json"},
		{"short unicode escape", Chat, chatWith(`"\u12"`), "", "invalid_json"},
		{"bad hex", Chat, chatWith(`"\u12g4"`), "", "invalid_json"},
		{"escape at the end", Chat, chatWith(`"\`), "", "invalid_json"},
		{"control character", Chat, chatWith("\"a\tb\""), "", "invalid_json"},
		{"DEL is allowed", Chat, chatWith("\"a\x7fb\""), "a\x7fb", ""},
		// Invalid UTF-8: json.loads refuses the body.
		{"invalid byte", Chat, chatWith("\"a\xffb\""), "", "invalid_json"},
		{"invalid bytes after an escape", Chat, chatWith("\"\\n\xff\xfe\""), "", "invalid_json"},
		{"truncated sequence", Chat, chatWith("\"\xe2\x82\""), "", "invalid_json"},
		{"encoded surrogate", Chat, chatWith("\"\xed\xa0\x80\""), "", "invalid_json"},
		{"overlong", Chat, chatWith("\"\xc0\xaf\""), "", "invalid_json"},
		{"invalid byte in a skipped string", Chat, `{"x":"` + strings.Repeat("a", 20) + "\xff\",\"y\":1," + chatWith(`"x"`)[1:], "", "invalid_json"},
		{"valid UTF-8 in a skipped string", Chat, `{"x":"` + strings.Repeat("é", 20) + `",` + chatWith(`"x"`)[1:], "x", ""},
		{"encoded U+FFFD stays", Chat, chatWith("\"\xef\xbf\xbd\""), "\uFFFD", ""},
		{"long string with an escape late", Chat, chatWith(`"` + strings.Repeat("abcdefgh", 9) + `\n"`), strings.Repeat("abcdefgh", 9) + "\n", ""},
		// Tools: compact.
		{"tools compacted", Chat, `{"tools":[ {"a" : [1, 2]} , "x y"],"messages":[{"role":"user"}]}`, "", ""},
		{"tools with invalid UTF-8", Chat, "{\"tools\":[\"\xff\xfe\", {\"k\": \"\xff\"}],\"messages\":[{\"role\":\"user\"}]}", "", "invalid_json"},
		{"tools not an array", Chat, `{"tools":{},"messages":[{"role":"user"}]}`, "", "invalid_json"},
		// Numbers.
		{"max_tokens integer", Completion, `{"prompt":"p","max_tokens":12}`, "p", ""},
		{"max_tokens negative zero", Completion, `{"prompt":"p","max_tokens":-0}`, "p", ""},
		{"max_tokens fraction", Completion, `{"prompt":"p","max_tokens":1.5}`, "", "invalid_json"},
		{"max_tokens integral fraction", Completion, `{"prompt":"p","max_tokens":1.0}`, "", "invalid_json"},
		{"max_tokens exponent", Completion, `{"prompt":"p","max_tokens":1e3}`, "", "invalid_json"},
		{"max_tokens max int64", Completion, `{"prompt":"p","max_tokens":9223372036854775807}`, "p", ""},
		{"max_tokens overflow", Completion, `{"prompt":"p","max_tokens":9223372036854775808}`, "", "invalid_json"},
		{"min_tokens min int64", Completion, `{"prompt":"p","min_tokens":-9223372036854775808}`, "", "invalid_min_tokens"},
		{"max_tokens string", Completion, `{"prompt":"p","max_tokens":"5"}`, "", "invalid_json"},
		{"max_tokens null", Completion, `{"prompt":"p","max_tokens":5,"max_tokens":null}`, "p", ""},
		{"leading zero", Completion, `{"prompt":"p","temperature":01}`, "", "invalid_json"},
		{"leading plus", Completion, `{"prompt":"p","temperature":+1}`, "", "invalid_json"},
		{"bare minus", Completion, `{"prompt":"p","temperature":-}`, "", "invalid_json"},
		{"dot without digits", Completion, `{"prompt":"p","temperature":1.}`, "", "invalid_json"},
		{"exponent without digits", Completion, `{"prompt":"p","temperature":1e+}`, "", "invalid_json"},
		{"skipped numbers", Completion, `{"prompt":"p","x":[-0.5e-3,0,1E9,12.25]}`, "p", ""},
		// Python converts an integer of at most 4,300 digits.
		{"integer at the digit limit", Completion, `{"prompt":"p","x":-` + strings.Repeat("9", maxIntDigits) + `}`, "p", ""},
		{"integer past the digit limit", Completion, `{"prompt":"p","x":` + strings.Repeat("9", maxIntDigits+1) + `}`, "", "invalid_json"},
		{"long number with a fraction", Completion, `{"prompt":"p","x":` + strings.Repeat("9", maxIntDigits+1) + `.5}`, "p", ""},
		{"long number with an exponent", Completion, `{"prompt":"p","x":` + strings.Repeat("9", maxIntDigits+1) + `e0}`, "p", ""},
		{"NaN", Completion, `{"prompt":"p","x":NaN}`, "", "invalid_json"},
		{"Infinity", Completion, `{"prompt":"p","x":-Infinity}`, "", "invalid_json"},
		{"token ids", Completion, `{"prompt":[0,-1,35,36,9223372036854775807]}`, "0 -1 z 10 1y2p0ij32e8e7 ", ""},
		{"token id fraction", Completion, `{"prompt":[1,2.5]}`, "", "invalid_prompt"},
		{"token id overflow", Completion, `{"prompt":[1,9223372036854775808]}`, "", "invalid_prompt"},
		// Prompt shapes, decided by the first element; the engine's model
		// takes no null among them.
		{"prompt null then tokens", Completion, `{"prompt":[null,1]}`, "", "invalid_prompt"},
		{"prompt strings with a null", Completion, `{"prompt":["a",null,"b"]}`, "", "invalid_prompt"},
		{"prompt batch with a null", Completion, `{"prompt":[[1,null],[]]}`, "", "invalid_prompt"},
		{"prompt batches", Completion, `{"prompt":[[1,2],[],[3]]}`, "1 2 3 ", ""},
		{"prompt empty array", Completion, `{"prompt":[]}`, "", ""},
		{"prompt mixed", Completion, `{"prompt":["a",1]}`, "", "invalid_prompt"},
		{"prompt nested too deep", Completion, `{"prompt":[[[1]]]}`, "", "invalid_prompt"},
		{"prompt object", Completion, `{"prompt":[{}]}`, "", "invalid_prompt"},
		{"prompt bool", Completion, `{"prompt":true}`, "", "invalid_prompt"},
		{"prompt null", Completion, `{"prompt":null}`, "", "missing_prompt"},
		{"prompt escaped strings", Completion, `{"prompt":["a\n","\u00e9"]}`, "a\né", ""},
		// Nesting: maxDepth levels, the body's object among them.
		{"nesting at the limit", Chat, `{"messages":[{"role":"user"}],"x":` + deep(maxDepth-1) + `}`, "", ""},
		{"nesting past the limit", Chat, `{"messages":[{"role":"user"}],"x":` + deep(maxDepth) + `}`, "", "invalid_json"},
		{"deep content", Chat, chatWith(deep(maxDepth - 3)), "", "invalid_message"},
		// Syntax around values.
		{"trailing garbage", Chat, chatWith(`"x"`) + `x`, "", "invalid_json"},
		{"second object", Chat, chatWith(`"x"`) + `{}`, "", "invalid_json"},
		{"trailing comma", Chat, `{"messages":[{"role":"user"},]}`, "", "invalid_json"},
		{"missing colon", Chat, `{"messages" [{"role":"user"}]}`, "", "invalid_json"},
		{"single quotes", Chat, `{'messages':[]}`, "", "invalid_json"},
		{"bad literal", Chat, `{"messages":[{"role":"user"}],"x":nul}`, "", "invalid_json"},
		{"whitespace everywhere", Chat, " \n{ \"messages\" :\t[ { \"role\" : \"user\" , \"content\" : \"x\" } ] }\r\n", "x", ""},
		// Only JSON's four spaces around the body, as json.loads.
		{"unicode space", Chat, "\u00a0" + chatWith(`"x"`), "", "invalid_json"},
		{"vertical tab after", Chat, chatWith(`"x"`) + "\v", "", "invalid_json"},
		{"form feed before", Chat, "\f" + chatWith(`"x"`), "", "invalid_json"},
		// Keys: matched byte for byte once unescaped, as a dict's keys.
		{"key in capitals", Chat, `{"MESSAGES":[{"role":"user","content":"x"}]}`, "", "missing_messages"},
		{"member keys in capitals", Chat, `{"messages":[{"Role":"user","CONTENT":"x"}]}`, "", "invalid_message"},
		{"key with Kelvin sign", Completion, "{\"prompt\":\"p\",\"max_to\u212aens\":3}", "p", ""},
		{"key with long s", Chat, "{\"me\u017f\u017fages\":[{\"role\":\"user\",\"content\":\"x\"}]}", "", "missing_messages"},
		{"key escaped", Chat, `{"m\u0065ssages":[{"role":"user","content":"x"}]}`, "x", ""},
		{"key invalid UTF-8", Chat, "{\"\xff\":1," + chatWith(`"x"`)[1:], "", "invalid_json"},
		// Repeated keys: the last value replaces the others whole; null
		// is the field unset.
		{"repeated content", Chat, `{"messages":[{"role":"user","content":"a","content":"b"}]}`, "b", ""},
		{"null role after a role", Chat, `{"messages":[{"role":"user","role":null,"content":"x"}]}`, "", "invalid_message"},
		{"null content after content", Chat, `{"messages":[{"role":"user","content":"a","content":null}]}`, "", ""},
		{"repeated messages replace", Chat, `{"messages":[{"role":"user","content":"a"},{"role":"user","content":"b"}],"messages":[{"role":"user","content":"c"}]}`, "c", ""},
		{"repeated messages do not merge", Chat, `{"messages":[{"role":"user","content":"a"}],"messages":[{"content":"c"}]}`, "", "invalid_message"},
		{"empty messages forget", Chat, `{"messages":[{"role":"user","content":"a"}],"messages":[],"messages":[{"content":"c"}]}`, "", "invalid_message"},
		{"null messages forget", Chat, `{"messages":[{"role":"user","content":"a"}],"messages":null,"messages":[{"content":"c"}]}`, "", "invalid_message"},
		{"repeated tool calls replace", Chat, `{"messages":[{"role":"user"},{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"1"}},{"function":{"name":"g"}}],"tool_calls":[{"function":{"arguments":"2"}}],"tool_calls":[{},{}]}]}`, "", ""},
		{"stream_options replace", Chat, `{"messages":[{"role":"user"}],"stream_options":{"include_usage":true},"stream_options":{}}`, "", ""},
		{"stream_options null forgets", Chat, `{"messages":[{"role":"user"}],"stream_options":{"include_usage":true},"stream_options":null,"stream_options":{}}`, "", ""},
		// Types.
		{"model number", Chat, `{"model":5,"messages":[{"role":"user"}]}`, "", "invalid_json"},
		{"stream string", Chat, `{"stream":"yes","messages":[{"role":"user"}]}`, "", "invalid_json"},
		{"message string", Chat, `{"messages":["hi"]}`, "", "invalid_json"},
		{"message null", Chat, `{"messages":[null]}`, "", "invalid_message"},
		{"name number", Chat, `{"messages":[{"role":"user","name":1}]}`, "", "invalid_json"},
		{"function string", Chat, `{"messages":[{"role":"user","tool_calls":[{"function":"f"}]}]}`, "", "invalid_json"},
		{"content number", Chat, chatWith(`5`), "", "invalid_message"},
		{"part string", Chat, chatWith(`["x"]`), "", "invalid_message"},
		{"part text number", Chat, chatWith(`[{"type":"text","text":5}]`), "", "invalid_message"},
		{"part null", Chat, chatWith(`[null,{"type":"text","text":"a"}]`), "", "invalid_message"},
		{"parts", Chat, chatWith(`[{"text":"b","type":"text"},{"type":"image_url"},{},{"type":"input_text","text":"c","text":null}]`), "b<|image_url|><||>", ""},
		{"fields of the other kind skipped", Completion, `{"prompt":"p","messages":5,"tools":"x","max_completion_tokens":"y"}`, "p", ""},
		{"prompt skipped in chat", Chat, `{"prompt":5,"messages":[{"role":"user"}]}`, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := []byte(tt.body)
			opt := Options{SessionField: "messages"}
			sameAsReference(t, tt.kind, body, opt)
			v, e := Parse(tt.kind, body, opt)
			if tt.code != "" {
				if e == nil || e.Code != tt.code {
					t.Fatalf("got %+v, %v; want error %s", v, e, tt.code)
				}
				return
			}
			if e != nil {
				t.Fatalf("Parse: %v", e)
			}
			if tt.kind == Completion && v.Prompt != tt.prompt {
				t.Fatalf("prompt %q, want %q", v.Prompt, tt.prompt)
			}
			if tt.kind == Chat && tt.prompt != "" && v.FirstUser != tt.prompt {
				t.Fatalf("first user message %q, want %q", v.FirstUser, tt.prompt)
			}
		})
	}
}

func TestRuneLen(t *testing.T) {
	// Every 1- to 3-byte sequence of bytes >= 0x80, and some of 4 bytes,
	// alone and before more text.
	check := func(b []byte) {
		r, size := utf8.DecodeRune(b)
		want := size
		if r == utf8.RuneError && size == 1 {
			want = 0
		}
		if got := runeLen(b, 0); got != want {
			t.Fatalf("runeLen(% x) = %d, want %d", b, got, want)
		}
	}
	for c := 0x80; c < 0x100; c++ {
		for c1 := 0; c1 < 0x100; c1 += 3 {
			check([]byte{byte(c), byte(c1)})
			for _, c2 := range []byte{0x00, 0x80, 0xBF, 0xC0} {
				check([]byte{byte(c), byte(c1), c2})
				check([]byte{byte(c), byte(c1), c2, 0x80})
			}
		}
	}
}

func TestAppendToken(t *testing.T) {
	for _, n := range []int64{0, 1, 35, 36, -1, -36, 127999, 1 << 62, -1 << 63, 1<<63 - 1} {
		if got, want := string(appendToken(nil, n)), strconv.FormatInt(n, 36)+" "; got != want {
			t.Errorf("appendToken(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestParseLimits checks each limit at and past its value, with the
// default and with the option set.
func TestParseLimits(t *testing.T) {
	racetest.Heavy(t, "parses prompts of millions of tokens on one goroutine")
	parts := func(n int) string {
		return chatWith(`[` + strings.Repeat(`{"type":"text","text":"a"},`, n-1) + `{"type":"image_url"}]`)
	}
	tokens := func(n int) string { return `{"prompt":[` + strings.Repeat(`7,`, n-1) + `7]}` }
	batches := func(n int) string { return `{"prompt":[[` + strings.Repeat(`7,`, n-1) + `7],[]]}` }
	messages := func(n int) string {
		return `{"messages":[` + strings.Repeat(`{"role":"user","content":"x"},`, n-1) + `{"role":"user","content":"x"}]}`
	}
	tests := []struct {
		name string
		kind Kind
		body string
		opt  Options
		code string
	}{
		{"parts at the default", Chat, parts(MaxContentParts), Options{}, ""},
		{"parts past the default", Chat, parts(MaxContentParts + 1), Options{}, "too_many_content_parts"},
		{"parts at the option", Chat, parts(3), Options{MaxContentParts: 3}, ""},
		{"parts past the option", Chat, parts(4), Options{MaxContentParts: 3}, "too_many_content_parts"},
		{"parts past, but a bad part", Chat, chatWith(`[{},{},{},5]`), Options{MaxContentParts: 3}, "invalid_message"},
		{"parts past, replaced", Chat, `{"messages":[{"role":"user","content":[{},{},{},{}],"content":"x"}]}`, Options{MaxContentParts: 3}, ""},
		{"tokens at the default", Completion, tokens(MaxPromptItems), Options{}, ""},
		{"tokens past the default", Completion, tokens(MaxPromptItems + 1), Options{}, "too_many_prompt_items"},
		{"tokens at the option", Completion, tokens(5), Options{MaxPromptItems: 5}, ""},
		{"tokens past the option", Completion, tokens(6), Options{MaxPromptItems: 5}, "too_many_prompt_items"},
		{"batch at the option", Completion, batches(5), Options{MaxPromptItems: 5}, ""},
		{"batch past the option", Completion, batches(6), Options{MaxPromptItems: 5}, "too_many_prompt_items"},
		{"strings past the option", Completion, `{"prompt":["a","b","c"]}`, Options{MaxPromptItems: 2}, "too_many_prompt_items"},
		{"tokens past, but a bad one", Completion, `{"prompt":[1,2,3,"x"]}`, Options{MaxPromptItems: 2}, "invalid_prompt"},
		{"messages at the option", Chat, messages(3), Options{MaxMessages: 3}, ""},
		{"messages past the option", Chat, messages(4), Options{MaxMessages: 3}, "too_many_messages"},
		{"messages past, then fewer", Chat, `{"messages":[{"role":"a"},{"role":"b"},{"role":"c"}],"messages":[{"role":"a","content":"x"}]}`, Options{MaxMessages: 2}, ""},
		{"messages past, with a bad one", Chat, `{"messages":[{"role":"a"},{"role":"b"},{"role":5}]}`, Options{MaxMessages: 2}, "invalid_json"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sameAsReference(t, tt.kind, []byte(tt.body), tt.opt)
			_, e := Parse(tt.kind, []byte(tt.body), tt.opt)
			if tt.code == "" && e != nil || tt.code != "" && (e == nil || e.Code != tt.code || e.Status != 400) {
				t.Fatalf("got error %v, want %q", e, tt.code)
			}
		})
	}
}

// TestParseSessionField checks the session key: a string decoded, null
// empty, any other value its JSON text, the last one when repeated, and
// only from a top-level member of exactly that name.
func TestParseSessionField(t *testing.T) {
	tests := []struct{ body, want string }{
		{`{"prompt":"p","user":"alice"}`, "alice"},
		{`{"prompt":"p","user":"al\u0069ce\n"}`, "alice\n"},
		{`{"prompt":"p","user":42}`, "42"},
		{`{"prompt":"p","user":{"id": [1, 2]}}`, `{"id": [1, 2]}`},
		{`{"prompt":"p","user":null}`, ""},
		{`{"prompt":"p","user":"a","user":"b"}`, "b"},
		{`{"prompt":"p","User":"a"}`, ""},
		{`{"prompt":"p","x":{"user":"a"}}`, ""},
		{`{"prompt":"p","u\u0073er":"a"}`, "a"},
	}
	for _, tt := range tests {
		sameAsReference(t, Completion, []byte(tt.body), Options{SessionField: "user"})
		v, e := Parse(Completion, []byte(tt.body), Options{SessionField: "user"})
		if e != nil || v.SessionKey != tt.want {
			t.Errorf("%s: session %q (%v), want %q", tt.body, v.SessionKey, e, tt.want)
		}
	}
	// The field may name one the view reads too.
	sameAsReference(t, Completion, []byte(`{"prompt":"p","model":"m"}`), Options{SessionField: "model"})
	sameAsReference(t, Completion, []byte(`{"prompt":"p","stream":true}`), Options{SessionField: "stream"})
}
