package emulator

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/openai"
)

// pdPreset is the test preset with a transfer slow enough to see: 1 s of
// emulated latency plus 1 ms a token.
func pdPreset(t *testing.T) engine.Preset {
	t.Helper()
	p, err := engine.LookupPreset(testPreset)
	if err != nil {
		t.Fatal(err)
	}
	p.KVTransferLatency, p.KVTransferPerToken = time.Second, time.Millisecond
	return p
}

// startRole runs an engine of role on loopback at time scale 10.
func startRole(t *testing.T, role string) *Running {
	t.Helper()
	r, err := Start(t.Context(), Config{Preset: pdPreset(t), TimeScale: 10, Role: role, EngineID: "engine-" + role}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// postRaw posts body to url and returns the status and the answer's bytes;
// an engine that never answers fails the test after a minute.
func postRaw(t *testing.T, url, body string) (int, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	resp := post(t, ctx, url, json.RawMessage(body))
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// A prefill engine answers a prefill leg with vLLM's kv_transfer_params
// (its engine id, the prompt's blocks, its side channel) and keeps the
// blocks; a decode engine given them receives the prompt's KV cache instead
// of computing it, after the transfer time.
func TestPrefillDecodeLegs(t *testing.T) {
	pre, dec := startRole(t, RolePrefill), startRole(t, RoleDecode)
	prompt := strings.Repeat("0123456789abcdef", 40) // 160 tokens: 10 blocks
	n := engine.Tokens(prompt)
	prefillBody := fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":1,"stream":false,"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}}`,
		pre.Server.Model(), prompt)
	status, ans := postRaw(t, pre.URL+"/v1/completions", prefillBody)
	if status != 200 {
		t.Fatalf("prefill leg: %d %s", status, ans)
	}
	var answer struct {
		ID string          `json:"id"`
		KV json.RawMessage `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(ans, &answer); err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(pre.URL)
	port, _ := strconv.Atoi(u.Port())
	blocks := make([]string, n/engine.BlockSize)
	for i := range blocks {
		blocks[i] = strconv.Itoa(i) // a fresh engine's blocks, in order
	}
	want := fmt.Sprintf(`{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[[%s]],"remote_engine_id":"engine-prefill","remote_request_id":%q,"remote_host":"127.0.0.1","remote_port":%d,"tp_size":1}`,
		strings.Join(blocks, ","), answer.ID, port)
	if string(answer.KV) != want {
		t.Errorf("kv_transfer_params\n%s\nwant\n%s", answer.KV, want)
	}
	if st := pre.Server.Stats(); st.HeldRequests != 1 || st.KVUsage == 0 {
		t.Errorf("prefill engine after the answer: %+v: want the prompt's blocks held", st)
	}

	// An idle prefill engine lets the blocks go once the transfer's time
	// has passed (116 ms real at scale 10; polled for up to a minute).
	for deadline := time.Now().Add(time.Minute); pre.Server.Stats().HeldRequests != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("prefill engine still holds the blocks a minute later: %+v", pre.Server.Stats())
		}
	}
	if st := pre.Server.Stats(); st.KVUsage != 0 {
		t.Errorf("prefill engine after the hold: KV usage %v", st.KVUsage)
	}

	// The decode leg: the client's request with the answer's params, as
	// the router sends it.
	decodeBody := fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":4,"ignore_eos":true,"kv_transfer_params":%s}`, dec.Server.Model(), prompt, answer.KV)
	start := time.Now()
	status, ans = postRaw(t, dec.URL+"/v1/completions", decodeBody)
	took := time.Since(start)
	if status != 200 {
		t.Fatalf("decode leg: %d %s", status, ans)
	}
	var out openai.Response
	if err := json.Unmarshal(ans, &out); err != nil {
		t.Fatal(err)
	}
	if out.Usage == nil || out.Usage.CompletionTokens != 4 || out.Usage.PromptTokens != n ||
		out.Usage.PromptTokensDetails == nil || out.Usage.PromptTokensDetails.CachedTokens != n-1 || out.KVTransferParams != nil {
		t.Errorf("decode answer %s: want 4 tokens, %d prompt tokens of which %d cached, no kv_transfer_params", ans, n, n-1)
	}
	st := dec.Server.Stats()
	if st.KVTransferTokens != int64(n) || st.PrefillTokensComputed != 1 {
		t.Errorf("decode engine: %d tokens received, %d computed: want %d and 1 (the last prompt token)", st.KVTransferTokens, st.PrefillTokensComputed, n)
	}
	// The transfer alone is 1.16 s emulated, 116 ms real at scale 10; a
	// loaded machine only makes the answer later.
	p := pdPreset(t)
	if floor := time.Duration(float64(p.KVTransferLatency+time.Duration(n)*p.KVTransferPerToken) / 10); took < floor {
		t.Errorf("decode leg answered in %v, before its transfer could end (%v)", took, floor)
	}
}

// Bad kv_transfer_params, and legs sent to an engine of the other role, get
// vLLM's 400 with a message naming the member.
func TestKVTransferParamsErrors(t *testing.T) {
	pre, dec := startRole(t, RolePrefill), startRole(t, RoleDecode)
	good := `"do_remote_prefill":true,"remote_engine_id":"e","remote_host":"h","remote_port":5600`
	tests := []struct {
		name   string
		url    string
		params string
		want   string
	}{
		{"not an object", dec.URL, `[1]`, "kv_transfer_params must be a JSON object"},
		{"flag not a boolean", dec.URL, `{"do_remote_prefill":"yes"}`, "kv_transfer_params.do_remote_prefill must be a boolean"},
		{"both legs", dec.URL, `{"do_remote_prefill":true,"do_remote_decode":true}`, "cannot both be true"},
		{"no engine id", dec.URL, `{"do_remote_prefill":true,"remote_host":"h","remote_port":1,"remote_block_ids":[1]}`, "remote_engine_id must be a non-empty string"},
		{"no host", dec.URL, `{"do_remote_prefill":true,"remote_engine_id":"e","remote_port":1,"remote_block_ids":[1]}`, "remote_host must be"},
		{"port out of range", dec.URL, `{` + strings.Replace(good, "5600", "70000", 1) + `,"remote_block_ids":[1]}`, "remote_port must be an integer from 1 to 65535"},
		{"port not an integer", dec.URL, `{` + strings.Replace(good, "5600", "1.5", 1) + `,"remote_block_ids":[1]}`, "remote_port must be an integer"},
		{"no blocks", dec.URL, `{` + good + `}`, "remote_block_ids must be a list"},
		{"string block ids", dec.URL, `{` + good + `,"remote_block_ids":["DUMMY_ID"]}`, "remote_block_ids must be a list of non-negative integer"},
		{"negative block id", dec.URL, `{` + good + `,"remote_block_ids":[[1,-2]]}`, "remote_block_ids must be a list of non-negative integer"},
		{"too few blocks", dec.URL, `{` + good + `,"remote_block_ids":[[1]]}`, "remote_block_ids names 1 blocks; the prompt's 2 full blocks"},
		{"bad tp_size", dec.URL, `{"tp_size":0}`, "tp_size must be a positive integer"},
		{"bad request id", dec.URL, `{"remote_request_id":7}`, "remote_request_id must be a string"},
		{"decode leg to a prefill engine", pre.URL, `{` + good + `,"remote_block_ids":[1,2]}`, "this is a prefill engine"},
		{"prefill leg to a decode engine", dec.URL, `{"do_remote_decode":true}`, "this is a decode engine"},
	}
	prompt := strings.Repeat("x", 2*engine.BlockSize*engine.BytesPerToken+8) // 2 full blocks and a part
	// vLLM's sampling check that a prefill leg keeping the client's
	// min_tokens trips.
	if status, b := postRaw(t, pre.URL+"/v1/completions", `{"prompt":"hi","max_tokens":1,"min_tokens":2}`); status != 400 ||
		!strings.Contains(string(b), "min_tokens must be less than or equal to max_tokens=1, got 2.") {
		t.Errorf("min_tokens above max_tokens: %d %s", status, b)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, b := postRaw(t, tt.url+"/v1/completions", fmt.Sprintf(`{"prompt":%q,"max_tokens":1,"kv_transfer_params":%s}`, prompt, tt.params))
			var e openai.ErrorBody
			if status != http.StatusBadRequest || json.Unmarshal(b, &e) != nil || e.Error.Type != typeBadRequest || !strings.Contains(e.Error.Message, tt.want) {
				t.Errorf("status %d, body %s: want 400 saying %q", status, b, tt.want)
			}
		})
	}
	// Null params, and the router's own prefill body without a decode
	// leg's members, are fine; so is a whole request on either role.
	for _, params := range []string{`null`, `{}`, `{"do_remote_decode":false,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`} {
		for _, u := range []string{pre.URL, dec.URL} {
			if status, b := postRaw(t, u+"/v1/completions", fmt.Sprintf(`{"prompt":"hi","max_tokens":1,"kv_transfer_params":%s}`, params)); status != 200 {
				t.Errorf("params %s: %d %s", params, status, b)
			}
		}
	}
}

// FuzzParseKVTransfer: no kv_transfer_params crash the parser, and what it
// accepts as a decode leg names a non-negative number of blocks.
func FuzzParseKVTransfer(f *testing.F) {
	for _, s := range []string{
		`null`, `{}`, `[]`, `{"do_remote_decode":true}`,
		`{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[[1,2,3]],"remote_engine_id":"e","remote_request_id":"r","remote_host":"h","remote_port":5600,"tp_size":1}`,
		`{"do_remote_prefill":true,"remote_block_ids":[1,2],"remote_engine_id":"e","remote_host":"h","remote_port":1}`,
		`{"do_remote_prefill":true,"remote_block_ids":[[1],[]],"remote_engine_id":"e","remote_host":"h","remote_port":65535}`,
		`{"remote_block_ids":[["x"]],"tp_size":1e3}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		kt, err := parseKVTransfer(raw)
		if err != nil {
			if !strings.HasPrefix(err.Error(), kvParamsKey) {
				t.Fatalf("error %q does not name the member", err)
			}
			return
		}
		if kt.blocks < 0 || (kt.remoteDecode && kt.remotePrefill) {
			t.Fatalf("accepted %s as %+v", raw, kt)
		}
		if _, err := kvTransferOf(append(append([]byte(`{"kv_transfer_params":`), raw...), '}')); err != nil && json.Valid(raw) {
			t.Fatalf("params %s accepted alone but not in a body: %v", raw, err)
		}
	})
}
