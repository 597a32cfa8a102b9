package policy

import "github.com/kvroute/kvroute/internal/fleet"

// llmd-lora: llm-d's endpoint picker (llmd.go) with GIE's
// lora-affinity-scorer added at weight 1 beside prefix-cache-scorer 3,
// queue-scorer 2 and kv-cache-utilization-scorer 2, as llm-d's profiles
// for LoRA deployments configure it. The scorer gives each candidate
// LoRAScore of its engine's last vllm:lora_requests_info for the request's
// model (1.0 running, 0.8 a free slot, 0.6 waiting, 0 full), whatever the
// model: GIE scores a base model's request the same way, and an engine
// that reports no LoRA state scores 0, as GIE's empty maps with
// MaxActiveModels 0 do. Its prefix hashes are the scheduler's, salted
// with the adapter (GIE chains the model name into its first block hash).

// LLMDLoRAWeight is the lora-affinity-scorer's weight.
const LLMDLoRAWeight = 1

func init() {
	register("llmd-lora", func(o Options) Policy { return &LLMDLoRA{NewLLMDWith(o, LLMDLoRAWeight)} })
}

// LLMDLoRA is llm-d's picker with its LoRA affinity scorer.
type LLMDLoRA struct{ *LLMD }

// Name implements Policy.
func (*LLMDLoRA) Name() string { return "llmd-lora" }

// NewLLMDWith returns llm-d's picker with the lora-affinity-scorer at
// weight lora (0: none).
func NewLLMDWith(o Options, lora float64) *LLMD {
	p := NewLLMD(o)
	p.lora = lora
	return p
}

// loraScore is the weighted lora-affinity-scorer's score of b for in.
func (p *LLMD) loraScore(in *Input, b *fleet.Backend) float64 {
	if p.lora == 0 {
		return 0
	}
	e := b.Engine()
	if e == nil || e.LoRA == nil {
		return 0
	}
	return p.lora * LoRAScore(e.LoRA, in.View.Model)
}

var (
	_ Policy   = (*LLMDLoRA)(nil)
	_ Observer = (*LLMDLoRA)(nil)
)
