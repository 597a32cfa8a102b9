package request

import (
	"bytes"
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/kvroute/kvroute/internal/clocktest"
	"github.com/kvroute/kvroute/internal/openai"
)

// Bodies of realistic shape for the benchmarks, built with encoding/json
// as a client would send them.

type benchMessage struct {
	Role      string         `json:"role"`
	Content   any            `json:"content"`
	Name      string         `json:"name,omitempty"`
	ToolCalls []benchToolUse `json:"tool_calls,omitempty"`
}

type benchToolUse struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// benchText is prose with the odd newline, quote and non-ASCII letter.
func benchText(n int, seed int) string {
	words := []string{"the", "router", "keeps", "a", "prefix", "index", "of", "every", "engine's", "cache", "and", "sends", "each", "request", "where", "its", "prompt", "is", "already", "warm", "\"quoted\"", "café", "naïve", "—"}
	var sb strings.Builder
	for i := 0; sb.Len() < n; i++ {
		sb.WriteString(words[(i*7+seed)%len(words)])
		if i%17 == 16 {
			sb.WriteString(".\n")
		} else {
			sb.WriteByte(' ')
		}
	}
	return sb.String()
}

// benchCode is a tool result: source text, indented with spaces, with a
// newline every 30 bytes and a quote every 60.
func benchCode(n int) string {
	var sb strings.Builder
	for i := 0; sb.Len() < n; i++ {
		fmt.Fprintf(&sb, "def handler_%d(request, limit=%d):\n    items = request.get(\"items\", [])\n    if len(items) > limit:\n        raise ValueError(\"too many items\")\n    return [item.strip() for item in items]\n\n", i, i)
	}
	return sb.String()
}

// benchMarshal encodes v as the SDKs in Python and JavaScript do: no
// escaping of <, > and &, which encoding/json alone adds.
func benchMarshal(v any) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		panic(err)
	}
	return bytes.TrimSpace(buf.Bytes())
}

// chatBody4K is a chat turn: a system prompt and a few turns, about 4 KB.
func chatBody4K() []byte {
	msgs := []benchMessage{{Role: "system", Content: benchText(1500, 0)}}
	for i := 0; i < 3; i++ {
		msgs = append(msgs, benchMessage{Role: "user", Content: benchText(300, i+1)}, benchMessage{Role: "assistant", Content: benchText(450, i+5)})
	}
	msgs = append(msgs, benchMessage{Role: "user", Content: benchText(200, 9)})
	return benchMarshal(map[string]any{"model": "llama-3.1-8b", "messages": msgs, "max_tokens": 256, "temperature": 0.7, "stream": true, "stream_options": map[string]bool{"include_usage": true}, "user": "user-1234"})
}

// agentBody200K is an agent's context: tool definitions, a system prompt
// and tool-calling turns whose results are source files, about 200 KB.
func agentBody200K() []byte {
	var tools []any
	for i := 0; i < 12; i++ {
		tools = append(tools, map[string]any{"type": "function", "function": map[string]any{
			"name":        fmt.Sprintf("tool_%d", i),
			"description": benchText(300, i),
			"parameters": map[string]any{"type": "object", "required": []string{"path"}, "properties": map[string]any{
				"path":  map[string]string{"type": "string", "description": "file to read"},
				"limit": map[string]any{"type": "integer", "minimum": 1},
			}},
		}})
	}
	msgs := []benchMessage{{Role: "system", Content: benchText(6000, 3)}, {Role: "user", Content: []map[string]string{{"type": "text", "text": benchText(800, 4)}, {"type": "image_url"}}}}
	for i := 0; ; i++ {
		var call benchToolUse
		call.ID, call.Type = fmt.Sprintf("call_%d", i), "function"
		call.Function.Name = fmt.Sprintf("tool_%d", i%12)
		call.Function.Arguments = string(benchMarshal(map[string]any{"path": fmt.Sprintf("src/pkg%d/file.go", i), "limit": 400}))
		msgs = append(msgs,
			benchMessage{Role: "assistant", Content: benchText(200, i), ToolCalls: []benchToolUse{call}},
			benchMessage{Role: "tool", Content: benchCode(3500), Name: call.Function.Name})
		if b := benchMarshal(map[string]any{"model": "m", "messages": msgs, "tools": tools}); len(b) > 200<<10 {
			return benchMarshal(map[string]any{"model": "qwen-2.5-coder", "messages": msgs, "tools": tools, "tool_choice": "auto", "max_completion_tokens": 4096, "stream": true})
		}
	}
}

// tokenBody is a completion whose prompt is n token ids.
func tokenBody(n int) []byte {
	toks := make([]int, n)
	for i := range toks {
		toks[i] = (i * 7919) % 128000
	}
	return benchMarshal(map[string]any{"model": "m", "prompt": toks, "max_tokens": 16})
}

var benchBodies = []struct {
	name string
	kind Kind
	body func() []byte
}{
	{"chat-4KB", Chat, chatBody4K},
	{"agent-200KB", Chat, agentBody200K},
	{"agent-200KB-plain", Chat, agentPlain},
	{"tokens-100k", Completion, func() []byte { return tokenBody(100000) }},
}

// agentPlain is agentBody200K with no escape and no non-ASCII byte left, to
// tell what decoding costs from the rest.
func agentPlain() []byte {
	b := bytes.ReplaceAll(agentBody200K(), []byte(`\n`), []byte(`  `))
	b = bytes.ReplaceAll(b, []byte(`\"`), []byte(`''`))
	return bytes.Map(func(r rune) rune {
		if r >= utf8.RuneSelf {
			return 'x'
		}
		return r
	}, b)
}

// BenchmarkScanString is the scanner alone over one plain 200 KB string.
func BenchmarkScanString(b *testing.B) {
	body := []byte(`"` + strings.Repeat("the router keeps a prefix index ", 6400) + `"`)
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		d := scanner{buf: body}
		if _, ok := d.str(); !ok {
			b.Fatal(d.err)
		}
	}
}

func benchParse(b *testing.B, parse func(Kind, []byte, Options) (*View, *openai.Error)) {
	for _, bb := range benchBodies {
		body := bb.body()
		b.Run(fmt.Sprintf("%s/%dB", bb.name, len(body)), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			cpu := clocktest.CPUTime()
			for b.Loop() {
				if _, err := parse(bb.kind, body, Options{SessionField: "user"}); err != nil {
					b.Fatal(err)
				}
			}
			clocktest.ReportCPU(b, cpu)
		})
	}
}

// BenchmarkParseChat is Parse on a chat turn, an agent's context and a
// completion of token ids.
func BenchmarkParseChat(b *testing.B) { benchParse(b, Parse) }

// BenchmarkParseReference is the same with the encoding/json reference,
// which is what Parse was before it scanned the body in one pass.
func BenchmarkParseReference(b *testing.B) { benchParse(b, refParse) }

// TestParseMemory checks that what Parse allocates stays a small multiple
// of the body (or of the prompt, where the template makes it longer than
// the body) for the shapes that could blow it up: a long array of token
// ids, many content parts, many small messages, many tools. Each message
// costs 32 bytes of state, so that many messages of a few bytes would cost
// more, but MaxMessages bounds that at 3.2 MB.
func TestParseMemory(t *testing.T) {
	parts := func(part string, n int) []byte {
		return []byte(`{"messages":[{"role":"user","content":[` + strings.Repeat(part+",", n-1) + part + `]}]}`)
	}
	tests := []struct {
		name string
		kind Kind
		body []byte
	}{
		{"token ids", Completion, tokenBody(MaxPromptItems)},
		{"small token ids", Completion, []byte(`{"prompt":[` + strings.Repeat("1,", MaxPromptItems-1) + `1]}`)},
		{"text parts", Chat, parts(`{"type":"text","text":"ab"}`, MaxContentParts)},
		{"image parts", Chat, parts(`{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo"}}`, MaxContentParts)},
		{"empty parts", Chat, parts(`{}`, MaxContentParts)},
		{"small messages", Chat, []byte(`{"messages":[` + strings.Repeat(`{"role":"user","content":"x"},`, MaxMessages-1) + `{"role":"user","content":"x"}]}`)},
		{"tool calls", Chat, []byte(`{"messages":[{"role":"a","tool_calls":[` + strings.Repeat(`{},`, 99999) + `{}]}]}`)},
		{"tools", Chat, []byte(`{"messages":[{"role":"a"}],"tools":[` + strings.Repeat(`0,`, MaxTools-1) + `0]}`)},
		{"agent", Chat, agentBody200K()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Two collections empty the pool of decoders: the first Parse
			// after them is the one that allocates the most.
			runtime.GC()
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			v, err := Parse(tt.kind, tt.body, Options{})
			runtime.ReadMemStats(&after)
			if err != nil {
				t.Fatal(err)
			}
			size := max(len(tt.body), len(v.Prompt))
			ratio := float64(after.TotalAlloc-before.TotalAlloc) / float64(size)
			t.Logf("%d-byte body, %d-byte prompt: allocated %.2fx the larger", len(tt.body), len(v.Prompt), ratio)
			if ratio > 3 {
				t.Errorf("Parse allocated %.2fx the %d bytes of the body or prompt, more than 3x", ratio, size)
			}
		})
	}
}
