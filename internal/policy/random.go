package policy

import (
	"github.com/kvroute/kvroute/internal/prefix"

	"math/bits"
	"sync/atomic"
)

func init() { register("random", func(o Options) Policy { return &Random{rnd: newSeqRand(o.Seed)} }) }

// Random sends each request to a uniformly random candidate, deterministic
// given Options.Seed and the order of requests.
type Random struct {
	rnd *seqRand
}

// Name implements Policy.
func (*Random) Name() string { return "random" }

// Pick implements Policy.
func (p *Random) Pick(in *Input) Decision {
	return Decision{Index: p.rnd.intn(len(in.Candidates)), Note: "random"}
}

var _ Policy = (*Random)(nil)

// seqRand is a SplitMix64 generator (Steele, Lea and Flood, 2014). Its whole
// state is one counter advanced by a single atomic add, so it is safe for
// concurrent use without a lock, never allocates, and yields the same
// sequence for the same seed and the same order of calls: the simulator,
// which calls it from one goroutine, is byte-for-byte reproducible.
type seqRand struct {
	state atomic.Uint64
}

func newSeqRand(seed int64) *seqRand {
	r := &seqRand{}
	r.state.Store(uint64(seed))
	return r
}

// next returns the next 64 random bits.
func (r *seqRand) next() uint64 {
	return prefix.Mix64(r.state.Add(prefix.Gamma) - prefix.Gamma)
}

// intn returns a random int in [0, n), n > 0, by Lemire's multiply-shift:
// the bias is at most n/2^64, far below anything a router could notice.
func (r *seqRand) intn(n int) int {
	hi, _ := bits.Mul64(r.next(), uint64(n))
	return int(hi)
}
