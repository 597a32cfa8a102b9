package policy

import (
	"math"
	"time"

	"github.com/kvroute/kvroute/internal/costmodel"
	"github.com/kvroute/kvroute/internal/fleet"
)

// kvroute's pair: the prefill leg of a split request is picked as any
// request is (Pick: the prefix it holds and the prefill work queued on
// it, among the prefill engines the role filter leaves); the decode leg
// by pickDecode, below, on what a decode engine spends on it: the KV
// transfer of the prompt tokens it does not hold in its own cache (the
// blocks it received for earlier turns are there, so a conversation's
// decode engine receives only the new part), then its first step among
// the streams decoding there, with the prefill work queued on it (whole
// requests served there, transfers not yet done), and room in its free KV
// cache for what it receives. docs/routing.md, "Prefill/decode pairs".

// RoleDecodeLeg is request.View.Role of a split request's decode leg
// (config.RoleDecode; package policy does not import config).
const RoleDecodeLeg = "decode"

// DefaultTransferPerToken is the KV transfer's time per prompt token
// carried to a decode engine when neither the engine's cost model prior
// (its preset's figure, costmodel.Prior.Transfer) nor the policy's
// Options.TransferPerToken gives one: Llama-3.1-8B's 128 KiB of KV cache
// per token over a 400 Gb/s NIC at 80% of its rate, as the h100-llama3-8b
// preset derives its KVTransferPerToken (docs/engine.md). The transfer's
// fixed latency is the same for every decode engine and so does not rank
// them.
const DefaultTransferPerToken = 3277 * time.Nanosecond

// transferPerToken is the seconds per prompt token that carrying its KV
// cache to decode engine b takes, for ranking decode engines by what they
// must receive: its cost model prior's figure (its preset's: KV bytes per
// token are the model's, the link the hardware's), else the policy's
// (Options.TransferPerToken), else DefaultTransferPerToken.
func (p *KVRoute) transferPerToken(b *fleet.Backend) float64 {
	if t := b.Cost().Prior().Transfer; t > 0 {
		return t
	}
	if p.transfer > 0 {
		return p.transfer.Seconds()
	}
	return DefaultTransferPerToken.Seconds()
}

// pickDecode is kvroute's pick of a decode leg: the candidate with the
// lowest estimated time to its first token (estimateDecode) among those
// whose free KV cache holds what it receives, when one of them costs at
// most FitRatio times the best overall; ties to fewer decoding streams,
// then the emptier.
func (p *KVRoute) pickDecode(in *Input) Decision {
	n := len(in.Candidates)
	start := p.rot.start(n)
	// The fleet's rate and coefficients, as the pick's estimateAll reads
	// them: each candidate within RateTrust of the fleet's rate is costed
	// at the fleet's coefficients.
	var logRate float64
	var mean costmodel.Mean
	for _, b := range in.Candidates {
		co := b.Cost().Coeffs(in.Now)
		logRate += math.Log(co.ChunkRate(b.Chunk()))
		mean.Add(co)
	}
	fleetRate, fleetCo := math.Exp(logRate/float64(n)), mean.Coeffs()
	best, fit := -1, -1
	var bestEst, fitEst float64
	for k := range n {
		i := (start + k) % n
		est, fits := p.estimateDecode(in, i, fleetRate, fleetCo)
		if best < 0 || est < bestEst || (est == bestEst && fewerStreams(in, i, best)) {
			best, bestEst = i, est
		}
		if fits && (fit < 0 || est < fitEst || (est == fitEst && fewerStreams(in, i, fit))) {
			fit, fitEst = i, est
		}
	}
	if fit >= 0 && fit != best && fitEst <= FitRatio*bestEst {
		best, bestEst = fit, fitEst
	}
	return Decision{Index: best, EstTTFT: bestEst, Note: "decode"}
}

// estimateDecode is candidate i's time to the first token of a decode
// leg, in seconds: the transfer of its uncached tokens, then its queued
// prefill work and one token of its own among its decoding streams (the
// kvroute estimate of a request that computes one token), and whether its
// free KV cache holds the blocks it receives.
func (p *KVRoute) estimateDecode(in *Input, i int, fleetRate float64, fleetCo costmodel.Coeffs) (float64, bool) {
	b := in.Candidates[i]
	l := b.Load()
	e := freshEngine(b, in.Now)
	chunk := b.Chunk()
	own := b.Cost().Coeffs(in.Now)
	co := costedAt(own, own.ChunkRate(chunk), fleetCo, fleetRate)
	var prompt, budget int64
	if in.View != nil {
		prompt, budget = int64(in.View.PromptTokens), int64(in.View.MaxTokens)
	}
	// The one token it computes attends to the whole prompt it received.
	est := p.estimate(b, e, &l, prompt, computed(0), max(prompt-1, 0), budget, co, chunk) +
		float64(in.Uncached[i])*p.transferPerToken(b)
	if in.Extra != nil {
		est += in.Extra[i]
	}
	return est, fitsKV(e, &l, in.Uncached[i])
}

// fewerStreams reports whether candidate i of in decodes fewer streams
// than candidate j, or as many and has fewer requests in flight.
func fewerStreams(in *Input, i, j int) bool {
	a, b := in.Candidates[i].Load(), in.Candidates[j].Load()
	return a.Decoding < b.Decoding || (a.Decoding == b.Decoding && a.InFlight < b.InFlight)
}
