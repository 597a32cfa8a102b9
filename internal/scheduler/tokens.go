package scheduler

import (
	"github.com/kvroute/kvroute/internal/request"
)

// The router's one conversion between its prefix blocks (BlockChars
// characters of the rendered prompt) and tokens: request.BytesPerToken
// characters a token, as request.EstimateTokens counts a prompt. Every
// policy reads the result (policy.Input.Cached and Uncached), the fleet's
// accounting is opened with it (the ticket's uncached tokens), and the
// admission queue orders by it (Uncached).

// tokensOf is the prompt tokens that n blocks stand for.
func (s *Scheduler) tokensOf(n int64) int64 {
	return n * int64(s.blockCh) / request.BytesPerToken
}

// blocksOf is the full blocks that tokens tokens fill.
func (s *Scheduler) blocksOf(tokens int64) int64 {
	return tokens * request.BytesPerToken / int64(s.blockCh)
}

// split is the prompt tokens of v that a backend holding its first
// blocks blocks has cached (at most the prompt: a prompt counted in exact
// tokens may have fewer than its blocks' characters suggest), and the
// rest, which it would compute: the one formula of "uncached".
func (s *Scheduler) split(v *request.View, blocks int32) (cached, uncached int64) {
	prompt := int64(max(v.PromptTokens, 0))
	cached = min(prompt, s.tokensOf(int64(blocks)))
	return cached, prompt - cached
}
