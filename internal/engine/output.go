package engine

import (
	"github.com/cespare/xxhash/v2"

	"github.com/kvroute/kvroute/internal/prefix"
)

// DefaultMaxTokens caps the output of a request that sets no max_tokens.
// vLLM would allow the whole rest of the context; an emulated engine that
// generated 100,000 tokens for every such request would make benchmarks
// measure nothing but decode, so the cap is the one place this emulator
// departs from vLLM's defaults on purpose.
const DefaultMaxTokens = 1024

// OutputTokens decides how many tokens a request generates, the one rule
// for every driver of the engine. maxTokens and minTokens are the client's
// max_tokens (0 when unset) and min_tokens; promptTokens and maxModelLen
// bound the output by the rest of the context.
//
// With ignoreEOS the request runs to its cap: maxTokens, or when unset the
// rest of the context up to DefaultMaxTokens. Otherwise the emulated model
// "stops naturally" at a length drawn uniformly from [minTokens, cap] by a
// hash of seed, so the same seed always gives the same length. The result
// is at least 1; a request whose prompt leaves no room gets 1 and Add
// rejects it with vLLM's context error.
func OutputTokens(maxTokens, minTokens int, ignoreEOS bool, promptTokens, maxModelLen int, seed uint64) int {
	hi := maxTokens
	if hi <= 0 {
		hi = min(maxModelLen-promptTokens, DefaultMaxTokens)
	}
	if hi < 1 {
		return 1
	}
	if ignoreEOS {
		return hi
	}
	lo := max(minTokens, 1)
	if lo >= hi {
		return hi
	}
	return lo + int(prefix.Mix64(seed)%uint64(hi-lo+1))
}

// SetOutput fills r's output inputs from the client's sampling parameters,
// as every driver must: OutputTokens by the one rule above, seeded by a
// hash of the prompt so that the same request generates the same number of
// tokens from the emulator and in the simulator, and MaxTokens for the
// context check. r.Prompt must be set; maxModelLen is the engine's.
func (r *Request) SetOutput(maxTokens, minTokens int, ignoreEOS bool, maxModelLen int) {
	// With ignoreEOS the length does not depend on the seed, so the prompt
	// (tens of kilobytes for a long one) is not hashed for nothing.
	var seed uint64
	if !ignoreEOS {
		seed = xxhash.Sum64String(r.Prompt)
	}
	r.OutputTokens = OutputTokens(maxTokens, minTokens, ignoreEOS, Tokens(r.Prompt), maxModelLen, seed)
	r.MaxTokens = maxTokens
}
