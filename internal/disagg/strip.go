package disagg

import (
	"slices"

	"github.com/kvroute/kvroute/internal/request"
)

// The split protocols' members are the router's to write. A client's
// kv_transfer_params would tell a vLLM engine to pull KV blocks from an
// address the client chose (do_remote_prefill) or to hold its blocks for
// a decode engine that never comes (do_remote_decode); a client's
// bootstrap_host, bootstrap_port or bootstrap_room would point an SGLang
// engine at a bootstrap server or claim another request's room; a
// data-parallel rank steers the engine to a rank the router did not
// choose. They are removed from every request before any leg is sent,
// split or whole.

// clientDrop are the top-level members removed from every client's body:
// vLLM's kv_transfer_params (ChatCompletionRequest and CompletionRequest
// read it at the top level), SGLang's bootstrap members and data-parallel
// ranks (its OpenAI requests and GenerateReqInput read them at the top
// level: routed_dp_rank, data_parallel_rank, disagg_prefill_dp_rank).
var clientDrop = []string{"kv_transfer_params", "bootstrap_host", "bootstrap_port", "bootstrap_room",
	"routed_dp_rank", "data_parallel_rank", "disagg_prefill_dp_rank"}

// xargs is vLLM's vllm_xargs, whose members become the sampling
// parameters' extra_args, where vLLM's Request reads kv_transfer_params
// too: that member is removed from it.
const xargs = "vllm_xargs"

// Headers are the client headers removed from every leg: vLLM reads the
// data-parallel rank from X-data-parallel-rank (any case; the engines'
// routers set it), and so do SGLang's (X-Data-Parallel-Rank).
var Headers = []string{"X-Data-Parallel-Rank"}

// Strip returns body without the members a client may not send
// (clientDrop, and kv_transfer_params inside vllm_xargs), body itself
// when it has none or is not a JSON object (it was parsed before, so a
// completion's is one). The members kept are the client's bytes (splice).
func Strip(body []byte) []byte {
	found := false
	var nested []byte // the last vllm_xargs, when it needs stripping
	err := request.Members(body, func(key []byte, _, value, end int) {
		switch k := string(key); {
		case slices.Contains(clientDrop, k):
			found = true
		case k == xargs:
			nested = nil
			if has(body[value:end], "kv_transfer_params") {
				found, nested = true, body[value:end]
			}
		}
	})
	if err != nil || !found {
		return body
	}
	var set []member
	if nested != nil {
		inner, ok := splice(nested, []string{"kv_transfer_params"})
		if !ok {
			return body
		}
		set = append(set, member{key: xargs, value: inner})
	}
	out, ok := splice(body, clientDrop, set...)
	if !ok {
		return body
	}
	return out
}

// has reports whether value is a JSON object with a member key.
func has(value []byte, key string) bool {
	found := false
	_ = request.Members(value, func(k []byte, _, _, _ int) {
		if string(k) == key {
			found = true
		}
	})
	return found
}
