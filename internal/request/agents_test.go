package request

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/kvroute/kvroute/internal/prefix"
)

// TestAgentsRenderAsChat checks that a Responses or Messages body renders,
// block for block, as the chat request the engine converts it into (vLLM's
// serving_responses and Anthropic serving), so that the router hashes what
// the engine caches.
func TestAgentsRenderAsChat(t *testing.T) {
	cases := []struct {
		name string
		kind Kind
		body string
		chat string
	}{
		{"responses string input", Responses,
			`{"model":"m","instructions":"Be brief.","input":"hello"}`,
			`{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"hello"}]}`},
		{"responses empty instructions dropped", Responses,
			`{"model":"m","instructions":"","input":"hello"}`,
			`{"model":"m","messages":[{"role":"user","content":"hello"}]}`},
		{"responses items and tools", Responses,
			`{"model":"m","tools":[{"type":"function","name":"ls","parameters":{"type":"object"}}],"input":[
				{"role":"user","content":[{"type":"input_text","text":"list "},{"type":"input_text","text":"files"}]},
				{"type":"function_call","call_id":"c1","name":"ls","arguments":"{\"d\":\".\"}"},
				{"type":"function_call_output","call_id":"c1","output":"a.go b.go"},
				{"type":"reasoning","summary":[]},
				{"type":"message","role":"assistant","content":[{"type":"output_text","text":"two files"}]},
				{"role":"user","content":[{"type":"input_image","image_url":"x"}]}]}`,
			`{"model":"m","tools":[{"type":"function","name":"ls","parameters":{"type":"object"}}],"messages":[
				{"role":"user","content":[{"type":"text","text":"list "},{"type":"text","text":"files"}]},
				{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"ls","arguments":"{\"d\":\".\"}"}}]},
				{"role":"tool","tool_call_id":"c1","content":"a.go b.go"},
				{"role":"assistant","content":"two files"},
				{"role":"user","content":[{"type":"input_image","image_url":"x"}]}]}`},
		{"messages system blocks, tools, tool use and results", Messages,
			`{"model":"m","max_tokens":10,"system":[{"type":"text","text":"You are "},{"type":"text","text":"a coder."}],
				"tools":[{"name":"ls","input_schema":{"type":"object"}}],
				"messages":[{"role":"user","content":"fix it"},
				{"role":"assistant","content":[{"type":"text","text":"looking"},{"type":"tool_use","id":"u1","name":"ls","input":{"d": "."}}]},
				{"role":"user","content":[{"type":"tool_result","tool_use_id":"u1","content":[{"type":"text","text":"a.go"}]},{"type":"text","text":""},{"type":"text","text":"go on"},{"type":"image","source":{"type":"base64","data":"x"}}]}]}`,
			`{"model":"m","tools":[{"name":"ls","input_schema":{"type":"object"}}],"messages":[
				{"role":"system","content":"You are a coder."},
				{"role":"user","content":"fix it"},
				{"role":"assistant","content":"looking","tool_calls":[{"function":{"name":"ls","arguments":"{\"d\":\".\"}"}}]},
				{"role":"tool","content":"a.go"},
				{"role":"user","content":[{"type":"text","text":"go on"},{"type":"image_url","image_url":{"url":"x"}}]}]}`},
		{"messages assistant tool result is text", Messages,
			`{"model":"m","max_tokens":1,"messages":[{"role":"assistant","content":[{"type":"tool_result","content":"r"}]}]}`,
			`{"model":"m","messages":[{"role":"assistant","content":"Tool result: r"}]}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v, e := Parse(c.kind, []byte(c.body), Options{})
			if e != nil {
				t.Fatal(e)
			}
			want, e := Parse(Chat, []byte(c.chat), Options{})
			if e != nil {
				t.Fatal(e)
			}
			got, exp := prefix.Hash(nil, v.Prompt, 16), prefix.Hash(nil, want.Prompt, 16)
			if v.Prompt != want.Prompt || len(got) != len(exp) {
				t.Fatalf("prompt\n%q\nwant the chat rendering\n%q", v.Prompt, want.Prompt)
			}
			for i := range got {
				if got[i] != exp[i] {
					t.Fatalf("block %d differs", i)
				}
			}
		})
	}
}

func TestAgentsView(t *testing.T) {
	v, e := Parse(Responses, []byte(`{"model":"m","instructions":"I","input":"x","previous_response_id":"resp_7","conversation":{"id":"conv_1"},
		"prompt_cache_key":"pck","store":false,"background":true,"stream":true,"max_output_tokens":33}`), Options{})
	if e != nil {
		t.Fatal(e)
	}
	if v.PreviousResponseID != "resp_7" || v.Conversation != "conv_1" || v.SessionKey != "pck" || v.Store || !v.Background || !v.Stream || v.MaxTokens != 33 {
		t.Fatalf("view %+v", v)
	}
	if got := v.Prompt[:v.HistoryAt]; got != "<|system|>\nI\n" {
		t.Fatalf("history goes after %q, want after the instructions", got)
	}
	v, e = Parse(Responses, []byte(`{"model":"m","input":[],"conversation":"c","max_tokens":5}`), Options{SessionField: "user"})
	if e != nil {
		t.Fatal(e)
	}
	if !v.Store || v.Conversation != "c" || v.MaxTokens != 0 || v.Prompt != generationStart {
		t.Fatalf("view %+v: store defaults to true, max_tokens is not the Responses budget", v)
	}
	v, e = Parse(Messages, []byte(`{"model":"m","max_tokens":9,"stream":true,"messages":[{"role":"user","content":"x"}],"max_output_tokens":1}`), Options{})
	if e != nil {
		t.Fatal(e)
	}
	if v.MaxTokens != 9 || !v.Stream {
		t.Fatalf("view %+v", v)
	}
}

func TestAgentsErrors(t *testing.T) {
	cases := []struct {
		kind       Kind
		body, code string
	}{
		{Responses, `{"model":"m"}`, "missing_input"},
		{Responses, `{"model":"m","input":null}`, "missing_input"},
		{Responses, `{"model":"m","input":5}`, "invalid_json"},
		{Responses, `{"model":"m","input":[{"type":"item_reference","id":"x"}]}`, "invalid_input"},
		{Responses, `{"model":"m","input":[{"type":"message","content":"x"}]}`, "invalid_message"},
		{Responses, `{"model":"m","input":"x","store":"yes"}`, "invalid_json"},
		{Responses, `{"model":"m","input":"x","max_output_tokens":-1}`, "invalid_max_tokens"},
		{Messages, `{"model":"m","max_tokens":1,"messages":[]}`, "missing_messages"},
		{Messages, `{"model":"m","messages":[{"role":"user","content":"x"}]}`, "missing_max_tokens"},
		{Messages, `{"model":"m","max_tokens":1,"messages":[{"role":"system","content":"x"}]}`, "invalid_message"},
		{Messages, `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[]}]}`, "invalid_message"},
		{Messages, `{"model":"m","max_tokens":1,"messages":[{"role":"user"}]}`, "invalid_message"},
		{Messages, `{"model":"m","max_tokens":1,"system":5,"messages":[{"role":"user","content":"x"}]}`, "invalid_json"},
		{Messages, `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}]`, "invalid_json"},
	}
	for _, c := range cases {
		v, e := Parse(c.kind, []byte(c.body), Options{})
		if e == nil {
			t.Errorf("%s %s: accepted as %+v", c.kind, c.body, v)
			continue
		}
		if e.Code != c.code || e.Status != 400 {
			t.Errorf("%s %s: %d %s (%s), want 400 %s", c.kind, c.body, e.Status, e.Code, e.Message, c.code)
		}
	}
}

// FuzzParseAgents checks that no Responses or Messages body makes Parse
// panic, that every rejection is a well-formed client error, that a view
// is well formed and its parse deterministic, and that a body Parse
// accepts is valid JSON.
func FuzzParseAgents(f *testing.F) {
	for _, b := range []string{
		`{"model":"m","instructions":"I","input":[{"role":"user","content":[{"type":"input_text","text":"a"}]},{"type":"function_call","name":"f","arguments":"{}"},{"type":"function_call_output","output":"o"}],"tools":[{"type":"function","name":"f"}],"previous_response_id":"r","store":true}`,
		`{"model":"m","input":"hi","prompt_cache_key":"k","conversation":{"id":"c"}}`,
		`{"model":"m","max_tokens":3,"system":"s","messages":[{"role":"user","content":[{"type":"tool_result","content":[{"type":"text","text":"x"}]},{"type":"text","text":"y"}]},{"role":"assistant","content":[{"type":"tool_use","name":"f","input":{ "a" : [1, 2] }}]}]}`,
	} {
		f.Add([]byte(b), false)
		f.Add([]byte(b), true)
	}
	f.Fuzz(func(t *testing.T, body []byte, messages bool) {
		k := Responses
		if messages {
			k = Messages
		}
		for _, opt := range []Options{{}, {MaxMessages: 2, MaxContentParts: 2, MaxToolCalls: 1, MaxTools: 1}} {
			v, e := Parse(k, body, opt)
			if e != nil {
				if v != nil || e.Status != 400 || e.Type == "" || e.Message == "" {
					t.Fatalf("error %+v is not a well-formed client error", e)
				}
				continue
			}
			if !json.Valid(body) {
				t.Fatalf("accepted a body that is not JSON: %q", body)
			}
			if v.PromptTokens < 0 || v.MaxTokens < 0 || !utf8.ValidString(v.Prompt) || !strings.HasSuffix(v.Prompt, generationStart) ||
				v.HistoryAt < 0 || v.HistoryAt > len(v.Prompt) {
				t.Fatalf("malformed view %+v", v)
			}
			w, e2 := Parse(k, body, opt)
			if e2 != nil || w.Prompt != v.Prompt || w.SessionKey != v.SessionKey || w.PreviousResponseID != v.PreviousResponseID {
				t.Fatal("parse is not deterministic")
			}
		}
	})
}
