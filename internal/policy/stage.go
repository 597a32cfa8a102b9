package policy

import (
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/request"
)

// The seams of the routing decision for what the policies need not weigh
// themselves. The scheduler (package scheduler, Config.Filters and
// Config.Scorers) runs them around every pick:
//
//	healthy, serving the model, not excluded, warm-up
//	  -> each Filter in turn: keep the candidates of its lowest tier
//	  -> prefix match, blocks to tokens (Input.Matched, Cached, Uncached)
//	  -> the Scorers' costs summed per candidate (Input.Extra)
//	  -> Policy.Pick
//
// A prefill/decode pick filters by role (only the engines of a leg's role
// may take it); LoRA routing filters by adapter (loaded, else a free
// adapter slot, else any) and scores the time to load one. Without
// filters or scorers the decision is exactly what it is without the seam.

// Filter narrows a request's candidates before the pick. The scheduler
// asks it about every candidate left by the filters before it and keeps
// those of the lowest tier among them.
type Filter interface {
	// Tier is b's tier for the request v: 0 the best, higher worse
	// (taken only when no better one is left), negative never.
	Tier(v *request.View, b *fleet.Backend) int
}

// Scorer prices what a candidate costs a request beyond what the policy
// weighs itself (its queue, its prefill, its cache): loading a LoRA
// adapter that is not resident, say. The scheduler sums its scorers'
// costs into Input.Extra; kvroute adds them to each candidate's estimate,
// so that every rule (stickiness, the cache lead, room in the KV cache)
// weighs them. The peers' policies, reimplemented as published, do not.
type Scorer interface {
	// Cost is the seconds that sending v to b adds to its time to first
	// token; never negative.
	Cost(v *request.View, b *fleet.Backend) float64
}
