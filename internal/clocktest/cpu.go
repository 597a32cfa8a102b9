package clocktest

import (
	"testing"
	"time"
)

// ReportCPU reports the process's CPU time since cpu0 (a CPUTime reading
// taken before the loop) per iteration of b, as cpu-ns/op; nothing where
// CPUTime cannot be read.
func ReportCPU(b *testing.B, cpu0 time.Duration) {
	if cpu0 == 0 || b.N == 0 {
		return
	}
	b.ReportMetric(float64(CPUTime()-cpu0)/float64(b.N), "cpu-ns/op")
}
