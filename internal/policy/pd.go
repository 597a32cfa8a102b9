package policy

// Prefill/decode pairs. A split request is routed leg by leg (package
// lifecycle): its prefill leg with request.View.Role "prefill" among the
// prefill engines, its decode leg with "decode" among the decode engines
// (the scheduler's role filter, disagg.Roles, leaves only those), so a
// pair policy is a Policy that reads the role. Whether a request is split
// at all is the decider's: kvroute's is disagg.Decide; a peer whose
// authors decide otherwise implements PairDecider.

// PairDecider is a P/D policy's own per-request split decision, as its
// authors built it: prompt is the request's prompt tokens and uncached
// the tokens of it the decode engine does not hold.
type PairDecider interface {
	Disaggregate(prompt, uncached int64) bool
}
