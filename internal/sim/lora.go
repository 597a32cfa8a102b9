package sim

import (
	"github.com/kvroute/kvroute/internal/adapter"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/workload"
)

// adapters is the workload's LoRA adapters, each of the base model: what
// the live router learns from the engines' /v1/models, where vLLM lists
// every adapter it serves with its parent.
func adapters(reqs []workload.Request, model string) map[string]string {
	m := map[string]string{}
	for i := range reqs {
		if a := reqs[i].Adapter; a != "" {
			m[a] = model
		}
	}
	return m
}

// loraState is the engine's vllm:lora_requests_info as the router reads
// it, nil for an engine without LoRA.
func loraState(e *engine.Engine) *fleet.LoRAState {
	info := e.LoRA()
	if info.MaxLoras == 0 {
		return nil
	}
	return adapter.NamedLoRA(info.Running, info.Waiting, info.MaxLoras)
}
