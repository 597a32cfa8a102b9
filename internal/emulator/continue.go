package emulator

import (
	"github.com/cespare/xxhash/v2"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/request"
)

// continueAnswer makes r, a chat request continuing an answer
// (continue_final_message: v.Continues bytes of its prompt are the answer
// so far), generate what the original request would have generated after
// that text: the emulated model's output is a function of the original
// prompt (its seed) and of the position in the answer, so a stream moved
// to another engine mid-answer reads as one uninterrupted stream. The
// original request is the prompt without the text, its budgets the
// continuation's plus the text's tokens (a router continuing an answer
// reduces them by as much); its length is drawn by the one rule
// (engine.OutputTokens) and the continuation generates the rest of it,
// at least one token. It returns the seed of the output's words, offset
// by the tokens already generated.
//
// A min_tokens the answer so far had already reached is not known to the
// continuation (it is sent as 0): the original's length is then drawn as
// if it had been unset, which differs from the uninterrupted answer's
// only when the original min_tokens was above 1.
func continueAnswer(r *engine.Request, v *request.View, maxModelLen int) uint64 {
	prompt := r.Prompt
	base, text := prompt[:len(prompt)-v.Continues], prompt[len(prompt)-v.Continues:]
	k := engine.Tokens(text)
	seed := xxhash.Sum64String(base)
	orig := func(n int) int {
		if n > 0 {
			return n + k
		}
		return 0
	}
	var lengthSeed uint64
	if !v.IgnoreEOS {
		lengthSeed = seed
	}
	total := engine.OutputTokens(orig(v.MaxTokens), orig(v.MinTokens), v.IgnoreEOS, engine.Tokens(base), maxModelLen, lengthSeed)
	r.OutputTokens = max(1, total-k)
	return seed + uint64(k)
}
