package libs

import (
	"encoding/json"
	"os"
	"testing"

	"github.com/bytedance/sonic"
	"github.com/tidwall/gjson"
	"github.com/valyala/fastjson"
)

func bodies(b *testing.B) map[string][]byte {
	m := map[string][]byte{}
	for _, n := range []string{"chat4k", "agent200k"} {
		d, err := os.ReadFile(n + ".json")
		if err != nil {
			b.Fatal(err)
		}
		m[n] = d
	}
	return m
}

func run(b *testing.B, f func([]byte) int) {
	for _, n := range []string{"chat4k", "agent200k"} {
		body := bodies(b)[n]
		b.Run(n, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if f(body) == 0 {
					b.Fatal("nothing")
				}
			}
		})
	}
}

// Each trial validates the whole body and extracts the roles and contents
// (strings unescaped), tool names/arguments and the tools' raw text: a
// lower bound of a Parse built on it.

var fjp fastjson.Parser

// BenchmarkFastjson validates with fastjson.ValidateBytes first: its
// parser alone checks less than encoding/json (escapes, control bytes).
func BenchmarkFastjson(b *testing.B) {
	run(b, func(body []byte) int {
		if err := fastjson.ValidateBytes(body); err != nil {
			b.Fatal(err)
		}
		v, err := fjp.ParseBytes(body)
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		for _, m := range v.GetArray("messages") {
			n += len(m.GetStringBytes("role"))
			c := m.Get("content")
			if c != nil && c.Type() == fastjson.TypeString {
				s, _ := c.StringBytes()
				n += len(s)
			}
			for _, tc := range m.GetArray("tool_calls") {
				n += len(tc.GetStringBytes("function", "name")) + len(tc.GetStringBytes("function", "arguments"))
			}
		}
		for _, t := range v.GetArray("tools") {
			n += len(t.MarshalTo(nil))
		}
		return n
	})
}

func BenchmarkGjson(b *testing.B) {
	run(b, func(body []byte) int {
		if !gjson.ValidBytes(body) {
			b.Fatal("invalid")
		}
		n := 0
		gjson.GetBytes(body, "messages").ForEach(func(_, m gjson.Result) bool {
			n += len(m.Get("role").String()) + len(m.Get("content").String())
			m.Get("tool_calls").ForEach(func(_, tc gjson.Result) bool {
				n += len(tc.Get("function.name").String()) + len(tc.Get("function.arguments").String())
				return true
			})
			return true
		})
		gjson.GetBytes(body, "tools").ForEach(func(_, t gjson.Result) bool {
			n += len(t.Raw)
			return true
		})
		return n
	})
}

type sFunction struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

type sMsg struct {
	Role      string                         `json:"role"`
	Content   json.RawMessage                `json:"content"`
	ToolCalls []struct{ Function sFunction } `json:"tool_calls"`
}

type sBody struct {
	Model    string            `json:"model"`
	Messages []sMsg            `json:"messages"`
	Tools    []json.RawMessage `json:"tools"`
}

func BenchmarkSonic(b *testing.B) {
	run(b, func(body []byte) int {
		var v sBody
		if err := sonic.ConfigStd.Unmarshal(body, &v); err != nil {
			b.Fatal(err)
		}
		n := 0
		for _, m := range v.Messages {
			var s string
			if len(m.Content) > 0 && m.Content[0] == '"' {
				sonic.ConfigStd.Unmarshal(m.Content, &s)
			}
			n += len(m.Role) + len(s)
		}
		return n + len(v.Tools)
	})
}
