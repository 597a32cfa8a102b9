package fleet

// Reading is one reading of an engine's own metrics, with what it teaches
// beyond the report itself: the monitor makes one of every scrape, the
// simulator one after every engine step, and both hand it to Learn, so
// that the live router and the simulated one learn the same from the same
// reading.
type Reading struct {
	// State is the engine's report, which Learn publishes (Engine); it
	// must not be nil.
	State *EngineState
	// MaxNumSeqs is the running-sequence cap the engine reports (llama.cpp's
	// slot count); 0 when it reports none, which keeps the cap it reported
	// before.
	MaxNumSeqs int
	// PrefillTokens in PrefillSeconds is the prefill throughput the
	// engine's counters show since the last reading that taught one (their
	// growth); zero when this one teaches none.
	PrefillTokens, PrefillSeconds float64
	// DecodeTokens in DecodeSeconds is the time per output token the
	// engine's inter-token latency shows since the last reading that taught
	// one (the growth of its count and sum); zero when this one teaches
	// none.
	DecodeTokens, DecodeSeconds float64
	// ComputedTokens is the prompt tokens the engine computed (not found
	// in its cache) over the same span as DecodeTokens, which the steps
	// timed by the inter-token latency also ran; negative when the engine
	// does not tell: its decode time then teaches the cost model nothing,
	// since prefill chunks run in the same steps would read as decode
	// time.
	ComputedTokens float64
	// HostLoadTokens in HostLoadSeconds is the load time per token of the
	// engine's CPU tier its counters show since the last reading that
	// taught one; zero when this one teaches none (MinLoadTokens).
	HostLoadTokens, HostLoadSeconds float64
}

// MinLoadTokens is the fewest tokens loaded from a CPU tier that teach its
// load time: a few blocks' loads are timed mostly by their setup.
const MinLoadTokens = 256

// Learn teaches b one reading of its engine: the prefill rate and the
// decode time the engine's counters show (ObserveEnginePrefill,
// ObserveEngineDecode) and what they teach its cost model (Cost), its
// running-sequence cap (reported, or learned from
// the running and waiting counts: ObserveRunning, the waiting ones that
// may wait for a sequence slot only: seqWaiting), and, last, its report
// (SetEngine), so that whoever reads the report also finds what it taught.
// A count the engine does not report (State.Missing) teaches nothing.
func (b *Backend) Learn(r Reading) {
	b.ObserveEnginePrefill(r.PrefillTokens, r.PrefillSeconds)
	b.ObserveEngineDecode(r.DecodeTokens, r.DecodeSeconds)
	b.learnCost(r)
	if r.MaxNumSeqs > 0 {
		b.SetEngineMaxNumSeqs(r.MaxNumSeqs)
	}
	s := r.State
	if s.Has(EngineRunning | EngineWaiting) {
		kv := s.KVUsage
		if !s.Has(EngineKVUsage) {
			kv = -1 // unknown, which ObserveRunning reads as not full
		}
		b.ObserveRunning(s.Running, seqWaiting(s), kv)
	}
	b.SetEngine(s)
}
