package fleet

import "github.com/kvroute/kvroute/internal/adapter"

// LoRAState is an engine's report of its LoRA adapters, as package adapter
// reads it (vllm:lora_requests_info, SGLang's slot gauges) and the
// simulator builds it from the engine model (adapter.NamedLoRA): one type,
// so that neither path converts it by hand.
type LoRAState = adapter.LoRA
