package compare

import "github.com/kvroute/kvroute/internal/fault"

// The faults a run can be given are package fault's; these are their
// names as compare's callers know them.
type (
	// Fault is a fault injected into every policy's run.
	Fault = fault.Fault
	// FaultResult is how a run took its fault.
	FaultResult = fault.Result
)

// Fault kinds (Fault.Kind).
const (
	FaultKill    = fault.Kill
	FaultHang    = fault.Hang
	FaultRestart = fault.Restart
)
