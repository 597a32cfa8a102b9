package policy

// dynamo-pd: Dynamo's disaggregated routing, reimplemented from its
// public source (ai-dynamo/dynamo: lib/llm/src/kv_router/prefill_router.rs,
// docs/design_docs/disagg_serving.md). The PrefillRouter picks the
// prefill worker with the KV router (dynamo-kv's cost, overlap weight
// 1.0) over the prefill workers, sends the request there with max_tokens
// 1, then routes the decode request with a router override of
// overlap_score_weight 0 (and assume_kv_reuse false): the decode worker
// is the one with the fewest active blocks. Every request is split while
// a prefill worker is up (no per-request decider; it falls back to
// decode-only when the prefill router is not active or the prefill
// fails).

func init() {
	register("dynamo-pd", func(o Options) Policy { return &DynamoPD{NewDynamo(o)} })
}

// DynamoPD is Dynamo's PrefillRouter and decode KV router.
type DynamoPD struct{ *Dynamo }

// Name implements Policy.
func (*DynamoPD) Name() string { return "dynamo-pd" }

// Pick implements Policy: the decode leg without overlap scoring.
func (p *DynamoPD) Pick(in *Input) Decision {
	if in.View != nil && in.View.Role == RoleDecodeLeg {
		return p.pick(in, 0)
	}
	return p.pick(in, DynamoOverlapWeight)
}

// Disaggregate implements PairDecider: always.
func (*DynamoPD) Disaggregate(_, _ int64) bool { return true }

var (
	_ Policy      = (*DynamoPD)(nil)
	_ PairDecider = (*DynamoPD)(nil)
)
