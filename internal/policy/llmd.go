// llmd-default: the endpoint picker of the Kubernetes Gateway API Inference
// Extension (GIE) as llm-d deploys it, reimplemented from the public sources:
// kubernetes-sigs/gateway-api-inference-extension, pkg/epp/scheduling
// (framework/plugins/multi/prefix: the prefix-cache scorer and its indexer;
// scorer/queue.go; scorer/kvcache_utilization.go; picker/max_score_picker.go),
// and llm-d's "intelligent inference scheduling" profile
// (llm-d/llm-d-inference-scheduler and the llm-d guides), which weighs
// prefix-cache-scorer 3, queue-scorer 2 and kv-cache-utilization-scorer 2.
//
// Score of candidate i, highest wins:
//
//	3 x matched_i / total   (prefix: leading prompt blocks i holds in the
//	                         picker's own approximate index, over the
//	                         prompt's blocks)
//	+ 2 x (maxQ - q_i) / (maxQ - minQ)   (1 for all when every q is equal)
//	+ 2 x (1 - KVUsage_i)
//
// Defaults, as in GIE: blocks of 64 characters (the newer block size of 16
// tokens times its 4 characters per token), at most 256 blocks matched per
// prompt (longer prompts count their first 256 blocks), an LRU of 31,250
// blocks per server, updated with the chosen server's blocks after each pick
// (PreRequest). Ties are broken uniformly at random, as the max-score picker
// shuffles the candidates before taking the first of the highest score.
//
// Our observables: q is the engine's waiting queue (fleet EngineState.Waiting,
// what GIE reads from vllm:num_requests_waiting) when every candidate has
// reported engine state, else the router's own in-flight count for all
// candidates (so that the units agree). The KV-cache score uses the engine's
// reported usage when every candidate has one, else 1 for all: we estimate
// nothing the engine did not say. GIE chains the model name into its first
// hash; candidates here all serve the request's model, so we hash the prompt
// alone. GIE's auto-tune (LRU capacity from the engine's block count) is off
// here, so the index keeps the documented 31,250.
package policy

import (
	"sync"

	"github.com/kvroute/kvroute/internal/prefix"
)

// llm-d / GIE defaults.
const (
	LLMDPrefixWeight    = 3
	LLMDQueueWeight     = 2
	LLMDKVWeight        = 2
	LLMDBlockChars      = 64
	LLMDMaxPrefixBlocks = 256
	LLMDLRUCapacity     = 31250
)

// llmdWeights are a profile's scorer weights and the prefix match's cap
// in blocks.
type llmdWeights struct {
	prefix, queue, kv float64
	maxBlocks         int
}

// llmdDefault is llm-d's default inference-scheduling profile.
var llmdDefault = llmdWeights{prefix: LLMDPrefixWeight, queue: LLMDQueueWeight, kv: LLMDKVWeight, maxBlocks: LLMDMaxPrefixBlocks}

func init() {
	register("llmd-default", func(o Options) Policy { return NewLLMD(o) })
}

// LLMD is GIE's endpoint picker with llm-d's default weights.
type LLMD struct {
	index *prefix.Index
	rnd   *peerRand
	// lora is the weight of the lora-affinity-scorer, 0 without it
	// (llmd_lora.go).
	lora float64
	// w are the scorers' weights and the prefix match's cap (llmdDefault,
	// or the P/D profiles', pd_llmd.go).
	w llmdWeights
	// tierWeights, when set, make the prefix score llm-d's tier-weighted
	// scorer's over the router's match (tierweights.go) instead of GIE's
	// over the picker's own index.
	tierWeights *[prefix.NumTiers]float64

	// mu guards the scratch buffers that keep Pick free of allocations.
	mu      sync.Mutex
	matched []int32
	hashes  []uint64
}

// NewLLMD returns the picker with its own empty prefix index.
func NewLLMD(o Options) *LLMD {
	return &LLMD{index: prefix.NewIndex(LLMDLRUCapacity), rnd: newPeerRand(o.Seed), w: llmdDefault}
}

// Name implements Policy.
func (*LLMD) Name() string { return "llmd-default" }

// blocks returns the prompt's block hashes at GIE's block size, capped at
// its maximum; buf is scratch the caller owns.
func (p *LLMD) blocks(in *Input, buf []uint64) []uint64 {
	h := in.Hashes
	if in.BlockChars != LLMDBlockChars {
		h = prefix.HashSalted(buf[:0], in.View.Prompt, LLMDBlockChars, in.View.PrefixSalt)
	}
	if len(h) > p.w.maxBlocks {
		h = h[:p.w.maxBlocks]
	}
	return h
}

// Pick implements Policy.
func (p *LLMD) Pick(in *Input) Decision {
	maxID := 0
	for _, b := range in.Candidates {
		maxID = max(maxID, b.ID)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if cap(p.matched) <= maxID {
		p.matched = make([]int32, maxID+1)
	}
	matched := p.matched[:maxID+1]
	hashes := p.blocks(in, p.hashes)
	if cap(hashes) > cap(p.hashes) {
		p.hashes = hashes[:0]
	}
	p.index.Match(hashes, matched)

	engines := true
	minQ, maxQ := int64(-1), int64(0)
	for _, b := range in.Candidates {
		if b.Engine() == nil {
			engines = false
			break
		}
	}
	queue := func(i int) int64 {
		if engines {
			return int64(in.Candidates[i].Engine().Waiting)
		}
		return in.Candidates[i].Load().InFlight
	}
	for i := range in.Candidates {
		q := queue(i)
		if minQ < 0 || q < minQ {
			minQ = q
		}
		maxQ = max(maxQ, q)
	}
	best, bestScore, ties := 0, -1.0, 0
	for i, b := range in.Candidates {
		score := 0.0
		switch {
		case p.tierWeights != nil:
			if prompt := in.View.PromptTokens; prompt > 0 {
				score += p.w.prefix * weighted(in, i, p.tierWeights) / float64(prompt)
			}
		case len(hashes) > 0:
			score += p.w.prefix * float64(matched[b.ID]) / float64(len(hashes))
		}
		if maxQ == minQ {
			score += p.w.queue
		} else {
			score += p.w.queue * float64(maxQ-queue(i)) / float64(maxQ-minQ)
		}
		if engines {
			score += p.w.kv * (1 - min(max(b.Engine().KVUsage, 0), 1))
		} else {
			score += p.w.kv
		}
		score += p.loraScore(in, b)
		switch {
		case score > bestScore:
			best, bestScore, ties = i, score, 1
		case score == bestScore:
			// Reservoir sampling: each of the tied candidates wins with
			// probability 1/ties, like a shuffle before the pick.
			ties++
			if p.rnd.intn(ties) == 0 {
				best = i
			}
		}
	}
	return Decision{Index: best, Note: "max-score"}
}

// Routed implements Observer: the chosen server now holds the prompt's blocks.
func (p *LLMD) Routed(in *Input, d Decision) {
	p.mu.Lock()
	defer p.mu.Unlock()
	hashes := p.blocks(in, p.hashes)
	if cap(hashes) > cap(p.hashes) {
		p.hashes = hashes[:0]
	}
	p.index.Insert(in.Candidates[d.Index].ID, hashes)
}

var (
	_ Policy   = (*LLMD)(nil)
	_ Observer = (*LLMD)(nil)
)
