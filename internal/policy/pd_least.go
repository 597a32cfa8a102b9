package policy

func init() {
	register("least-loaded-pair", func(Options) Policy { return &LeastLoadedPair{} })
}

// LeastLoadedPair is the baseline pair: each leg to the engine of its role
// with the fewest requests in flight (LeastRequest), every request split.
// It is what a P/D router without cache or cost awareness does (SGLang's
// and the vLLM production stack's default pairing picks each side by load
// alone).
type LeastLoadedPair struct{ LeastRequest }

// Name implements Policy.
func (*LeastLoadedPair) Name() string { return "least-loaded-pair" }

// Disaggregate implements PairDecider: always.
func (*LeastLoadedPair) Disaggregate(_, _ int64) bool { return true }

var (
	_ Policy      = (*LeastLoadedPair)(nil)
	_ PairDecider = (*LeastLoadedPair)(nil)
)
