// dynamo-kv: NVIDIA Dynamo's KV router, reimplemented from the public
// sources: ai-dynamo/dynamo, lib/llm/src/kv_router (scheduler.rs /
// scheduling/selector.rs: DefaultWorkerSelector, softmax_sample; the
// sequence tracker that feeds it) and docs/router (--kv-overlap-score-weight,
// --router-temperature).
//
// For each worker, lower is better:
//
//	cost = overlap_score_weight x prefill_blocks + decode_blocks
//	prefill_blocks = (prefill tokens the worker already has queued
//	                  + this request's tokens not cached there) / block_size
//	decode_blocks  = the KV blocks the worker's active requests hold
//	                 + this request's blocks
//
// and the lowest cost wins at temperature 0.
//
// Defaults: overlap_score_weight 1.0, router_temperature 0, KV block size 16
// tokens (the vLLM default Dynamo reads off the engine). Ties at temperature
// 0: Dynamo takes the minimum of a hash map, whose order is arbitrary; we
// pick uniformly at random among the tied workers (seeded), which is what
// earlier Dynamo releases did explicitly.
//
// Our observables, and what they approximate:
//   - overlap: Dynamo's router gets exact KV events (stored/removed blocks)
//     from the engines; we use the router's approximate prefix index
//     (Input.Uncached: the prompt less its match, in tokens);
//   - queued prefill tokens: fleet Load.PendingPrefill, the uncached prompt
//     tokens of requests routed there whose first token has not come back,
//     which is what Dynamo's active-sequence tracker counts;
//   - active blocks: fleet Load.DecodeTokens (the prompts of decoding
//     requests) plus PendingPrefill, over 16. Dynamo counts each distinct
//     block of the active sequences once (shared prefixes deduplicated) and
//     the whole prompt of a prefilling request; we do not see which active
//     blocks are shared, nor the cached part of a prefilling prompt. The
//     request's own blocks are the same on every worker in our estimate, so
//     they do not change the argmin.
package policy

// Dynamo KV router defaults.
const (
	DynamoOverlapWeight = 1.0
	DynamoBlockTokens   = 16
)

func init() {
	register("dynamo-kv", func(o Options) Policy { return NewDynamo(o) })
}

// Dynamo is Dynamo's KV router cost function at temperature 0.
type Dynamo struct {
	rnd *peerRand
}

// NewDynamo returns the router with its defaults.
func NewDynamo(o Options) *Dynamo { return &Dynamo{rnd: newPeerRand(o.Seed)} }

// Name implements Policy.
func (*Dynamo) Name() string { return "dynamo-kv" }

// dynamoCost is Dynamo's logit for candidate i of in.
func dynamoCost(in *Input, i int) float64 { return dynamoCostAt(in, i, DynamoOverlapWeight) }

// dynamoCostAt is dynamoCost with overlap_score_weight w.
func dynamoCostAt(in *Input, i int, w float64) float64 {
	return dynamoCostWith(in, i, w, float64(in.Uncached[i]))
}

// dynamoCostWith is dynamoCostAt with the request's prefill tokens left
// after its cache credit given (uncached).
func dynamoCostWith(in *Input, i int, w, uncached float64) float64 {
	l := in.Candidates[i].Load()
	isl := int64(in.View.PromptTokens)
	prefill := (float64(l.PendingPrefill) + uncached) / DynamoBlockTokens
	requestBlocks := (isl + DynamoBlockTokens - 1) / DynamoBlockTokens
	decode := float64((l.DecodeTokens+l.PendingPrefill)/DynamoBlockTokens + requestBlocks)
	return w*prefill + decode
}

// Pick implements Policy.
func (p *Dynamo) Pick(in *Input) Decision { return p.pick(in, DynamoOverlapWeight) }

// pick is Pick with overlap_score_weight w.
func (p *Dynamo) pick(in *Input, w float64) Decision {
	return p.pickBy(in, func(i int) float64 { return dynamoCostAt(in, i, w) })
}

// pickBy is the lowest cost(i) among in's candidates, ties broken at
// random.
func (p *Dynamo) pickBy(in *Input, cost func(i int) float64) Decision {
	best, bestCost, ties := 0, 0.0, 0
	for i := range in.Candidates {
		c := cost(i)
		switch {
		case ties == 0 || c < bestCost:
			best, bestCost, ties = i, c, 1
		case c == bestCost:
			ties++
			if p.rnd.intn(ties) == 0 {
				best = i
			}
		}
	}
	return Decision{Index: best, Note: "min-cost"}
}

var _ Policy = (*Dynamo)(nil)
