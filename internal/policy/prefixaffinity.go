package policy

func init() { register("prefix", func(Options) Policy { return &PrefixAffinity{} }) }

// PrefixAffinity sends each request to the candidate holding the longest
// cached prefix of its prompt, ties (including "nobody holds anything") by
// fewest requests in flight, then by a rotating scan start; it has no other
// load awareness, so a popular prefix piles onto its holder.
type PrefixAffinity struct {
	rot tieRotor
}

// Name implements Policy.
func (*PrefixAffinity) Name() string { return "prefix" }

// Pick implements Policy.
func (p *PrefixAffinity) Pick(in *Input) Decision {
	n := len(in.Candidates)
	start := p.rot.start(n)
	best := -1
	var bestMatch int32
	var bestLoad int64
	for k := range n {
		i := start + k
		if i >= n {
			i -= n
		}
		m := in.Matched[i]
		if best >= 0 && m < bestMatch {
			continue // skip the load read: it cannot win
		}
		l := in.Candidates[i].Load().InFlight
		if best < 0 || m > bestMatch || l < bestLoad {
			best, bestMatch, bestLoad = i, m, l
		}
	}
	note := "cache"
	if bestMatch == 0 {
		note = "least-loaded"
	}
	return Decision{Index: best, Note: note}
}

var _ Policy = (*PrefixAffinity)(nil)
