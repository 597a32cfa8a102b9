package engine

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// The public figures the presets are derived from; docs/engine.md shows the
// arithmetic with these same numbers and says where each comes from.
type gpu struct {
	bf16FLOPS float64 // dense BF16 tensor FLOP/s
	hbmBytesS float64 // HBM bandwidth, bytes/s
	memBytes  float64 // HBM capacity, bytes
	// nicBytesS is the GPU's own RDMA network link (one NIC a GPU, as in
	// NVIDIA's DGX systems), bytes/s: what a KV transfer from a prefill
	// engine runs over; 0 means ndr400.
	nicBytesS float64
	// pcieBytesS is the GPU's host link, one direction, bytes/s: what a
	// KV block loaded from a CPU tier runs over.
	pcieBytesS float64
}

type llm struct {
	name                     string // served model name
	params                   float64
	layers, kvHeads, headDim int
	hidden, intermediate     int // widths of the attention and MLP projections
	context                  int // context length in tokens; 0 is llama31Context
}

const gib = 1 << 30

var (
	h100 = gpu{bf16FLOPS: 989e12, hbmBytesS: 3.35e12, memBytes: 80 * gib, nicBytesS: ndr400, pcieBytesS: pcie5x16}
	a100 = gpu{bf16FLOPS: 312e12, hbmBytesS: 2.039e12, memBytes: 80 * gib, nicBytesS: hdr200, pcieBytesS: pcie4x16}
	// The A10G is AWS's variant of the A10 (G5 instances): the A10's
	// 24 GB of GDDR6 at 600 GB/s, 70 dense BF16 tensor TFLOPS against the
	// A10's 125. A KV transfer goes over the instance's network:
	// 100 Gb/s on the largest G5 (g5.48xlarge).
	a10g = gpu{bf16FLOPS: 70e12, hbmBytesS: 600e9, memBytes: 24e9, nicBytesS: eth100, pcieBytesS: pcie4x16}

	llama31_8B  = llm{name: "meta-llama/Llama-3.1-8B-Instruct", params: 8.03e9, layers: 32, kvHeads: 8, headDim: 128, hidden: 4096, intermediate: 14336}
	llama31_70B = llm{name: "meta-llama/Llama-3.1-70B-Instruct", params: 70.6e9, layers: 80, kvHeads: 8, headDim: 128, hidden: 8192, intermediate: 28672}
	mistral_7B  = llm{name: "mistralai/Mistral-7B-Instruct-v0.3", params: 7.25e9, layers: 32, kvHeads: 8, headDim: 128, hidden: 4096, intermediate: 14336, context: 32768}
)

// Assumptions shared by every preset (docs/engine.md explains each).
const (
	mfu               = 0.40 // fraction of peak FLOPs reached by the matmuls of a large batch
	mbu               = 0.80 // fraction of peak HBM bandwidth reached by weight and KV reads
	gpuMemUtil        = 0.90 // vLLM's --gpu-memory-utilization default
	activationReserve = 2 * gib
	allReduceLatency  = 15 * time.Microsecond // one small all-reduce across NVLink
	llama31Context    = 131072
	// A LoRA adapter is of rank loraRank on every linear layer, in BF16,
	// read from the host's page cache and copied to the GPU at
	// loraLoadBytesPerSec.
	loraRank            = 16
	loraLoadBytesPerSec = 2e9
	// A KV transfer (vLLM's NixlConnector over RDMA) moves the prompt's KV
	// bytes at linkUtil of the GPU's NIC line rate, after a fixed
	// kvTransferSetup: the decode engine's read request to the prefill
	// engine and the completion notification back, two network round
	// trips of the side channel.
	ndr400          = 400e9 / 8 // ConnectX-7, InfiniBand NDR: 400 Gb/s
	hdr200          = 200e9 / 8 // ConnectX-6, InfiniBand HDR: 200 Gb/s
	eth100          = 100e9 / 8 // the largest G5 instance's network: 100 Gb/s
	linkUtil        = 0.80
	kvTransferSetup = 2 * 50 * time.Microsecond
	// A block loaded from a CPU tier (vLLM's OffloadingConnector) crosses
	// the GPU's PCIe link at linkUtil of its line rate: PCIe 5.0 x16 on
	// the H100 SXM, 4.0 x16 on the A100 and the A10G, 64 and 32 GB/s a
	// direction.
	pcie5x16 = 64e9
	pcie4x16 = 32e9
)

// hostLoad is the time to load one token's KV cache of m split tp ways
// from host memory: each GPU loads its own shard over its own link.
func hostLoad(g gpu, m llm, tp int) time.Duration {
	bytes := float64(2*m.layers*m.kvHeads*m.headDim*2) / float64(tp)
	return time.Duration(math.Round(bytes / (g.pcieBytesS * linkUtil) * 1e9))
}

// kvTransfer is the time to move one token's KV cache of m split tp ways
// from a prefill to a decode engine: each GPU reads its own shard over its
// own NIC, all tp at once.
func kvTransfer(g gpu, m llm, tp int) time.Duration {
	nic := g.nicBytesS
	if nic == 0 {
		nic = ndr400
	}
	bytes := float64(2*m.layers*m.kvHeads*m.headDim*2) / float64(tp)
	return time.Duration(math.Round(bytes / (nic * linkUtil) * 1e9))
}

// loraLoad is the time to load one adapter of m split tp ways: rank x
// (in + out) parameters for each of the seven projections of every layer.
func loraLoad(m llm, tp int) time.Duration {
	kv := m.kvHeads * m.headDim
	perLayer := 2*(m.hidden+m.hidden) + 2*(m.hidden+kv) + 3*(m.hidden+m.intermediate)
	bytes := 2 * float64(loraRank*perLayer*m.layers) / float64(tp)
	return time.Duration(math.Round(bytes / loraLoadBytesPerSec * 1e9))
}

// derive computes a preset's coefficients from its hardware and model. With
// tensor parallelism over tp GPUs, weights, FLOPs and KV heads are split tp
// ways and each layer adds two all-reduces to every step.
func derive(name string, g gpu, m llm, tp, maxNumSeqs, maxBatched int) Preset {
	weights := 2 * m.params / float64(tp) // BF16 bytes per GPU
	kvPerToken := float64(2*m.layers*m.kvHeads*m.headDim*2) / float64(tp)
	ns := func(sec float64) time.Duration { return time.Duration(math.Round(sec * 1e9)) }
	overhead := ns(weights / (g.hbmBytesS * mbu))
	if tp > 1 {
		overhead += time.Duration(2*m.layers) * allReduceLatency
	}
	perToken := ns(2 * m.params / (float64(tp) * g.bf16FLOPS * mfu))
	kvBytes := gpuMemUtil*g.memBytes - weights - activationReserve
	context := m.context
	if context == 0 {
		context = llama31Context
	}
	return Preset{
		Name:             name,
		Model:            m.name,
		KVBlocks:         int(kvBytes / kvPerToken / BlockSize),
		MaxNumSeqs:       maxNumSeqs,
		MaxBatchedTokens: maxBatched,
		MaxModelLen:      context,
		StepOverhead:     overhead,
		PerPrefillToken:  perToken,
		// A decoding sequence is one more row through the same matmuls.
		PerDecodeSeq:    perToken,
		PerContextToken: ns(kvPerToken / (g.hbmBytesS * mbu)),
		LoRALoad:        loraLoad(m, tp),
		// A transfer's time is rounded to whole nanoseconds per token.
		KVTransferLatency:  kvTransferSetup,
		KVTransferPerToken: kvTransfer(g, m, tp),
		HostLoadPerToken:   hostLoad(g, m, tp),
	}
}

// Presets returns the built-in presets. MaxNumSeqs and MaxBatchedTokens are
// vLLM v1's defaults for its OpenAI server: 1024 and 8192 on GPUs with at
// least 70 GiB other than the A100, 256 and 2048 otherwise.
func Presets() []Preset {
	return []Preset{
		derive("h100-llama3-8b", h100, llama31_8B, 1, 1024, 8192),
		derive("a100-llama3-8b", a100, llama31_8B, 1, 256, 2048),
		derive("h100-llama3-70b-tp4", h100, llama31_70B, 4, 1024, 8192),
		derive("a10g-mistral-7b", a10g, mistral_7B, 1, 256, 2048),
	}
}

// LookupPreset finds a preset by name, with an error that lists the names.
func LookupPreset(name string) (Preset, error) {
	ps := Presets()
	names := make([]string, 0, len(ps))
	for _, p := range ps {
		if p.Name == name {
			return p, nil
		}
		names = append(names, p.Name)
	}
	slices.Sort(names)
	return Preset{}, fmt.Errorf("unknown engine preset %q (known: %s)", name, strings.Join(names, ", "))
}

// WithLimits returns p with its running-sequence cap and per-step token
// budget replaced, as vLLM's --max-num-seqs and --max-num-batched-tokens
// set them; 0 keeps the preset's value. So an emulated engine can be
// configured unlike the hardware default: a small cap of running sequences
// or a small chunk.
func (p Preset) WithLimits(maxNumSeqs, maxBatchedTokens int) (Preset, error) {
	if maxNumSeqs < 0 {
		return Preset{}, fmt.Errorf("max-num-seqs must be at least 0, got %d", maxNumSeqs)
	}
	if maxBatchedTokens < 0 {
		return Preset{}, fmt.Errorf("max-num-batched-tokens must be at least 0, got %d", maxBatchedTokens)
	}
	if maxNumSeqs > 0 {
		p.MaxNumSeqs = maxNumSeqs
	}
	if maxBatchedTokens > 0 {
		p.MaxBatchedTokens = maxBatchedTokens
	}
	return p, nil
}

// PrefillTokensPerSec is the preset's prefill capacity when it does nothing
// but prefill in full steps: the yardstick of offered load. It is
// MaxBatchedTokens over the time of a step of MaxBatchedTokens prefill
// tokens; the attention reads of such a step (one context per sequence) are
// left out, as they are under 0.2% of it for every preset.
func (p Preset) PrefillTokensPerSec() float64 {
	step := p.StepOverhead + time.Duration(p.MaxBatchedTokens)*p.PerPrefillToken
	if step <= 0 {
		return math.Inf(1)
	}
	return float64(p.MaxBatchedTokens) / step.Seconds()
}
