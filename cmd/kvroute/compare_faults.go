package main

import (
	"flag"
	"fmt"
	"time"

	"github.com/kvroute/kvroute/internal/fault"
)

// faultFlags declares compare's fault flags into w.
func faultFlags(fs *flag.FlagSet, w *fleetFlags) {
	declareFault(fs, &w.fault, &w.faultAt, &w.drainGrace, "every policy's run")
}

// faultOf is the fault compare's flags ask for, nil for none.
func (w *fleetFlags) faultOf() (*fault.Fault, error) {
	return parseFault(w.fault, w.faultAt, w.drainGrace)
}

// declareFault declares --fault, --fault-at and --drain-grace, injecting
// a fault into the run named into.
func declareFault(fs *flag.FlagSet, kind *string, at, drainGrace *time.Duration, into string) {
	fs.StringVar(kind, "fault", "", "inject a fault into "+into+": kill (the first engine crashes), hang (it stops sending, its connections open; the router's stream idle timeout is 1s of wall clock) or restart (every engine drained, stopped and started again in turn, as a rolling update)")
	fs.DurationVar(at, "fault-at", 0, "with --fault: this long (wall clock) into the run")
	fs.DurationVar(drainGrace, "drain-grace", 0, "with --fault restart: the router's fleet.drain_grace (wall clock); 0 keeps its default")
}

// parseFault is the fault --fault, --fault-at and --drain-grace ask
// for, nil for none.
func parseFault(kind string, at, drainGrace time.Duration) (*fault.Fault, error) {
	switch kind {
	case "":
		if at != 0 || drainGrace != 0 {
			return nil, fmt.Errorf("--fault-at and --drain-grace go with --fault")
		}
		return nil, nil
	case fault.Kill, fault.Hang, fault.Restart:
	default:
		return nil, fmt.Errorf("--fault %q: want kill, hang or restart", kind)
	}
	if at <= 0 || drainGrace < 0 {
		return nil, fmt.Errorf("--fault takes a positive --fault-at (and --drain-grace not negative)")
	}
	return &fault.Fault{Kind: kind, At: at, DrainGrace: drainGrace}, nil
}
