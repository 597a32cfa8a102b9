package fleet

// Where a backend's running-sequence cap comes from, as /admin/backends
// shows it beside the cap (SeqCap).
const (
	// CapFromEngine: the engine reports it (llama.cpp's slot count).
	CapFromEngine = "engine"
	// CapFromConfig: the backend's entry sets it (max_num_seqs).
	CapFromConfig = "config"
	// CapLearned: learned from the engine's running and waiting counts
	// and confirmed (CapConfirmations).
	CapLearned = "learned"
	// CapPlausible: the cold-start cap, not confirmed yet
	// (Limits.PlausibleSeqs).
	CapPlausible = "plausible"
)

// SeqCap returns the cap b is routed by (Limits.PlausibleSeqs) and where
// it comes from (CapFromEngine, CapFromConfig, CapLearned, CapPlausible);
// 0 and "" when nothing suggests one.
func (b *Backend) SeqCap() (int, string) {
	l := b.Limits()
	switch {
	case l.MaxNumSeqs > 0 && b.limits.reportedSeqs.Load() > 0:
		return l.MaxNumSeqs, CapFromEngine
	case l.MaxNumSeqs > 0 && b.limits.maxNumSeqs.Load() > 0:
		return l.MaxNumSeqs, CapFromConfig
	case l.MaxNumSeqs > 0:
		return l.MaxNumSeqs, CapLearned
	case l.PlausibleSeqs > 0:
		return l.PlausibleSeqs, CapPlausible
	}
	return 0, ""
}

// seqWaiting is how many of the requests an engine reports waiting may
// be waiting for a running-sequence slot, which is what the learned cap
// reads (ObserveRunning). A request also waits for an adapter slot: vLLM
// passes over a waiting request whose LoRA adapter would be one adapter
// too many in the batch (--max-loras) and counts it as waiting all the
// same, so while the engine names a waiting adapter that cannot join the
// batch (adapter.LoRA.WaitsForAdapterSlot) its waiting count says nothing
// of the sequence cap: an engine capped at 1,024 sequences that runs two
// adapters' requests with a third adapter's waiting would otherwise teach
// a cap of 2. The engine's KV room is ObserveRunning's own test
// (CapKVUsage).
func seqWaiting(s *EngineState) int {
	if s.LoRA != nil && s.LoRA.WaitsForAdapterSlot() {
		return 0
	}
	return s.Waiting
}
