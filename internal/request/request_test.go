package request

import (
	"strconv"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		kind    Kind
		body    string
		opt     Options
		want    View
		wantErr string // substring of the message; empty for success
	}{
		{
			name: "chat with string content",
			kind: Chat,
			body: `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}],"max_tokens":7,"stream":true,"stream_options":{"include_usage":true}}`,
			want: View{Kind: Chat, Model: "m", Prompt: "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n", FirstUser: "hi", PromptTokens: 12, MaxTokens: 7, Stream: true, IncludeUsage: true},
		},
		{
			name: "chat content parts and tools, max_completion_tokens wins",
			kind: Chat,
			body: `{"model":"m","tools":[{"type":"function", "function":{"name":"f"}}],"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"b"}]}],"max_tokens":5,"max_completion_tokens":9}`,
			want: View{Kind: Chat, Model: "m", Prompt: "<|tools|>\n{\"type\":\"function\",\"function\":{\"name\":\"f\"}}\n<|user|>\na<|image_url|>b\n<|assistant|>\n", FirstUser: "a<|image_url|>b", PromptTokens: 24, MaxTokens: 9},
		},
		{
			name: "assistant tool call and null content",
			kind: Chat,
			body: `{"messages":[{"role":"user","content":"q"},{"role":"assistant","content":null,"tool_calls":[{"function":{"name":"f","arguments":"{}"}}]}]}`,
			want: View{Kind: Chat, Prompt: "<|user|>\nq\n<|assistant|>\n<|tool_call|>f {}\n<|assistant|>\n", FirstUser: "q", PromptTokens: 15},
		},
		{
			name: "completion string, vLLM extensions",
			kind: Completion,
			body: `{"model":"m","prompt":"hello world","max_tokens":3,"min_tokens":3,"ignore_eos":true}`,
			want: View{Kind: Completion, Model: "m", Prompt: "hello world", PromptTokens: 3, MaxTokens: 3, MinTokens: 3, IgnoreEOS: true},
		},
		{
			name: "completion token ids count exactly",
			kind: Completion,
			body: `{"prompt":[1,2,3,40]}`,
			want: View{Kind: Completion, Prompt: "1 2 3 14 ", PromptTokens: 4, PromptExact: true},
		},
		{
			name: "completion batch of strings",
			kind: Completion,
			body: `{"prompt":["ab","cd"]}`,
			want: View{Kind: Completion, Prompt: "abcd", PromptTokens: 1},
		},
		{
			name: "session from body field",
			kind: Completion,
			body: `{"prompt":"x","user":"alice"}`,
			opt:  Options{SessionField: "user"},
			want: View{Kind: Completion, Prompt: "x", PromptTokens: 1, SessionKey: "alice"},
		},
		{name: "not an object", kind: Chat, body: `[1]`, wantErr: "JSON object"},
		{name: "empty", kind: Chat, body: ``, wantErr: "JSON object"},
		{name: "truncated", kind: Chat, body: `{"messages":[`, wantErr: "malformed"},
		{name: "wrong type", kind: Chat, body: `{"messages":[],"max_tokens":"x"}`, wantErr: "wrong type"},
		{name: "no messages", kind: Chat, body: `{"model":"m"}`, wantErr: "messages"},
		{name: "no role", kind: Chat, body: `{"messages":[{"content":"x"}]}`, wantErr: "role"},
		{name: "bad content", kind: Chat, body: `{"messages":[{"role":"user","content":5}]}`, wantErr: "content"},
		{name: "no prompt", kind: Completion, body: `{"model":"m"}`, wantErr: "prompt"},
		{name: "bad prompt", kind: Completion, body: `{"prompt":{"a":1}}`, wantErr: "prompt"},
		{name: "negative max_tokens", kind: Completion, body: `{"prompt":"x","max_tokens":-1}`, wantErr: "max_tokens"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := Parse(tt.kind, []byte(tt.body), tt.opt)
			if tt.wantErr != "" {
				if err == nil {
					t.Fatalf("Parse succeeded, want error containing %q", tt.wantErr)
				}
				if err.Status != 400 || !strings.Contains(err.Message, tt.wantErr) {
					t.Fatalf("error = %d %q, want 400 containing %q", err.Status, err.Message, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if *v != tt.want {
				t.Fatalf("view =\n%+v\nwant\n%+v", *v, tt.want)
			}
		})
	}
}

// A chat's next turn must render to an extension of the previous turn's
// prompt up to the generation prompt, so that the prefix index finds it.
func TestNextTurnExtendsPrompt(t *testing.T) {
	t1, err := Parse(Chat, []byte(`{"messages":[{"role":"system","content":"sys"},{"role":"user","content":"q1"}]}`), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t2, err := Parse(Chat, []byte(`{"messages":[{"role":"system","content":"sys"},{"role":"user","content":"q1"},{"role":"assistant","content":"a1"},{"role":"user","content":"q2"}]}`), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(t2.Prompt, t1.Prompt) {
		t.Fatalf("turn 2 %q does not extend turn 1 %q", t2.Prompt, t1.Prompt)
	}
}

// cache_salt (vLLM's) salts the prefix chain; an empty one is refused as
// vLLM refuses it, null is none.
func TestCacheSalt(t *testing.T) {
	for _, tt := range []struct {
		kind    Kind
		body    string
		want    string
		wantErr string
	}{
		{Chat, `{"model":"m","messages":[{"role":"user","content":"x"}],"cache_salt":"tenant-a"}`, "tenant-a", ""},
		{Completion, `{"model":"m","prompt":"x","cache_salt":"s\u00e9l"}`, "s\u00e9l", ""},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"x"}],"cache_salt":null}`, "", ""},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"x"}]}`, "", ""},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"x"}],"cache_salt":""}`, "", "invalid_cache_salt"},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"x"}],"cache_salt":5}`, "", "invalid_json"},
	} {
		v, e := Parse(tt.kind, []byte(tt.body), Options{})
		if tt.wantErr != "" {
			if e == nil || e.Code != tt.wantErr {
				t.Errorf("%s: error %v, want %s", tt.body, e, tt.wantErr)
			}
			continue
		}
		if e != nil {
			t.Fatalf("%s: %v", tt.body, e)
		}
		if want, _ := strconv.Unquote(`"` + tt.want + `"`); v.PrefixSalt != want {
			t.Errorf("%s: salt %q, want %q", tt.body, v.PrefixSalt, want)
		}
	}
}
