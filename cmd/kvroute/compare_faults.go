package main

import (
	"flag"
	"fmt"
	"time"

	"github.com/kvroute/kvroute/internal/compare"
)

// faultFlags declares compare's fault flags into w.
func faultFlags(fs *flag.FlagSet, w *fleetFlags) {
	fs.StringVar(&w.fault, "fault", "", "inject a fault into every policy's run: kill (the first engine crashes), hang (it stops sending, its connections open; the router's stream idle timeout is 1s of wall clock) or restart (every engine drained, stopped and started again in turn, as a rolling update)")
	fs.DurationVar(&w.faultAt, "fault-at", 0, "with --fault: this long (wall clock) into the run")
	fs.DurationVar(&w.drainGrace, "drain-grace", 0, "with --fault restart: the router's fleet.drain_grace (wall clock); 0 keeps its default")
}

// faultOf is the fault the flags ask for, nil for none.
func (w *fleetFlags) faultOf() (*compare.Fault, error) {
	switch w.fault {
	case "":
		if w.faultAt != 0 || w.drainGrace != 0 {
			return nil, fmt.Errorf("--fault-at and --drain-grace go with --fault")
		}
		return nil, nil
	case compare.FaultKill, compare.FaultHang, compare.FaultRestart:
	default:
		return nil, fmt.Errorf("--fault %q: want kill, hang or restart", w.fault)
	}
	if w.faultAt <= 0 || w.drainGrace < 0 {
		return nil, fmt.Errorf("--fault takes a positive --fault-at (and --drain-grace not negative)")
	}
	return &compare.Fault{Kind: w.fault, At: w.faultAt, DrainGrace: w.drainGrace}, nil
}

// describeFault says how a run took its fault.
func describeFault(run string, r compare.FaultResult) string {
	s := fmt.Sprintf("\n%s: %s %v (wall clock) into the run: %d of %d requests saw an error; %d streams moved to another engine\n",
		run, r.Kind, r.At, r.Errors, r.Requests, r.Moved)
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
	return s
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
