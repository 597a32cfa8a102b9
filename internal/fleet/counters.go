package fleet

// Counters are an engine's lifetime count of tokens and of the seconds
// they took (its prefill, its inter-token latency, its CPU tier's loads),
// as last taught to its backend: the live monitor keeps one of each per
// scrape target and the simulator one per engine, so that both teach a
// Reading the same growth. The zero value has no count yet.
type Counters struct {
	tokens, seconds float64
	set             bool
}

// Take returns the growth of the counts (tokens, seconds) since the last
// lesson once it is at least least tokens (smaller growth accumulates),
// and whether it makes a lesson. A count that went back (an engine
// restart) or a first count starts afresh without one; a negative count
// (not exported) teaches nothing and is not kept.
func (c *Counters) Take(tokens, seconds, least float64) (dt, ds float64, ok bool) {
	if tokens < 0 || seconds < 0 {
		return 0, 0, false
	}
	dt, ds = tokens-c.tokens, seconds-c.seconds
	switch {
	case !c.set || dt < 0 || ds < 0:
	case dt >= least:
		ok = true
	default:
		return 0, 0, false
	}
	c.tokens, c.seconds, c.set = tokens, seconds, true
	return dt, ds, ok
}
