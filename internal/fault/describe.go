package fault

import (
	"fmt"
	"time"
)

// Describe says how the run named run took its fault, as `kvroute
// compare` and `kvroute bench --soak` print it.
func Describe(run string, r Result) string {
	s := fmt.Sprintf("\n%s: %s %v (wall clock) into the run: %d of %d requests saw an error; %d streams moved to another engine\n",
		run, r.Kind, r.At, r.Errors, r.Requests, r.Moved)
	if r.Refused > 0 {
		s += fmt.Sprintf("  %d requests refused cleanly (429/503 from admission): not errors\n", r.Refused)
	}
	for _, why := range r.Why {
		s += "  error: " + why + "\n"
	}
	if r.Hit > 0 {
		s += fmt.Sprintf("  %d completed streams started on a faulted engine: added latency (longest gap less the stream's median) p50 %.1f ms, p99 %.1f ms (emulated); bound (their context's prefill + 100 ms) p99 %.1f ms; %d over their bound\n",
			r.Hit, ms(r.Added50), ms(r.Added99), ms(r.Bound99), r.Over)
	}
	if len(r.Restarts) > 0 {
		var longest time.Duration
		for _, d := range r.Restarts {
			longest = max(longest, d)
		}
		s += fmt.Sprintf("  rolling restart of %d engines (wall clock): longest engine %v, engine start at most %v\n", len(r.Restarts), longest.Round(time.Millisecond), r.Started.Round(time.Microsecond))
	}
	if r.RestartErr != "" {
		s += "  the rolling restart stopped: " + r.RestartErr + "\n"
	}
	return s
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
