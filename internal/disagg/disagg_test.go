package disagg

import (
	"encoding/json"
	"net/url"
	"reflect"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/members"
	"github.com/kvroute/kvroute/internal/request"
)

func decode(t testing.TB, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return m
}

func TestVLLMPrefill(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"chat stream", `{"model":"m","messages":[],"stream":true,"stream_options":{"include_usage":true},"max_tokens":9}`,
			`{"model":"m","messages":[],"stream":false,"max_tokens":1}`},
		{"max_completion_tokens kept at one", `{"model":"m","prompt":"p","max_completion_tokens":9}`,
			`{"model":"m","prompt":"p","stream":false,"max_tokens":1,"max_completion_tokens":1}`},
		{"client kv params replaced", `{"model":"m","prompt":"p","kv_transfer_params":{"do_remote_prefill":true}}`,
			`{"model":"m","prompt":"p","stream":false,"max_tokens":1}`},
		// vLLM refuses min_tokens above max_tokens: 1; the toy proxy drops
		// both minimums.
		{"minimums dropped", `{"model":"m","prompt":"p","max_tokens":9,"min_tokens":5,"min_completion_tokens":5}`,
			`{"model":"m","prompt":"p","stream":false,"max_tokens":1}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := decode(t, []byte(tt.want))
			want["kv_transfer_params"] = map[string]any{"do_remote_decode": true, "do_remote_prefill": false,
				"remote_engine_id": nil, "remote_block_ids": nil, "remote_host": nil, "remote_port": nil}
			if got := decode(t, VLLMPrefill([]byte(tt.in), nil)); !reflect.DeepEqual(got, want) {
				t.Errorf("got %v\nwant %v", got, want)
			}
		})
	}
	if got := VLLMPrefill([]byte(`[1]`), nil); string(got) != `[1]` {
		t.Errorf("a body that is not an object became %s", got)
	}
	// Byte for byte: the client's members as they were, in their order
	// (no \u003c for <, the space inside a value kept, none between
	// members), then the members set.
	const want = `{"model":"m","prompt":"<b> & ✓","stop":[1, 2],"stream":false,"max_tokens":1,"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}}`
	if got := VLLMPrefill([]byte(` {"model":"m", "stream" : true, "prompt":"<b> & ✓",`+"\n\t"+`"stop":[1, 2]} `), nil); string(got) != want {
		t.Errorf("prefill body\n%s\nwant\n%s", got, want)
	}
}

// TestSpliceRepeatedKeys: a key the client repeats (json.loads takes the
// last) or escapes ("strea\u006d" is "stream") is replaced in every
// occurrence, so the engine reads the leg's value; a dropped one is gone
// in every occurrence.
func TestSpliceRepeatedKeys(t *testing.T) {
	in := `{"stream":true,"max_tokens":5,"strea\u006d":true,"min_tokens":2,"prompt":"p","max_tokens":7,"min_tokens":3}`
	want := `{"prompt":"p","stream":false,"max_tokens":1,"kv_transfer_params":` + string(remoteDecode) + `}`
	if got := VLLMPrefill([]byte(in), nil); string(got) != want {
		t.Errorf("prefill body\n%s\nwant\n%s", got, want)
	}
	answer := []byte(`{"kv_transfer_params":{"remote_engine_id":"e","remote_host":"h","remote_port":1,"remote_block_ids":[1]}}`)
	got := vllmDecode([]byte(`{"kv_transfer_params":{"x":1},"prompt":"p","kv_transfer_params":null}`), answer)
	if want := `{"prompt":"p","kv_transfer_params":{"do_remote_decode":false,"do_remote_prefill":true,"remote_block_ids":[1],"remote_engine_id":"e","remote_host":"h","remote_port":1}}`; string(got) != want {
		t.Errorf("decode body\n%s\nwant\n%s", got, want)
	}
	for _, bad := range []string{`{"prompt":"p"`, `{"prompt":"p"} x`, `{"a":"\xff"}`, `["prompt"]`, ``} {
		if got := VLLMPrefill([]byte(bad), nil); string(got) != bad {
			t.Errorf("a body that is not one JSON object, %q, became %s", bad, got)
		}
	}
}

// FuzzSplice: whatever the client's body, a leg's body is the body itself
// when it is not one JSON object (Members refuses it), else valid JSON
// whose members are the client's (the last of a repeated key) with the
// leg's changes: VLLMPrefill's stream, max_tokens, kv_transfer_params,
// max_completion_tokens when present, the minimums and stream_options
// gone; VLLMDecode's kv_transfer_params. The reference is the rewrite the
// splice replaced: encoding/json's map of raw members, changed and
// compared as values. Bootstrap's body parses and carries its three
// members.
func FuzzSplice(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"<b> ✓"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":9,"max_completion_tokens":9,"min_tokens":2}`,
		`{"stream":true,"strea\u006d":false,"max_tokens":1,"max_tokens":2}`,
		` { "prompt" : [1, 2, 3] , "n" : 2 } `,
		`{}`, `{"a":{"b":[{}]}}`, `{"a":1`, `[]`, `{"a":"\ud800"}`, `{"kv_transfer_params":1,"kv_transfer_params":2}`,
	} {
		f.Add([]byte(s))
	}
	answer := []byte(`{"kv_transfer_params":{"remote_engine_id":"e","remote_block_ids":[[1,2]],"remote_host":"h","remote_port":5600}}`)
	pre := &members.Member{B: fleet.New().Add("p", &url.URL{Scheme: "http", Host: "10.0.0.7:30000"}, nil)}
	f.Fuzz(func(t *testing.T, body []byte) {
		valid := request.Members(body, func([]byte, int, int, int) {}) == nil
		// SGLang's legs: the body with the three bootstrap members.
		legs := Legs(&request.View{}, config.ProtocolSGLang, Transfer{})
		legs[0].Target = pre
		Bootstrap(legs, body, 8998)
		if valid != (legs[1].Rewrite != nil) {
			t.Fatalf("bootstrap of %q: valid %v, rewritten %v", body, valid, legs[1].Rewrite != nil)
		}
		if valid {
			var m map[string]json.RawMessage
			out := legs[1].Rewrite(body, nil)
			if json.Unmarshal(out, &m) != nil || m["bootstrap_host"] == nil || m["bootstrap_port"] == nil || m["bootstrap_room"] == nil {
				t.Fatalf("bootstrap of %q: %q", body, out)
			}
		}
		for _, leg := range []struct {
			name    string
			rewrite func(body, prev []byte) []byte
			change  func(m map[string]json.RawMessage)
		}{
			{"prefill", VLLMPrefill, func(m map[string]json.RawMessage) {
				if _, ok := m["max_completion_tokens"]; ok {
					m["max_completion_tokens"] = jsonOne
				}
				for _, k := range prefillDrop {
					delete(m, k)
				}
				m["stream"], m["max_tokens"], m["kv_transfer_params"] = jsonFalse, jsonOne, remoteDecode
			}},
			{"decode", vllmDecode, func(m map[string]json.RawMessage) {
				m["kv_transfer_params"] = json.RawMessage(`{"do_remote_decode":false,"do_remote_prefill":true,"remote_block_ids":[[1,2]],"remote_engine_id":"e","remote_host":"h","remote_port":5600}`)
			}},
		} {
			out := leg.rewrite(body, answer)
			if !valid {
				if !reflect.DeepEqual(out, body) {
					t.Fatalf("%s: a body Members refuses became %q", leg.name, out)
				}
				continue
			}
			if err := request.Members(out, func([]byte, int, int, int) {}); err != nil {
				t.Fatalf("%s leg of %q: %q does not parse: %v", leg.name, body, out, err)
			}
			var ref map[string]json.RawMessage
			if err := json.Unmarshal(body, &ref); err != nil {
				t.Fatalf("%q: Members accepts it, encoding/json does not: %v", body, err)
			}
			leg.change(ref)
			want, _ := json.Marshal(ref)
			var got, wantV any
			if json.Unmarshal(out, &got) != nil || json.Unmarshal(want, &wantV) != nil || !reflect.DeepEqual(got, wantV) {
				t.Fatalf("%s leg of %q:\n%s\nwant the values of\n%s", leg.name, body, out, want)
			}
		}
	})
}

// Bootstrap gives a batch (n above 1, or a list of prompts) one host, port
// and room a sequence, as SGLang's router does; a single prompt, token ids
// included, one of each.
func TestBootstrapBatch(t *testing.T) {
	fl := fleet.New()
	pre := &members.Member{B: fl.Add("p", &url.URL{Scheme: "http", Host: "10.0.0.7:30000"}, nil)}
	next := uint64(0)
	prev := SetRoom(func() uint64 { next++; return next })
	t.Cleanup(func() { SetRoom(prev) })
	tests := []struct{ body, host, port, room string }{
		{`{"prompt":"a"}`, `"10.0.0.7"`, `8998`, `1`},
		{`{"prompt":[1,2,3]}`, `"10.0.0.7"`, `8998`, `1`},
		{`{"messages":[],"n":1}`, `"10.0.0.7"`, `8998`, `1`},
		{`{"messages":[],"n":3}`, `["10.0.0.7","10.0.0.7","10.0.0.7"]`, `[8998,8998,8998]`, `[1,2,3]`},
		{`{"prompt":["a","b"]}`, `["10.0.0.7","10.0.0.7"]`, `[8998,8998]`, `[1,2]`},
		{`{"prompt":[[1,2],[3]]}`, `["10.0.0.7","10.0.0.7"]`, `[8998,8998]`, `[1,2]`},
		{`{"text":["a","b","c"]}`, `["10.0.0.7","10.0.0.7","10.0.0.7"]`, `[8998,8998,8998]`, `[1,2,3]`},
	}
	for _, tt := range tests {
		next = 0
		legs := Legs(&request.View{}, config.ProtocolSGLang, Transfer{})
		legs[0].Target = pre
		Bootstrap(legs, []byte(tt.body), 8998)
		out := legs[1].Rewrite([]byte(tt.body), nil)
		var m map[string]json.RawMessage
		if err := json.Unmarshal(out, &m); err != nil {
			t.Fatalf("%s: %v", out, err)
		}
		if string(m["bootstrap_host"]) != tt.host || string(m["bootstrap_port"]) != tt.port || string(m["bootstrap_room"]) != tt.room {
			t.Errorf("%s: bootstrap %s %s %s, want %s %s %s", tt.body, m["bootstrap_host"], m["bootstrap_port"], m["bootstrap_room"], tt.host, tt.port, tt.room)
		}
		if got := legs[0].Rewrite([]byte(tt.body), nil); string(got) != string(out) {
			t.Errorf("%s: the prefill leg got %s, the decode leg %s: want one body", tt.body, got, out)
		}
	}
}

// vllmDecode is the decode leg's body after a prefill engine at host "h".
func vllmDecode(body, prev []byte) []byte {
	out, _ := Transfer{}.decode(body, prev, "h")
	return out
}

func TestVLLMDecode(t *testing.T) {
	const body = `{"model":"m","prompt":"p","stream":true}`
	answer := `{"id":"x","choices":[],"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[1,2],"remote_engine_id":"e","remote_host":"h","remote_port":5600,"tp_size":1}}`
	want := decode(t, []byte(body))
	want["kv_transfer_params"] = decode(t, []byte(answer))["kv_transfer_params"]
	if got := decode(t, vllmDecode([]byte(body), []byte(answer))); !reflect.DeepEqual(got, want) {
		t.Errorf("got %v\nwant %v", got, want)
	}
	// do_remote_prefill is set whatever the prefill engine said.
	got := decode(t, vllmDecode([]byte(body), []byte(`{"kv_transfer_params":{"remote_engine_id":"e","remote_host":"h","remote_port":5600,"remote_block_ids":[],"do_remote_prefill":false}}`)))
	if kv := got["kv_transfer_params"].(map[string]any); kv["do_remote_prefill"] != true || kv["remote_engine_id"] != "e" {
		t.Errorf("kv_transfer_params %v", kv)
	}
	if out, why := (Transfer{}).decode([]byte(body), nil, "h"); string(out) != body || why != "" {
		t.Errorf("no answer (the prefill leg skipped): body %s, why %q: want the request's own, no reason", out, why)
	}
}

// TestPrefillParamsChecked: parameters a decode engine would act on are
// checked before any decode leg carries them; whatever fails, the decode
// engine serves the request whole (the client's body) and the reason says
// the answer was unusable.
func TestPrefillParamsChecked(t *testing.T) {
	const body = `{"model":"m","prompt":"p"}`
	params := func(edit string) string {
		return `{"kv_transfer_params":{"remote_engine_id":"e","remote_host":"10.0.0.7","remote_port":5600,"remote_block_ids":[1,2]` + edit + `}}`
	}
	huge := `,"x":"` + strings.Repeat("a", maxParams) + `"`
	for _, tt := range []struct {
		name, answer string
		ok           bool
	}{
		{"own host", params(""), true},
		{"allowed host", `{"kv_transfer_params":{"remote_engine_id":"e","remote_host":"10.9.9.9","remote_port":5600,"remote_block_ids":[[1],[2]]}}`, true},
		{"empty answer", `{}`, false},
		{"not JSON", `garbage`, false},
		{"params null", `{"kv_transfer_params":null}`, false},
		{"params a list", `{"kv_transfer_params":[1]}`, false},
		{"params empty", `{"kv_transfer_params":{}}`, false},
		{"metadata endpoint", `{"kv_transfer_params":{"remote_engine_id":"e","remote_host":"169.254.169.254","remote_port":80,"remote_block_ids":[1]}}`, false},
		{"host a number", `{"kv_transfer_params":{"remote_engine_id":"e","remote_host":1,"remote_port":5600,"remote_block_ids":[1]}}`, false},
		{"port 0", `{"kv_transfer_params":{"remote_engine_id":"e","remote_host":"10.0.0.7","remote_port":0,"remote_block_ids":[1]}}`, false},
		{"port 65536", `{"kv_transfer_params":{"remote_engine_id":"e","remote_host":"10.0.0.7","remote_port":65536,"remote_block_ids":[1]}}`, false},
		{"port a string", `{"kv_transfer_params":{"remote_engine_id":"e","remote_host":"10.0.0.7","remote_port":"5600","remote_block_ids":[1]}}`, false},
		{"no engine id", `{"kv_transfer_params":{"remote_host":"10.0.0.7","remote_port":5600,"remote_block_ids":[1]}}`, false},
		{"engine id too long", `{"kv_transfer_params":{"remote_engine_id":"` + strings.Repeat("e", maxName+1) + `","remote_host":"10.0.0.7","remote_port":5600,"remote_block_ids":[1]}}`, false},
		{"negative block", params(`,"remote_block_ids":[-1]`), false},
		{"block ids strings", params(`,"remote_block_ids":["1"]`), false},
		{"over the size bound", params(huge), false},
	} {
		out, why := Transfer{Hosts: []string{"10.9.9.9"}}.decode([]byte(body), []byte(tt.answer), "10.0.0.7")
		if tt.ok != (why == "") || tt.ok == (string(out) == body) {
			t.Errorf("%s: body %.80s, why %q: want used %v", tt.name, out, why, tt.ok)
		}
		if !tt.ok && !strings.HasPrefix(why, "prefill answer unusable: ") {
			t.Errorf("%s: why %q", tt.name, why)
		}
	}
	// An engine on the router's machine names its side channel
	// "localhost" (vLLM's default) while its URL says 127.0.0.1.
	if _, why := (Transfer{}).decode([]byte(body), []byte(`{"kv_transfer_params":{"remote_engine_id":"e","remote_host":"localhost","remote_port":5600,"remote_block_ids":[1]}}`), "127.0.0.1"); why != "" {
		t.Errorf("loopback: %s", why)
	}
}

// TestStrip: a client's split protocol members are gone from its body,
// at the top level and inside vllm_xargs, in every occurrence (escaped
// or repeated keys); the other members are the client's bytes, and a
// body without any is returned as it is.
func TestStrip(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{`{"model":"m","prompt":"p"}`, `{"model":"m","prompt":"p"}`},
		{`{"model":"m","kv_transfer_params":{"do_remote_prefill":true,"remote_host":"169.254.169.254"},"prompt":"p"}`, `{"model":"m","prompt":"p"}`},
		{`{"kv_transfer_params":{"do_remote_decode":true},"kv_transfer_param\u0073":1,"prompt":"p"}`, `{"prompt":"p"}`},
		{`{"prompt":"p","bootstrap_host":"10.0.0.9","bootstrap_port":1,"bootstrap_room":7,"routed_dp_rank":1,"data_parallel_rank":0,"disagg_prefill_dp_rank":2}`, `{"prompt":"p"}`},
		{`{"prompt":"p","vllm_xargs":{"kv_transfer_params":{"do_remote_decode":true},"a":1}}`, `{"prompt":"p","vllm_xargs":{"a":1}}`},
		{`{"prompt":"p","vllm_xargs":{"a":1}}`, `{"prompt":"p","vllm_xargs":{"a":1}}`},
		{`not json`, `not json`},
	} {
		if got := Strip([]byte(tt.in)); string(got) != tt.want {
			t.Errorf("Strip(%s) = %s, want %s", tt.in, got, tt.want)
		}
	}
}

// FuzzStrip: whatever a client sends, Strip's answer is the body itself
// or a JSON object without any member a client may not send.
func FuzzStrip(f *testing.F) {
	f.Add([]byte(`{"kv_transfer_params":{"a":1},"prompt":"p","vllm_xargs":{"kv_transfer_params":1}}`))
	f.Add([]byte(`{"bootstrap_room":1,"bootstrap_room":2}`))
	f.Add([]byte(`{"a":`))
	f.Fuzz(func(t *testing.T, body []byte) {
		out := Strip(body)
		if string(out) == string(body) {
			return
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(out, &m); err != nil {
			t.Fatalf("Strip(%q) = %q: %v", body, out, err)
		}
		for _, k := range clientDrop {
			if _, ok := m[k]; ok {
				t.Fatalf("Strip(%q) = %q keeps %s", body, out, k)
			}
		}
		var x map[string]json.RawMessage
		if json.Unmarshal(m[xargs], &x) == nil {
			if _, ok := x["kv_transfer_params"]; ok {
				t.Fatalf("Strip(%q) = %q keeps vllm_xargs.kv_transfer_params", body, out)
			}
		}
	})
}

func TestRolesTier(t *testing.T) {
	roles := map[string]string{"p": config.RolePrefill, "d": config.RoleDecode, "b": config.RoleBoth}
	f := Roles{Of: func(b *fleet.Backend) string { return roles[b.Name] }}
	fl := fleet.New()
	bs := map[string]*fleet.Backend{}
	for name := range roles {
		bs[name] = fl.Add(name, &url.URL{Scheme: "http", Host: name}, nil)
	}
	want := map[string]map[string]int{
		RolePrefill: {"p": 0, "d": -1, "b": -1},
		RoleDecode:  {"p": -1, "d": 0, "b": 1},
		"":          {"p": -1, "d": 1, "b": 0},
	}
	for role, tiers := range want {
		for name, tier := range tiers {
			if got := f.Tier(&request.View{Role: role}, bs[name]); got != tier {
				t.Errorf("leg %q on %s engine: tier %d, want %d", role, roles[name], got, tier)
			}
		}
	}
}

func TestLegs(t *testing.T) {
	v := &request.View{Model: "m"}
	legs := Legs(v, config.ProtocolVLLM, Transfer{})
	if len(legs) != 2 || legs[0].Role != RolePrefill || !legs[0].Optional || legs[0].View.Role != RolePrefill ||
		legs[1].Role != RoleDecode || legs[1].Optional || legs[1].View.Role != RoleDecode || v.Role != "" {
		t.Errorf("legs %+v", legs)
	}
	legs = Legs(v, config.ProtocolSGLang, Transfer{})
	if len(legs) != 2 || !legs[0].Beside || !legs[0].Optional || legs[0].Rewrite != nil || legs[0].View.Role != RolePrefill ||
		legs[1].Beside || legs[1].Rewrite != nil || legs[1].View.Role != RoleDecode {
		t.Errorf("sglang legs %+v", legs)
	}
}

// FuzzVLLMDecode: the prefill engine's answer is outside data; whatever it
// is, the decode body is valid JSON (the request's own, or it with the
// answer's params).
func FuzzVLLMDecode(f *testing.F) {
	f.Add([]byte(`{"kv_transfer_params":{"remote_engine_id":"e","remote_block_ids":[1]}}`))
	f.Add([]byte(`{"kv_transfer_params":null}`))
	f.Add([]byte(`{"kv_transfer_params":{"a":`))
	f.Fuzz(func(t *testing.T, prev []byte) {
		out := vllmDecode([]byte(`{"model":"m","prompt":"p"}`), prev)
		if !json.Valid(out) {
			t.Fatalf("decode body %q is not JSON", out)
		}
	})
}
