package policy

func init() {
	register("power-of-two", func(o Options) Policy { return &PowerOfTwo{rnd: newSeqRand(o.Seed)} })
}

// PowerOfTwo draws two distinct random candidates and sends the request to
// the one with fewer requests in flight (the first drawn on a tie).
//
// "The power of two choices" (Mitzenmacher, 2001): two samples cut the
// maximum load exponentially compared with one, while reading only two
// backends' counters and avoiding the herding of a global least-request
// when many routers act on the same stale picture.
type PowerOfTwo struct {
	rnd *seqRand
}

// Name implements Policy.
func (*PowerOfTwo) Name() string { return "power-of-two" }

// Pick implements Policy.
func (p *PowerOfTwo) Pick(in *Input) Decision {
	n := len(in.Candidates)
	if n == 1 {
		return Decision{Index: 0, Note: "only"}
	}
	i := p.rnd.intn(n)
	j := p.rnd.intn(n - 1)
	if j >= i {
		j++ // distinct from i, still uniform over the others
	}
	if in.Candidates[j].Load().InFlight < in.Candidates[i].Load().InFlight {
		i = j
	}
	return Decision{Index: i, Note: "two-choices"}
}

var _ Policy = (*PowerOfTwo)(nil)
