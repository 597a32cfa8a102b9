// Package disagg splits a request over a prefill and a decode engine
// (prefill/decode disaggregation): which legs a request has, what each leg
// sends (the body rewrites of the engines' KV transfer protocols: vLLM's
// kv_transfer_params, SGLang's bootstrap fields), and
// which engines may take which leg (a scheduler filter by role). The legs
// themselves run in the request's lifecycle (package lifecycle): routed,
// attempted, retried and settled there, never here.
//
// It must not route (package scheduler does), send anything, or keep state
// beyond what a request carries.
package disagg

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"slices"
	"strconv"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/lifecycle"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/request"
)

// Leg roles, as lifecycle.Leg.Role and request.View.Role.
const (
	RolePrefill = config.RolePrefill
	RoleDecode  = config.RoleDecode
)

// Legs returns the legs of a request v split under protocol, each routed on
// a copy of v with its role: an optional prefill leg (skipped when no
// prefill engine can take it: the decode leg's engine then serves the
// request whole), and a decode leg.
//
// Under vllm the prefill leg runs first and, when it fails on every
// attempt, is skipped too; its answer's kv_transfer_params go to the
// decode leg when t allows them (Transfer), else the decode leg serves
// the request whole (its Whole says why). Under sglang it is sent at once
// with the decode leg (Beside), once; Bootstrap gives both legs their
// body once they are routed.
func Legs(v *request.View, protocol string, t Transfer) []lifecycle.Leg {
	pre, dec := *v, *v
	pre.Role, dec.Role = RolePrefill, RoleDecode
	if protocol == config.ProtocolSGLang {
		return []lifecycle.Leg{
			{Role: RolePrefill, View: &pre, Optional: true, Beside: true},
			{Role: RoleDecode, View: &dec},
		}
	}
	// The prefill engine gets VLLMPrefill's body: one token, not streamed.
	// Its answer follows the prefill, so its first byte teaches the
	// engine's prefill rate as a stream's would (scheduler.Route).
	pre.MaxTokens, pre.Stream = 1, false
	legs := []lifecycle.Leg{
		{Role: RolePrefill, View: &pre, Optional: true, Rewrite: VLLMPrefill},
		{Role: RoleDecode, View: &dec},
	}
	// The decode leg's Rewrite reads the prefill leg's engine when it runs:
	// legs is the request's own slice (lifecycle.Request.SetLegs keeps it).
	legs[1].Rewrite = func(body, prev []byte) []byte {
		var host string
		if m := legs[0].Target; m != nil {
			host = m.B.URL.Hostname()
		}
		out, why := t.decode(body, prev, host)
		legs[1].Whole = why
		return out
	}
	return legs
}

// room draws a bootstrap room: a random integer in [0, 2^63), as SGLang's
// router draws it. A variable, for tests.
var room = func() uint64 { return rand.Uint64() >> 1 }

// Bootstrap gives the legs of a routed SGLang request (Legs) their one
// body: the request's (body) with bootstrap_host (the prefill engine's
// host), bootstrap_port (port) and a fresh bootstrap_room, which the decode
// engine uses to pull the prompt's KV cache from the prefill engine. A
// request whose prefill leg was skipped keeps its own body (served whole),
// and one without a Beside prefill leg is left alone.
func Bootstrap(legs []lifecycle.Leg, body []byte, port int) {
	if len(legs) != 2 || !legs[0].Beside || legs[0].Target == nil {
		return
	}
	// The members batchSize reads, the last of each (json.loads's).
	fields := map[string]json.RawMessage{}
	if request.Members(body, func(key []byte, _, value, end int) {
		if k := string(key); slices.Contains(batchKeys, k) {
			fields[k] = body[value:end]
		}
	}) != nil {
		return
	}
	host, _ := json.Marshal(legs[0].Target.B.URL.Hostname())
	portJSON := json.RawMessage(strconv.Itoa(port))
	var hosts, ports, rooms json.RawMessage
	if n := batchSize(fields); n > 0 {
		// A batch: one of each a sequence, as SGLang's router sends them
		// (its bootstrap_injector.rs).
		hl, pl, rl := make([]json.RawMessage, n), make([]json.RawMessage, n), make([]json.RawMessage, n)
		for i := range n {
			hl[i], pl[i] = host, portJSON
			rl[i] = json.RawMessage(strconv.FormatUint(room(), 10))
		}
		hosts, ports, rooms = list(hl), list(pl), list(rl)
	} else {
		hosts, ports, rooms = host, portJSON, json.RawMessage(strconv.FormatUint(room(), 10))
	}
	out, ok := splice(body, nil, member{key: "bootstrap_host", value: hosts},
		member{key: "bootstrap_port", value: ports}, member{key: "bootstrap_room", value: rooms})
	if !ok {
		return
	}
	shared := func(_, _ []byte) []byte { return out }
	legs[0].Rewrite, legs[1].Rewrite = shared, shared
}

// batchKeys are the members batchSize reads.
var batchKeys = []string{"n", "prompt", "text", "input_ids"}

// maxBatch bounds the bootstrap lists of one request.
const maxBatch = 4096

// batchSize is how many sequences an SGLang request generates at once, by
// the rule of SGLang's router: n above 1, else the length of a non-empty
// prompt, text or input_ids array (m holds the request's members batchKeys
// names); 0 for a single sequence. Unlike the
// router, an array of token ids is one prompt, not a batch of its tokens
// (SGLang's engine reads it as one).
func batchSize(m map[string]json.RawMessage) int {
	var n uint64
	if json.Unmarshal(m["n"], &n) == nil && n > 1 {
		return int(min(n, maxBatch))
	}
	for _, key := range []string{"prompt", "text", "input_ids"} {
		var items []json.RawMessage
		if json.Unmarshal(m[key], &items) != nil || len(items) == 0 {
			continue
		}
		if c := bytes.TrimSpace(items[0]); len(c) > 0 && (c[0] == '"' || c[0] == '[') {
			return min(len(items), maxBatch)
		}
	}
	return 0
}

// list is the JSON array of items.
func list(items []json.RawMessage) json.RawMessage {
	b, _ := json.Marshal(items)
	return b
}

// Roles is the scheduler filter of a split fleet: a prefill leg goes to
// prefill engines only, a decode leg to decode engines (both engines when
// no decode engine is left), and a whole request to both engines, else
// decode ones, else (Whole) prefill ones.
type Roles struct {
	// Of is a backend's configured role (config.RoleOf of its entry).
	Of func(b *fleet.Backend) string
	// Whole lets a whole request go to a prefill engine when no other
	// engine can take it (a fleet left with no engine to decode a model):
	// vLLM's prefill engines serve any request, SGLang's do not.
	Whole bool
}

// Tier is b's tier for v (policy.Filter).
func (f Roles) Tier(v *request.View, b *fleet.Backend) int {
	role := f.Of(b)
	switch v.Role {
	case RolePrefill:
		if role == RolePrefill {
			return 0
		}
	case RoleDecode:
		switch role {
		case RoleDecode:
			return 0
		case config.RoleBoth:
			return 1
		}
	default:
		switch role {
		case config.RoleBoth:
			return 0
		case RoleDecode:
			return 1
		case RolePrefill:
			if f.Whole {
				return 2
			}
		}
	}
	return -1
}

var _ policy.Filter = Roles{}

// remoteDecode is the kv_transfer_params of a vLLM prefill leg: compute the
// prompt's KV cache and keep it for a decode engine to pull (vLLM's
// NixlConnector, and the connectors that read the same fields).
var remoteDecode = []byte(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)

// VLLMPrefill is the body of a vLLM prefill leg (lifecycle.Leg.Rewrite):
// the request's, answered in one piece with one token (stream false,
// max_tokens 1, max_completion_tokens 1 when the request has it, no
// stream_options, no min_tokens or min_completion_tokens, which vLLM
// refuses above max_tokens: vLLM's toy_proxy_server.py drops them too),
// with kv_transfer_params asking for a remote decode. The other members
// are the client's bytes (splice); the changed ones follow them. A body
// that is not a JSON object (it was parsed before routing, so never) is
// sent as it is.
func VLLMPrefill(body, _ []byte) []byte {
	out, ok := splice(body, prefillDrop,
		member{key: "stream", value: jsonFalse},
		member{key: "max_tokens", value: jsonOne},
		member{key: "max_completion_tokens", value: jsonOne, present: true},
		member{key: "kv_transfer_params", value: remoteDecode})
	if !ok {
		return body
	}
	return out
}

// prefillDrop are the members a prefill leg goes without.
var prefillDrop = []string{"stream_options", "min_tokens", "min_completion_tokens"}

var (
	jsonFalse = []byte("false")
	jsonOne   = []byte("1")
)

// decode is the body of a vLLM decode leg: the request's as the client
// sent it, with the kv_transfer_params of the prefill leg's answer (prev)
// from the engine at host pre, do_remote_prefill set, so that the decode
// engine pulls the prompt's KV cache instead of computing it (the other
// members are the client's bytes, splice). Without an answer (the prefill
// leg was skipped), or with one whose kv_transfer_params are missing or
// refused (checkParams), the body is the request's own: the decode engine
// serves it whole, and why says why (for an answer that came).
func (t Transfer) decode(body, prev []byte, pre string) (out []byte, why string) {
	if len(prev) == 0 {
		return body, ""
	}
	var answer struct {
		KV json.RawMessage `json:"kv_transfer_params"`
	}
	var kv map[string]json.RawMessage
	if err := json.Unmarshal(prev, &answer); err != nil {
		return body, "prefill answer unusable: not JSON"
	}
	if json.Unmarshal(answer.KV, &kv) != nil || len(kv) == 0 {
		return body, "prefill answer unusable: no kv_transfer_params object"
	}
	if err := t.checkParams(kv, len(answer.KV), pre); err != nil {
		return body, "prefill answer unusable: " + err.Error()
	}
	kv["do_remote_prefill"] = json.RawMessage("true")
	kv["do_remote_decode"] = json.RawMessage("false")
	enc := marshal(kv, nil)
	if enc == nil {
		return body, "prefill answer unusable: kv_transfer_params do not encode"
	}
	out, ok := splice(body, nil, member{key: "kv_transfer_params", value: enc})
	if !ok {
		return body, ""
	}
	return out, ""
}

// marshal is m's JSON (the decode leg's kv_transfer_params), or fallback
// should m not marshal (it holds only raw messages that came from a valid
// document, so it does): compact, its keys sorted, and its strings as the
// engine wrote them (no HTML escaping of
// <, > and &, which neither vLLM's proxy nor SGLang's router adds).
func marshal(m map[string]json.RawMessage, fallback []byte) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if enc.Encode(m) != nil {
		return fallback
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

// SetRoom replaces the draw of bootstrap rooms and returns the one it
// replaced: for tests that check the rooms sent.
func SetRoom(f func() uint64) func() uint64 {
	prev := room
	room = f
	return prev
}
