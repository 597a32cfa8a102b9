package disagg

import (
	"fmt"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/lifecycle"
	"github.com/kvroute/kvroute/internal/request"
)

// Splitter is the split decision of a front whose fleet may have prefill
// engines: whether a request gets a prefill and a decode leg, and the legs.
// Every front asks it (the HTTP front, the Envoy external processor), so
// that a request is split alike whatever carries it; the simulator asks
// its Decider, the decision's core, on the same estimate.
type Splitter struct {
	// Protocol is disaggregation.protocol; "" never splits.
	Protocol string
	// Transfer is what a prefill answer's parameters may name.
	Transfer Transfer
	// Decider is the conditional split; nil splits every request a
	// prefill engine can take.
	Decider *Decider
	// Fleet is read for the engines that may take new requests, and
	// RoleOf gives each its role (members.Set.RoleOf).
	Fleet  *fleet.Fleet
	RoleOf func(b *fleet.Backend) string
}

// Outcomes of Split for a request that is not split although its model
// has prefill engines (the values of kvroute_pd_requests_total's outcome).
const (
	// OutcomeNoDecode: prefill engines serve the model, none decodes it.
	OutcomeNoDecode = "no_decode_engine"
	// OutcomeDecidedWhole: the conditional split found the whole request
	// cheaper.
	OutcomeDecidedWhole = "decided_whole"
)

// Plan is Split's answer for one request.
type Plan struct {
	// Legs are the split request's legs (lifecycle.Request.SetLegs); nil
	// keeps its one leg.
	Legs []lifecycle.Leg
	// Whole is why a request that could have been split is served whole
	// (lifecycle.Request.Whole), "" otherwise; Outcome names the case for
	// the metrics (OutcomeNoDecode, OutcomeDecidedWhole), "" when the
	// request is split or its model has no prefill engine.
	Whole, Outcome string
}

// Split plans request v (its prompt's block hashes) at now: its legs when
// the live fleet has a prefill engine for its model and an engine to
// decode it and the decision (Decider) splits it; otherwise its one leg.
// A model with prefill engines and none to decode it is served whole (a
// discovered pool can be left so; a configuration cannot). It reads the
// fleet's snapshot and the scheduler's accounting, never blocks.
func (s *Splitter) Split(v *request.View, hashes []uint64, now time.Time) Plan {
	if s == nil || s.Protocol == "" {
		return Plan{}
	}
	switch s.fleetRoles(v.Model) {
	case noPrefill:
		return Plan{}
	case noDecode:
		return Plan{Whole: WholeNoDecode, Outcome: OutcomeNoDecode}
	}
	if s.Decider != nil {
		if ch := s.Decider.Split(v, hashes, now); !ch.Split {
			return Plan{Whole: wholeWhy(ch), Outcome: OutcomeDecidedWhole}
		}
	}
	return Plan{Legs: Legs(v, s.Protocol, s.Transfer)}
}

// What the live fleet has for a model (fleetRoles).
const (
	noPrefill = iota // no prefill engine: not split
	noDecode         // prefill engines, none to decode: served whole
	splittable
)

// WholeNoDecode is the Whole of a request served whole for want of a
// decode engine.
const WholeNoDecode = "no decode engine for the model"

// fleetRoles is what the live fleet has for model: a prefill engine
// serving it (its role is its entry's, a pod's label for a Kubernetes
// pool), and an engine to decode it (a decode or both engine serving
// it), among the engines that may take new requests (healthy, not
// draining: an ejected engine counts for nothing).
func (s *Splitter) fleetRoles(model string) int {
	var prefill, decode bool
	for _, b := range s.Fleet.Snapshot().Healthy {
		if !b.Serves(model) {
			continue
		}
		if s.RoleOf(b) == config.RolePrefill {
			prefill = true
		} else {
			decode = true
		}
	}
	switch {
	case !prefill:
		return noPrefill
	case !decode:
		return noDecode
	}
	return splittable
}

// wholeWhy is the Whole of a request the conditional split serves whole:
// why, and the two estimates it compared (the whole TTFT plus the stall
// of the whole engine's streams, the split TTFT).
func wholeWhy(ch Choice) string {
	var why string
	switch ch.Reason {
	case "short":
		why = "not worth a transfer"
	case "prefill-busy":
		why = "prefill engines busier"
	case "no-prefill":
		return "no prefill engine can take it"
	case "policy":
		return "the policy's own split decision"
	default:
		why = ch.Reason
	}
	return fmt.Sprintf("%s: whole %s <= split %s", why, seconds(ch.WholeCost), seconds(ch.SplitCost))
}

// seconds is s seconds as a duration rounded to 10 µs.
func seconds(s float64) time.Duration {
	return time.Duration(s * float64(time.Second)).Round(10 * time.Microsecond)
}
