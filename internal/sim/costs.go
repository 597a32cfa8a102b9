package sim

import "github.com/kvroute/kvroute/internal/engine"

// computedSince is the prompt tokens node n's engine computed since the
// last reading, as the live monitor reads the growth of vLLM's prompt
// token counters: the prefill that the step just run (whose tokens, and
// so inter-token gaps, the engine has just produced) computed beside its
// decodes.
func (n *node) computedSince(st engine.Stats) float64 {
	d := st.PrefillTokensComputed - n.computed
	n.computed = st.PrefillTokensComputed
	return float64(d)
}
