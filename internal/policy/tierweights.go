package policy

import "github.com/kvroute/kvroute/internal/prefix"

// The peers' tier weights: llm-d and Dynamo weigh a cache hit by the tier
// it is on, a fixed fraction of a GPU hit, where kvroute prices it at the
// backend's load time (Input.Load).
//
// llm-d: llm-d/llm-d-kv-cache, pkg/kvcache/backend.go
// (DefaultKVCacheBackendConfig: gpu 1.0, cpu 0.8) and
// pkg/kvcache/kvblock_scorer.go (the longest-prefix scorer: over the
// leading blocks a pod holds, the sum of each block's weight on the best
// tier the pod holds it on; a tier not configured weighs 1.0). llmd-tiers
// is llm-d's default profile (llmd.go) with that scorer in place of GIE's
// approximate prefix scorer, read from the router's index as its KV event
// indexer would tell it, over the prompt: 3 x weighted / prompt tokens.
//
// Dynamo: ai-dynamo/dynamo, lib/kv-router/src/config.rs
// (default_host_cache_hit_weight 0.75, default_disk_cache_hit_weight
// 0.25) and lib/kv-router/src/scheduling/selector.rs (the overlap credit
// taken from a worker's prefill blocks: overlap_score_credit 1.0 x device
// blocks + 0.75 x host blocks + 0.25 x disk blocks). dynamo-kv-tiers is
// dynamo-kv (dynamo.go) with that credit in place of the match.

// Tier weights of the peers, indexed by prefix.Tier.
var (
	LLMDTierWeights   = [prefix.NumTiers]float64{1.0, 0.8, 1.0}
	DynamoTierWeights = [prefix.NumTiers]float64{1.0, 0.75, 0.25}
)

func init() {
	register("llmd-tiers", func(o Options) Policy {
		p := NewLLMD(o)
		p.tierWeights = &LLMDTierWeights
		return &llmdTiers{p}
	})
	register("dynamo-kv-tiers", func(o Options) Policy { return &dynamoTiers{NewDynamo(o)} })
}

// weighted is candidate i's cached tokens weighed by tier with w: its
// Cached when no backend has a lower tier.
func weighted(in *Input, i int, w *[prefix.NumTiers]float64) float64 {
	if in.Tiers == nil {
		return float64(in.Cached[i])
	}
	s := 0.0
	for t, n := range in.Tiers[i] {
		s += w[t] * float64(n)
	}
	return s
}

// llmdTiers is llm-d's default profile with its tier-weighted scorer.
type llmdTiers struct{ *LLMD }

// Name implements Policy.
func (*llmdTiers) Name() string { return "llmd-tiers" }

// dynamoTiers is Dynamo's KV router with its tier credits.
type dynamoTiers struct{ *Dynamo }

// Name implements Policy.
func (*dynamoTiers) Name() string { return "dynamo-kv-tiers" }

// Pick implements Policy.
func (p *dynamoTiers) Pick(in *Input) Decision {
	return p.pickBy(in, func(i int) float64 {
		credit := weighted(in, i, &DynamoTierWeights)
		return dynamoCostWith(in, i, DynamoOverlapWeight, float64(in.Uncached[i]+in.Cached[i])-credit)
	})
}

var (
	_ Policy = (*llmdTiers)(nil)
	_ Policy = (*dynamoTiers)(nil)
)

func init() {
	register("kvroute-tier-blind", func(o Options) Policy { return &TierBlind{NewKVRoute(o)} })
}

// TierBlind is kvroute pricing every cache hit as a GPU hit, whatever tier
// it is on: Input.Tiers and Input.Load unread, as a router that reads the
// engines' events but not their medium would. The baseline of the cache
// tiers' benchmark.
type TierBlind struct{ *KVRoute }

// Name implements Policy.
func (*TierBlind) Name() string { return "kvroute-tier-blind" }

// Pick implements Policy.
func (p *TierBlind) Pick(in *Input) Decision {
	t, l := in.Tiers, in.Load
	in.Tiers, in.Load = nil, nil
	d := p.KVRoute.Pick(in)
	in.Tiers, in.Load = t, l
	return d
}

var (
	_ Policy          = (*TierBlind)(nil)
	_ Observer        = (*TierBlind)(nil)
	_ SessionLearner  = (*TierBlind)(nil)
	_ AdapterAffinity = (*TierBlind)(nil)
)
