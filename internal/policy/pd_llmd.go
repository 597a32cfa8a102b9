package policy

import "github.com/kvroute/kvroute/internal/prefix"

// llmd-pd: llm-d's prefill/decode scheduling, reimplemented from its
// public source (llm-d/llm-d-router: deploy/config/pd-epp-config.yaml;
// pkg/epp/framework/plugins/scheduling/profilehandler/disagg:
// pd_profile_handler.go, disagg_profile_handler.go,
// prefix_based_pd_decider.go; the approximate prefix producer,
// dataproducer/approximateprefix). Two scheduling profiles, "prefill"
// (prefill-filter) and "decode" (decode-filter), each scoring
//
//	2 x prefix-cache-scorer + 1 x queue-scorer, max-score-picker
//
// with the approximate prefix index (maxPrefixTokensToMatch 16,384: 1,024
// blocks of 16 tokens; lruCapacityPerServer 31,250) updated after each
// pick for the decode and the prefill endpoint alike (PreRequest records
// the prompt's blocks on both). The profile handler runs the decode
// profile first, then asks the prefix-based decider whether to run the
// prefill profile: yes when the prompt's tokens not cached on the chosen
// decode endpoint are at least nonCachedTokens (16 in that config;
// promptTokens 0, no prompt-length gate).
//
// Our observables: the role filter is disagg.Roles; each leg is one pick
// of the profile's scorers (LLMD with these weights, its own index, its
// own ties at random). The decider is given the uncached tokens of the
// decode engine that holds the longest prefix by the router's index (the
// one llm-d's decode profile, prefix-weighted, tends to pick), since the
// simulator and the proxy decide before the legs are routed.

// llm-d's P/D defaults (pd-epp-config.yaml).
const (
	LLMDPDPrefixWeight     = 2
	LLMDPDQueueWeight      = 1
	LLMDPDMaxPrefixBlocks  = 16384 / 16
	LLMDPDNonCachedTokens  = 16
	LLMDPDPromptTokensGate = 0
)

func init() {
	register("llmd-pd", func(o Options) Policy { return NewLLMDPD(o) })
}

// LLMDPD is llm-d's P/D profiles with its prefix-based decider.
type LLMDPD struct{ *LLMD }

// NewLLMDPD returns the profiles with their own empty prefix index.
func NewLLMDPD(o Options) *LLMDPD {
	return &LLMDPD{&LLMD{index: prefix.NewIndex(LLMDLRUCapacity), rnd: newPeerRand(o.Seed),
		w: llmdWeights{prefix: LLMDPDPrefixWeight, queue: LLMDPDQueueWeight, maxBlocks: LLMDPDMaxPrefixBlocks}}}
}

// Name implements Policy.
func (*LLMDPD) Name() string { return "llmd-pd" }

// Disaggregate implements PairDecider: llm-d's prefix-based decider.
func (*LLMDPD) Disaggregate(prompt, uncached int64) bool {
	if LLMDPDNonCachedTokens == 0 || prompt < LLMDPDPromptTokensGate {
		return false
	}
	return prompt >= LLMDPDNonCachedTokens && uncached >= LLMDPDNonCachedTokens
}

var (
	_ Policy      = (*LLMDPD)(nil)
	_ Observer    = (*LLMDPD)(nil)
	_ PairDecider = (*LLMDPD)(nil)
)
