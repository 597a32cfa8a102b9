package fleet

// LoRAState is an engine's report of its LoRA adapters (package adapter's
// LoRA): the adapters of its running and waiting requests when it names
// them (vLLM's vllm:lora_requests_info), how many adapters it may hold at
// once and how many of those are taken.
type LoRAState struct {
	Running, Waiting []string
	// Named is set when the engine names its adapters (vLLM); SGLang
	// reports only counts.
	Named     bool
	Max, Used int
}

// HasRunning reports whether adapter is among the running requests'.
func (l *LoRAState) HasRunning(adapter string) bool { return has(l.Running, adapter) }

// HasWaiting reports whether adapter is among the waiting requests'.
func (l *LoRAState) HasWaiting(adapter string) bool { return has(l.Waiting, adapter) }

// Free reports whether the engine can take one more adapter without
// evicting one a request uses.
func (l *LoRAState) Free() bool { return l.Used < l.Max }

func has(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
