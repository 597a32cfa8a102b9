package request

import (
	"strings"
	"testing"
)

func TestMaxMessagesOption(t *testing.T) {
	body := []byte(`{"model":"m","messages":[` + strings.Repeat(`{"role":"user","content":"x"},`, 4) + `{"role":"user","content":"x"}]}`)
	tests := []struct {
		limit   int
		wantErr bool
	}{{0, false}, {5, false}, {4, true}, {1, true}}
	for _, tt := range tests {
		_, e := Parse(Chat, body, Options{MaxMessages: tt.limit})
		if (e != nil) != tt.wantErr {
			t.Errorf("limit %d: error %v, want error %v", tt.limit, e, tt.wantErr)
		}
		if e != nil && (e.Status != 400 || e.Code != "too_many_messages") {
			t.Errorf("limit %d: %+v, want 400 too_many_messages", tt.limit, e)
		}
	}
}

// TestToolLimits: tool calls (all messages together) and tool definitions
// are capped like messages and content parts, with a 400 that says which.
func TestToolLimits(t *testing.T) {
	calls := func(n int) []byte {
		return []byte(`{"model":"m","messages":[{"role":"assistant","tool_calls":[` + strings.TrimSuffix(strings.Repeat(`{"function":{"name":"f","arguments":"{}"}},`, n), ",") + `]},{"role":"user","content":"x"}]}`)
	}
	tools := func(n int) []byte {
		return []byte(`{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[` + strings.TrimSuffix(strings.Repeat(`{"type":"function"},`, n), ",") + `]}`)
	}
	tests := []struct {
		name string
		body []byte
		opt  Options
		code string // "" for no error
	}{
		{"calls at the limit", calls(MaxToolCalls), Options{}, ""},
		{"calls over the limit", calls(MaxToolCalls + 1), Options{}, "too_many_tool_calls"},
		{"calls over an option", calls(3), Options{MaxToolCalls: 2}, "too_many_tool_calls"},
		{"tools at the limit", tools(MaxTools), Options{}, ""},
		{"tools over the limit", tools(MaxTools + 1), Options{}, "too_many_tools"},
		{"tools over an option", tools(3), Options{MaxTools: 2}, "too_many_tools"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, e := Parse(Chat, tt.body, tt.opt)
			switch {
			case tt.code == "" && e != nil:
				t.Fatalf("error %v", e)
			case tt.code != "" && (e == nil || e.Status != 400 || e.Code != tt.code):
				t.Fatalf("error %+v, want 400 %s", e, tt.code)
			}
		})
	}
}

// TestMinPromptTokens: the lower bound of the prompt's tokens is exact
// for token ids and the bytes over the largest token otherwise, never
// above the truth for text of many or few bytes a token.
func TestMinPromptTokens(t *testing.T) {
	tests := []struct {
		name string
		kind Kind
		body string
		per  int
		want int
	}{
		{"token ids", Completion, `{"prompt":[1,2,3,4,5]}`, 0, 5},
		{"text", Completion, `{"prompt":"` + strings.Repeat("a", 257) + `"}`, 0, 3},
		{"text, own bound", Completion, `{"prompt":"` + strings.Repeat("a", 257) + `"}`, 8, 33},
		{"empty", Completion, `{"prompt":""}`, 0, 0},
		{"CJK", Completion, `{"prompt":"` + strings.Repeat("漢", 1000) + `"}`, 0, 24},
	}
	for _, tt := range tests {
		v, e := Parse(tt.kind, []byte(tt.body), Options{})
		if e != nil {
			t.Fatalf("%s: %v", tt.name, e)
		}
		if got := v.MinPromptTokens(tt.per); got != tt.want {
			t.Errorf("%s: MinPromptTokens(%d) = %d, want %d", tt.name, tt.per, got, tt.want)
		}
	}
}

func TestAddTokens(t *testing.T) {
	const maxInt = int(^uint(0) >> 1)
	tests := []struct{ a, b, want int }{
		{1, 2, 3},
		{maxInt, 1, maxInt},
		{maxInt - 5, maxInt - 5, maxInt},
		{1000, maxInt, maxInt},
		{-5, 3, 3},
		{0, 0, 0},
	}
	for _, tt := range tests {
		if got := AddTokens(tt.a, tt.b); got != tt.want {
			t.Errorf("AddTokens(%d, %d) = %d, want %d", tt.a, tt.b, got, tt.want)
		}
	}
}
