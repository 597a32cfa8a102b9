package report

import (
	"slices"
	"time"
)

// FaultRun is how a simulated run took an engine fault (kvroute sim
// --fault kill, hang or rolling): the figures kvroute compare's fault
// scenarios report live, with the simulator's own account of the moves.
// Latencies are in milliseconds of virtual time.
type FaultRun struct {
	// Kind is the fault (kill, hang, rolling); AtMs when it began.
	Kind string  `json:"kind"`
	AtMs float64 `json:"at_ms"`
	// Errors are the requests whose client saw an error because of the
	// fault (a stream that could not be moved, a request whose re-sends
	// ran out); the run's Errors counts them with any other.
	Errors int `json:"errors"`
	// Moved counts the moves of streams to another engine (a stream
	// moved twice counts twice), Streams the distinct streams moved,
	// Refused the streams that could not be moved (not continuable, over
	// migration.max_context_tokens, out of attempts, nowhere to go),
	// Resent the requests re-sent before their first token.
	Moved   int `json:"moved"`
	Streams int `json:"streams_moved"`
	Refused int `json:"refused"`
	Resent  int `json:"resent"`
	// ExtraPrefillTokens are the prompt tokens the continuations' engines
	// computed (their prompt less what their cache held): the moves' cost.
	ExtraPrefillTokens int64 `json:"extra_prefill_tokens"`
	// Hit are the completed streams that were streaming from an engine
	// when its fault began (its kill, hang or drain); Added50 and Added99
	// their added latency (AddedLatency) at the median and p99, Bound99
	// the p99 of its bound (their context's prefill on an idle engine
	// plus 100 ms), Over the streams over their own bound.
	Hit     int     `json:"hit"`
	Added50 float64 `json:"added_p50_ms"`
	Added99 float64 `json:"added_p99_ms"`
	Bound99 float64 `json:"bound_p99_ms"`
	Over    int     `json:"over_bound"`
	// RestartsMs is each engine's restart, drain to undrain, in turn
	// (rolling).
	RestartsMs []float64 `json:"restarts_ms,omitempty"`
}

// AddedLatency is what a fault at at added to a stream whose first token
// came at first and whose gaps between tokens were itl: its longest gap
// ending at or after at, less its median gap (the stream's own pace). It
// also returns how many tokens the stream had before that gap, and false
// when no gap ends after at (the stream was over) or the stream had not
// started by at (it had nothing to move).
func AddedLatency(first time.Duration, itl []time.Duration, at time.Duration) (added time.Duration, before int, ok bool) {
	if first >= at || len(itl) < 2 {
		return 0, 0, false
	}
	t, j, gap := first, -1, time.Duration(0)
	for i, g := range itl {
		t += g
		if t >= at && g > gap {
			j, gap = i, g
		}
	}
	if j < 0 {
		return 0, 0, false
	}
	sorted := slices.Clone(itl)
	slices.Sort(sorted)
	return gap - sorted[len(sorted)/2], j + 1, true
}
