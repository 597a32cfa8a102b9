//go:build unix

package request

import (
	"syscall"
	"time"
)

// cpuTime is the CPU time the process has used, GC workers included: on a
// shared machine it measures a benchmark's cost where wall time measures
// the neighbours' load too.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
