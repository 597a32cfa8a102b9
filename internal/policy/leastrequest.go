package policy

import (
	"sync/atomic"

	"github.com/kvroute/kvroute/internal/fleet"
)

func init() { register("least-request", func(Options) Policy { return &LeastRequest{} }) }

// LeastRequest sends each request to the candidate with the fewest requests
// in flight; ties go to the first such candidate scanning from a start
// position that advances by one on every pick.
//
// Rotating the start rather than always preferring the lowest index matters
// at low load, where every backend has 0 in flight: a burst of requests
// arriving before any of them is accounted would otherwise all land on
// backend 0. The rotation is deterministic, so simulations reproduce.
type LeastRequest struct {
	rot tieRotor
}

// Name implements Policy.
func (*LeastRequest) Name() string { return "least-request" }

// Pick implements Policy.
func (p *LeastRequest) Pick(in *Input) Decision {
	return Decision{Index: fewestInFlight(in.Candidates, p.rot.start(len(in.Candidates))), Note: "least-loaded"}
}

var _ Policy = (*LeastRequest)(nil)

// tieRotor hands out a scan start that advances on every call, so that
// ties among equally good candidates are spread round-robin.
type tieRotor struct {
	n atomic.Uint64
}

// start returns the scan start for a candidate list of length n > 0.
func (r *tieRotor) start(n int) int {
	return int((r.n.Add(1) - 1) % uint64(n))
}

// fewestInFlight returns the index of the candidate with the fewest
// requests in flight, scanning from start and keeping the first minimum.
func fewestInFlight(cands []*fleet.Backend, start int) int {
	best, bestLoad := -1, int64(0)
	n := len(cands)
	for k := range n {
		i := start + k
		if i >= n {
			i -= n
		}
		if l := cands[i].Load().InFlight; best < 0 || l < bestLoad {
			best, bestLoad = i, l
		}
	}
	return best
}
