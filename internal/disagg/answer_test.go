package disagg

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// stripChunks runs an Answer over body cut into pieces of size n (as a
// relay reads it: the bytes held back come again first) and returns what
// went out.
func stripChunks(body []byte, n int) []byte {
	var a Answer
	var out, held []byte
	for off := 0; ; {
		end := min(off+n, len(body))
		p := append(append([]byte(nil), held...), body[off:end]...)
		final := end == len(body)
		k := a.Strip(p, final)
		out = append(out, p[:k]...)
		held = append(held[:0], p[k:]...)
		if len(held) > MaxHeld {
			panic("held more than MaxHeld")
		}
		off = end
		if final {
			return out
		}
	}
}

// vllmAnswer is a non-streamed chat answer of a vLLM engine with a KV
// connector, its kv_transfer_params at the top level.
const vllmAnswer = `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi \"kv_transfer_params\": no"},"finish_reason":"length"}],"usage":{"prompt_tokens":5,"total_tokens":6,"completion_tokens":1},"prompt_logprobs":null,"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[1,2,3],"remote_engine_id":"e-1","remote_host":"10.0.0.7","remote_port":5600,"tp_size":1}}`

func TestAnswerStrip(t *testing.T) {
	const vllmParams = `{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[1,2,3],"remote_engine_id":"e-1","remote_host":"10.0.0.7","remote_port":5600,"tp_size":1}`
	cases := []struct{ name, in, want string }{
		{"none", `{"a":1}`, `{"a":1}`},
		{"vllm", vllmAnswer, strings.Replace(vllmAnswer, vllmParams, pad("null", vllmParams), 1)},
		{"null kept", `{"kv_transfer_params":null}`, `{"kv_transfer_params":null}`},
		{"spaces", `{ "kv_transfer_params" : {"remote_host":"h"} , "b":2}`, `{ "kv_transfer_params" : ` + pad("null", `{"remote_host":"h"}`) + ` , "b":2}`},
		{"string", `{"kv_transfer_params":"10.0.0.7"}`, `{"kv_transfer_params":` + pad("null", `"10.0.0.7"`) + `}`},
		{"short", `{"kv_transfer_params":[1],"x":"a","kv_transfer_params":"a","kv_transfer_params":7}`, `{"kv_transfer_params":[] ,"x":"a","kv_transfer_params":"" ,"kv_transfer_params":0}`},
		{"empty", `{"kv_transfer_params":{}}`, `{"kv_transfer_params":{}}`},
		{"number", `{"kv_transfer_params":-12345,"b":1}`, `{"kv_transfer_params":null  ,"b":1}`},
		{"a string value", `{"a":"kv_transfer_params","b":{"c":1}}`, `{"a":"kv_transfer_params","b":{"c":1}}`},
		{"escaped quote", `{"x\"kv_transfer_params":{"a":1}}`, `{"x\"kv_transfer_params":{"a":1}}`},
		{"in a string", `{"c":"\"kv_transfer_params\":{\"a\":1}"}`, `{"c":"\"kv_transfer_params\":{\"a\":1}"}`},
		{"nested strings", `{"kv_transfer_params":{"a":"}]\"{","b":[{}]},"z":1}`, `{"kv_transfer_params":` + pad("null", `{"a":"}]\"{","b":[{}]}`) + `,"z":1}`},
		{"stream", "data: {\"choices\":[],\"kv_transfer_params\":{\"remote_host\":\"h\"}}\n\ndata: {\"choices\":[{\"delta\":{}}]}\n\ndata: [DONE]\n\n",
			"data: {\"choices\":[],\"kv_transfer_params\":" + pad("null", `{"remote_host":"h"}`) + "}\n\ndata: {\"choices\":[{\"delta\":{}}]}\n\ndata: [DONE]\n\n"},
		{"cut short", `{"kv_transfer_params":{"ab`, `{"kv_transfer_params":null`},
		{"cut shorter", `{"kv_transfer_params":{"`, `{"kv_transfer_params":  `},
	}
	for _, c := range cases {
		for _, n := range []int{1, 2, 3, 5, 7, 19, 20, 21, len(c.in)} {
			if got := stripChunks([]byte(c.in), n); string(got) != c.want {
				t.Errorf("%s in pieces of %d:\n got %q\nwant %q", c.name, n, got, c.want)
			}
		}
	}
}

// pad is s followed by spaces to the length of like.
func pad(s, like string) string { return s + strings.Repeat(" ", len(like)-len(s)) }

// TestAnswerHolds: a body that ends a read with the start of the member
// name, or inside a value's first bytes, holds those back, and nothing
// else.
func TestAnswerHolds(t *testing.T) {
	for _, c := range []struct {
		in   string
		keep int
	}{
		{`{"a":1}`, 7},
		{`{"a":1,"kv_tra`, 7},
		{`{"a":1,"`, 7},
		{`{"a":"kv_transfer_params"`, 25}, // the name is never rewritten: nothing to hold
		{`{"kv_transfer_params":{"`, 22},
		{`{"kv_transfer_params":{"ab`, 26},
		{"data: {}\n\n", 10},
	} {
		var a Answer
		p := []byte(c.in)
		if k := a.Strip(p, false); k != c.keep {
			t.Errorf("%q: %d bytes out, want %d", c.in, k, c.keep)
		}
	}
}

// FuzzAnswer: whatever the body and however it is cut, the body keeps its
// length, the pieces give what the whole gives, and bytes change only
// where a member named kv_transfer_params has its value; a JSON body stays
// JSON and loses those values, nothing else.
func FuzzAnswer(f *testing.F) {
	f.Add([]byte(vllmAnswer), uint8(7))
	f.Add([]byte(`{"kv_transfer_params":[1],"x":"a","kv_transfer_params":"a"}`), uint8(3))
	f.Add([]byte("data: {\"kv_transfer_params\":{\"h\":\"x\"}}\n\ndata: [DONE]\n\n"), uint8(11))
	f.Add([]byte(`{"a":"\\","kv_transfer_params" :  true}`), uint8(1))
	f.Fuzz(func(t *testing.T, body []byte, cut uint8) {
		whole := stripChunks(body, len(body)+1)
		cuts := stripChunks(body, int(cut)+1)
		if len(whole) != len(body) || !bytes.Equal(whole, cuts) {
			t.Fatalf("%q: whole %q, in pieces of %d %q", body, whole, int(cut)+1, cuts)
		}
		if !bytes.Contains(body, []byte("kv_transfer_params")) && !bytes.Equal(whole, body) {
			t.Fatalf("%q without the name changed to %q", body, whole)
		}
		if !json.Valid(body) {
			return
		}
		if !json.Valid(whole) {
			t.Fatalf("%q became %q, not JSON", body, whole)
		}
		var in, out any
		_ = json.Unmarshal(body, &in)
		_ = json.Unmarshal(whole, &out)
		if !reflect.DeepEqual(blanked(in), out) {
			t.Fatalf("%q became %q: want %v", body, whole, blanked(in))
		}
	})
}

// blanked is v with the value of every member named kv_transfer_params
// replaced as Answer replaces it.
func blanked(v any) any {
	switch v := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, x := range v {
			if k == "kv_transfer_params" {
				out[k] = emptied(x)
				continue
			}
			out[k] = blanked(x)
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = blanked(x)
		}
		return out
	}
	return v
}

// emptied is what a value becomes: null, or the empty value of its type
// when it was under 4 bytes.
func emptied(x any) any {
	b, _ := json.Marshal(x)
	if len(b) >= 4 {
		return nil
	}
	switch x.(type) {
	case map[string]any:
		return map[string]any{}
	case []any:
		return []any{}
	case string:
		return ""
	case float64:
		return 0.0
	}
	return x
}

// BenchmarkAnswer: the cost on a relayed body without the member (the
// common path: one search) and with it, per 32 KiB read of the reverse
// proxy.
func BenchmarkAnswer(b *testing.B) {
	chunk := []byte(strings.Repeat(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" token"}}]}`+"\n\n", 300))[:32<<10]
	with := append([]byte(nil), chunk...)
	copy(with[1000:], `"kv_transfer_params":{"remote_host":"10.0.0.7","remote_port":5600}`)
	for _, c := range []struct {
		name string
		body []byte
	}{{"without", chunk}, {"with", with}} {
		b.Run(c.name, func(b *testing.B) {
			p := make([]byte, len(c.body))
			b.SetBytes(int64(len(p)))
			b.ReportAllocs()
			for b.Loop() {
				copy(p, c.body)
				var a Answer
				a.Strip(p, true)
			}
		})
	}
}
