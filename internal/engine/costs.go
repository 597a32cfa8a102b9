package engine

import (
	"time"

	"github.com/kvroute/kvroute/internal/costmodel"
)

// Costs is p's timing model in the router's terms (package costmodel): the
// coefficients a router given the true figures up front would use, and
// the prior a router told the preset starts from, with the preset's KV
// transfer time per token.
//
// The engine's step charges PerContextToken for every token of context a
// sequence reads, and a prefill chunk of n tokens after c computed reads
// c + n. A prompt of u tokens after k cached, in chunks of C, so reads
// u*k/C + u^2/(2C) + u/2 tokens of context: an attention term of
// PerContextToken/C per token pair (costmodel.AttnPairs) and half of
// PerContextToken more per prefill token.
func (p Preset) Costs() costmodel.Prior {
	sec := func(d time.Duration) float64 { return d.Seconds() }
	chunk := int64(max(p.MaxBatchedTokens, 1))
	return costmodel.Prior{
		Coeffs: costmodel.Coeffs{
			Step:  sec(p.StepOverhead),
			Token: sec(p.PerPrefillToken) + sec(p.PerContextToken)/2,
			Attn:  sec(p.PerContextToken) / float64(chunk),
			Seq:   sec(p.PerDecodeSeq),
			Ctx:   sec(p.PerContextToken),
		},
		Chunk:    chunk,
		Samples:  costmodel.PresetSamples,
		Transfer: sec(p.KVTransferPerToken),
		HostLoad: sec(p.HostLoadPerToken),
	}
}
