package policy

import (
	"math"

	"github.com/kvroute/kvroute/internal/costmodel"
	"github.com/kvroute/kvroute/internal/fleet"
)

// KVRoute's pick runs in two stages. First every candidate is estimated
// once (estimateAll: one read of its load, of its rate and of its engine
// report) into a candidate; then small rules, each a pure function of
// candidates, choose among them:
//
//	best    the lowest key (the score, skewed with several replicas),
//	        exact ties to the emptier, then the scan order (lowest)
//	fit     the same among the candidates with room in their KV cache
//	holder  the longest cached prefix; ties to the backend the session
//	        last went to, then the lower score (holderOf)
//	room    best becomes fit when that costs at most FitRatio (room)
//	session a conversation stays on its holder unless that costs more
//	        than AffinityRatio or the in-flight bound allows (sticks);
//	        with several replicas, the holder is the session table's
//	        backend and the bound is weighed on the view they share; a
//	        conversation placed or moved goes to the first backend of
//	        its rendezvous order the bound keeps it on (pickShared)
//	cache   a prompt without a session key stays with a holder a prefill
//	        chunk ahead of best (keepsCache)
//	note    "cache" when best holds the longest prefix, else "load" (note)
//
// docs/routing.md gives the reasoning behind each rule.

// candidate is one candidate's estimate for a request, made once for
// every rule to read.
type candidate struct {
	i  int // index in Input.Candidates
	id int // its backend's fleet ID
	// load is the candidate's load, read once: fleet.Backend.Load on this
	// replica's view, KnownLoad on the shared one.
	load fleet.Load
	// co is the cost model's coefficients (fleet.Backend.Cost: learned on
	// this replica's view, the prior on the shared one), before the trust
	// band; chunk its token budget per step.
	co    costmodel.Coeffs
	chunk int64
	// rate is co's prefill rate in full chunks (ChunkRate), before
	// trustedRate.
	rate    float64
	cached  int64 // prompt tokens it holds (Input.Cached)
	written int64 // tokens the router has written to its cache (see emptier)
	est     float64
	score   float64 // est plus the fleet's share of the recomputation (see scored)
	step    float64 // the fixed cost of one step it is costed at (see sticks)
	key     float64 // what best ranks by: score, skewed by ReplicaSkew
	fits    bool    // its free KV cache holds the uncached tokens (fitsKV)
	// itl is its predicted inter-token latency in seconds, made only for
	// a request with objectives (see promise).
	itl float64
}

// fleetView is what the rules read of the candidates as a whole.
type fleetView struct {
	total, waiting int64 // requests in flight, and those before their first token
	// rate is the fleet's prefill rate: the geometric mean of the
	// candidates' rates.
	rate float64
	// co is the coefficients every candidate within the trust band of
	// rate is costed at: the geometric mean of the candidates'.
	co       costmodel.Coeffs
	missCost float64 // see missCharge
	// bound is CHWBL's in-flight bound for a backend a request stays on,
	// with AffinitySlots of slack (see boundedLoadCap).
	bound int64
}

// pickRequest is what a pick reads of the request.
type pickRequest struct {
	prompt, budget int64
	keyed          bool // it has a session key
	lastID         int  // the backend its session last went to, or -1
}

// Pick implements Policy.
func (p *KVRoute) Pick(in *Input) Decision {
	if in.View != nil && in.View.Role == RoleDecodeLeg {
		return p.pickDecode(in) // a split request's decode leg (pd_kvroute.go)
	}
	r := p.request(in)
	cs := p.getScratch(len(in.Candidates))
	defer p.pool.Put(cs)
	c := *cs
	f := p.estimateAll(in, &r, false, p.rot.start(len(c)), c)
	d := p.pick(in, &r, c, f)
	if !in.Objective.None() {
		// Route by headroom, admit by promise (slo.go).
		d = p.promise(in, c, d)
	}
	return d
}

// pick applies the rules to the estimated candidates c.
func (p *KVRoute) pick(in *Input, r *pickRequest, c []candidate, f fleetView) Decision {
	best, holder := &c[lowest(c, false)], &c[holderOf(c, r.lastID)]
	if fit := lowest(c, true); fit >= 0 && room(&c[fit], best) {
		best = &c[fit]
	}
	if r.keyed && (in.Replicas > 1 || in.Replica != 0) {
		// Several replicas take a conversation's turns in turn: where
		// it lives, whether it leaves, and for which backend, are
		// decided on what they all see alike (see pickShared), also
		// while this one hears none of them (NATS down): its peers
		// route on meanwhile, and must land where it does.
		return p.pickShared(in, r, c)
	}
	if r.keyed && (holder.cached > 0 || holder.id == r.lastID) {
		if holder == best || sticks(holder, best, f.bound) {
			return Decision{Index: holder.i, EstTTFT: holder.est, Note: "sticky"}
		}
		return Decision{Index: best.i, EstTTFT: best.est, Note: "spill"}
	}
	if holder != best && keepsCache(holder, best, stickyTokens(in.Candidates[holder.i], in.Candidates[best.i]), f.bound) {
		return Decision{Index: holder.i, EstTTFT: holder.est, Note: "cache"}
	}
	return Decision{Index: best.i, EstTTFT: best.est, Note: note(best, holder)}
}

// request reads what the pick needs of in.View.
func (p *KVRoute) request(in *Input) pickRequest {
	r := pickRequest{lastID: -1}
	if in.View != nil {
		r.prompt, r.budget = int64(in.View.PromptTokens), int64(in.View.MaxTokens)
		if r.keyed = in.View.SessionKey != ""; r.keyed {
			r.lastID, _ = p.sessions.Lookup(in.SessionHash)
		}
	}
	return r
}

// getScratch returns a pooled slice of n candidates (put back in p.pool).
func (p *KVRoute) getScratch(n int) *[]candidate {
	cs, _ := p.pool.Get().(*[]candidate)
	if cs == nil {
		cs = new([]candidate)
	}
	if cap(*cs) < n {
		*cs = make([]candidate, n)
	}
	*cs = (*cs)[:n]
	return cs
}

// estimateAll estimates every candidate of in into c (len(c) ==
// len(in.Candidates)), candidate i at c[(i-start) mod n], so that the
// rules scan from start; each candidate's load is read once. On this
// replica's view (shared false) a candidate is costed with its own
// accounted load, its learned coefficients within the trust band and its
// fresh engine report; on the view every replica shares (see
// leaveShared), with the load they all account, its cost model's prior
// (which every replica configures alike) and no engine report.
func (p *KVRoute) estimateAll(in *Input, r *pickRequest, shared bool, start int, c []candidate) fleetView {
	cands := in.Candidates
	n := len(cands)
	var f fleetView
	// First the fleet's rate and backlog (see RateTrust and
	// MissCostPerWaiter), summed in the candidates' order.
	var logRate float64
	var mean costmodel.Mean
	for i, b := range cands {
		k := i - start
		if k < 0 {
			k += n
		}
		x := &c[k]
		*x = candidate{i: i, id: b.ID, cached: in.Cached[i], chunk: b.Chunk()}
		m := b.Cost()
		if shared {
			x.load, x.co = b.KnownLoad(), m.Prior().Coeffs
		} else {
			x.load, x.co = b.Load(), m.Coeffs(in.Now)
		}
		x.rate = x.co.ChunkRate(x.chunk)
		logRate += math.Log(x.rate)
		mean.Add(x.co)
		f.total += x.load.InFlight
		f.waiting += x.load.InFlight - x.load.Decoding
	}
	f.rate, f.co = math.Exp(logRate/float64(n)), mean.Coeffs()
	f.missCost = missCharge(f.waiting, n)
	f.bound = boundedLoadCap(p.loadFactor, f.total, n) + AffinitySlots
	skew := !shared && in.Replicas > 1 && in.Burst
	for k := range c {
		x := &c[k]
		b := cands[x.i]
		var e *fleet.EngineState
		if !shared {
			e = freshEngine(b, in.Now)
			x.written = written(b)
			x.fits = fitsKV(e, &x.load, in.Uncached[x.i])
		}
		// Within the trust band, costed at the fleet's coefficients; beyond
		// it, at its own, scaled to its trusted rate.
		co := costedAt(x.co, x.rate, f.co, f.rate)
		x.step = co.Step
		work := computed(in.Uncached[x.i])
		seqs := b.Limits()
		if shared {
			// Only the cap the engine reports or is configured with:
			// the cold-start and learned caps are this replica's.
			seqs.PlausibleSeqs = seqs.MaxNumSeqs
		}
		x.est = p.estimateSeqs(b, e, &x.load, r.prompt, work, in.Cached[x.i], r.budget, co, x.chunk, seqs.PlausibleSeqs)
		if in.Extra != nil {
			x.est += in.Extra[x.i]
		}
		if in.Load != nil {
			// The load of its lower-tier hits: before its prefill, off
			// the engine's compute (no recomputation is priced for them).
			x.est += in.Load[x.i]
		}
		if p.predictAll || !in.Objective.None() {
			x.itl = predictITL(b, co, &x.load, r.prompt, r.budget, x.chunk)
		}
		// The score adds the fleet's share of the recomputation to this
		// request's TTFT; it equals est when the fleet is not backlogged.
		// It is priced at the fleet's rate: the capacity lost is the
		// fleet's, and a backend's own rate would amplify its deviations.
		x.score = scored(x.est, f.missCost, work, f.rate)
		// With several replicas, each one ranks the candidates by a score
		// skewed towards its own arc of the fleet (see ReplicaSkew); the
		// rules still weigh the unskewed score.
		x.key = x.score
		if skew {
			x.key *= 1 + ReplicaSkew*arcDistance(in.ReplicaArc, evenArc(cands, b))
		}
	}
	return f
}

// computed is the prompt tokens an engine computes for a request of
// which uncached are not in its cache: the engine computes at least the
// last prompt token even on a full hit (it needs its logits), so never 0.
func computed(uncached int64) int64 { return max(uncached, 1) }

// missCharge is how many times again a candidate's uncached tokens are
// charged when waiting requests (routed, before their first token) are
// spread over n candidates: see MissCostPerWaiter.
func missCharge(waiting int64, n int) float64 {
	return MissCostPerWaiter * max(float64(waiting)/float64(n)-FreeWaiters, 0)
}

// scored is a candidate's score: its estimate est plus the fleet's share
// of recomputing the work tokens it would compute (see computed),
// missCost times again (see missCharge), at rate.
func scored(est, missCost float64, work int64, rate float64) float64 {
	return est + missCost*float64(work)/rate
}

// lowest returns the index in c of the candidate with the lowest key
// (among those with room in their KV cache, when fits), exact float ties
// (idle, rates within RateTrust's band, equal matches, none at all say)
// going to the emptier (see emptier), then to the first in c's order (the
// rotating scan); -1 when none qualifies.
func lowest(c []candidate, fits bool) int {
	best := -1
	for k := range c {
		x := &c[k]
		if fits && !x.fits {
			continue
		}
		if best < 0 || x.key < c[best].key ||
			(x.key == c[best].key && emptier(x.load.InFlight, x.written, c[best].load.InFlight, c[best].written)) {
			best = k
		}
	}
	return best
}

// holderOf returns the index in c of the holder: the candidate with the
// longest cached prefix of the prompt; on equal lengths (none at all,
// say) the backend the session last went to (ID lastID), then the lower
// score, then the first in c's order. c must not be empty.
func holderOf(c []candidate, lastID int) int {
	h := 0
	for k := 1; k < len(c); k++ {
		x, y := &c[k], &c[h]
		if x.cached > y.cached || (x.cached == y.cached && y.id != lastID && (x.id == lastID || x.score < y.score)) {
			h = k
		}
	}
	return h
}

// room reports whether the best candidate that has room in its KV cache
// for the prompt (fit) takes the place of the best overall: when it is
// another and costs at most FitRatio times its score (see FitRatio).
func room(fit, best *candidate) bool {
	return fit != best && fit.score <= FitRatio*best.score
}

// sticks reports whether a conversation stays on its holder h rather
// than going to b: h costs at most AffinityRatio times b's score plus
// AffinitySlack, and holds fewer requests than bound (CHWBL's, see
// fleetView.bound). The ratio weighs the scores less the fixed cost of
// one step, which either backend pays: it bounds the premium of staying,
// and a constant in both scores would loosen it (with the step in, on 32
// h100-llama3-8b engines, chat's p99 rose from 59 to 71 ms).
func sticks(h, b *candidate, bound int64) bool {
	return h.score-h.step <= AffinityRatio*(b.score-b.step)+AffinitySlack && h.load.InFlight+1 <= bound
}

// keepsCache reports whether a request without a session key stays with
// the holder h of its longest cached prefix rather than going to the best
// candidate b: h is another backend with at least lead more tokens of it
// cached (see stickyTokens), costs at most CacheStickyRatio times b's
// score, and holds fewer requests than bound (see CacheStickyTokens).
func keepsCache(h, b *candidate, lead float64, bound int64) bool {
	return h != b && float64(h.cached-b.cached) >= lead &&
		h.score <= CacheStickyRatio*b.score && h.load.InFlight+1 <= bound
}

// note is the Decision's note for best when no rule kept the holder h:
// "cache" when best holds the longest cached prefix (as long as h's), else
// "load".
func note(best, h *candidate) string {
	if best.cached > 0 && best.cached >= h.cached {
		return "cache"
	}
	return "load"
}

// pickShared places or keeps a conversation with several replicas: its
// home, whether it leaves it, and where to, decided on what every replica
// sees alike rather than on this replica's own view (c, whose estimates
// it reports). That is the load every replica accounts
// (fleet.Backend.KnownLoad: its own and its peers' requests, without the
// load it presumes of its peers within a burst), the prefix index's
// matches, and each backend's cost model's prior (the same at every
// replica), without the learned rates and engine reports, which each
// replica learns and scrapes on its own; and, where those do not decide,
// a rank of the conversation and the backend that every replica computes
// alike (rendezvous hashing, sessionRank) instead of the order of a scan.
//
// The conversation's holder is the backend its session table names (the
// winning claim, the same at every replica once they have heard it),
// else the one with the longest cached prefix of the prompt (ties by
// rank). It stays there unless the session bound says leave (stays). A
// conversation that leaves, or that has no holder (a first turn, a turn
// whose text shares nothing with the last, routed before the claim
// reached this replica), goes to the backend of the lowest rank among
// those the bound would keep it on (placeShared): where no load tells the
// backends apart that is the conversation's rendezvous backend, which
// every replica computes without hearing from the others, so that a turn
// that outruns its claim still lands where the claim says.
func (p *KVRoute) pickShared(in *Input, r *pickRequest, own []candidate) Decision {
	cs := p.getScratch(len(in.Candidates))
	defer p.pool.Put(cs)
	c := *cs
	f := p.estimateAll(in, r, true, 0, c) // c[k].i == k
	h, note := -1, "shared"
	for k := range c {
		if c[k].id == r.lastID {
			h = k
		}
	}
	if h < 0 {
		if k := longestCached(c, in.SessionHash, in.Candidates); c[k].cached > 0 {
			h = k
		}
	}
	first, second := lowestTwo(c)
	if h >= 0 {
		if stays(c, h, first, second, f.bound) {
			return decideAt(own, h, "sticky")
		}
		note = "spill"
	}
	return decideAt(own, placeShared(c, h, first, second, in.SessionHash, in.Candidates, f.bound), note)
}

// decideAt is the Decision for candidate i of Input.Candidates with its
// estimate in own (this replica's view).
func decideAt(own []candidate, i int, note string) Decision {
	for k := range own {
		if own[k].i == i {
			return Decision{Index: i, EstTTFT: own[k].est, Note: note}
		}
	}
	return Decision{Index: i, Note: note}
}

// longestCached returns the index in c of the candidate with the longest
// cached prefix, ties to the lowest sessionRank. c must not be empty.
func longestCached(c []candidate, session uint64, cands []*fleet.Backend) int {
	h, hRank := 0, sessionRank(session, cands[c[0].i])
	for k := 1; k < len(c); k++ {
		rank := sessionRank(session, cands[c[k].i])
		if c[k].cached > c[h].cached || (c[k].cached == c[h].cached && rank < hRank) {
			h, hRank = k, rank
		}
	}
	return h
}

// lowestTwo returns the indices in c of the lowest and the second lowest
// score (-1 for none), so that each candidate's best other is one
// comparison away.
func lowestTwo(c []candidate) (first, second int) {
	first, second = -1, -1
	for k := range c {
		switch {
		case first < 0 || c[k].score < c[first].score:
			first, second = k, first
		case second < 0 || c[k].score < c[second].score:
			second = k
		}
	}
	return first, second
}

// stays reports whether a conversation stays on candidate k of c (whose
// lowest scores are first and second, see lowestTwo): the session bound
// against the best other candidate (staysShared). The one candidate
// stays.
func stays(c []candidate, k, first, second int, bound int64) bool {
	other := first
	if k == first {
		other = second
	}
	return other < 0 || staysShared(&c[k], &c[other], bound)
}

// staysShared is sticks on the view several replicas share, where to is
// the best candidate other than h: a holder that costs no more than to
// keeps the turn whatever the in-flight bound (the bound limits the
// premium of staying, and there is none).
func staysShared(h, to *candidate, bound int64) bool {
	return h.score <= to.score || sticks(h, to, bound)
}

// placeShared returns the index in c of the candidate other than skip (-1
// for none) with the lowest sessionRank among those the conversation
// would stay on (stays): the first of the conversation's rendezvous order
// that the bound lets it live on. The candidate of the lowest score
// always stays, so one is found unless c holds skip alone (then skip).
// first and second are c's lowest scores (lowestTwo).
func placeShared(c []candidate, skip, first, second int, session uint64, cands []*fleet.Backend, bound int64) int {
	to := -1
	var toRank uint64
	for k := range c {
		if k == skip || !stays(c, k, first, second, bound) {
			continue
		}
		if rank := sessionRank(session, cands[c[k].i]); to < 0 || rank < toRank {
			to, toRank = k, rank
		}
	}
	if to < 0 {
		return max(skip, 0)
	}
	return to
}
