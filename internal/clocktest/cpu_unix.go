//go:build unix

package clocktest

import (
	"syscall"
	"time"
)

// CPUTime is the CPU time (user and system) the process has used so far,
// the garbage collector's included. A benchmark on a shared machine
// reports its cost per operation from it (ReportCPU): wall time counts the
// time the process waited for a CPU as well.
func CPUTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
