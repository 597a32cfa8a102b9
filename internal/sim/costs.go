package sim

import (
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/fleet"
)

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

// learnLoads puts in r the CPU tier's loads node n's engine made since the
// last lesson, the growth of the counters the emulated engine exports as
// vLLM's (external_prefix_cache_hits_total, kv_offload_total_time_total
// CPU_to_GPU), taken by the live monitor's rule (fleet.Counters): the
// backend's cost model learns the load time per token from them
// (costmodel.Model.ObserveLoad) as the live router does.
func (n *node) learnLoads(r *fleet.Reading, st engine.Stats) {
	if dt, ds, ok := n.loads.Take(float64(st.ExternalHits), st.HostLoadTime.Seconds(), fleet.MinLoadTokens); ok {
		r.HostLoadTokens, r.HostLoadSeconds = dt, ds
	}
}
