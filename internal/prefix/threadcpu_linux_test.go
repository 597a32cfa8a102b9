package prefix

import (
	"syscall"
	"time"
	"unsafe"
)

// threadCPU is the CPU time the calling thread has used (Linux's
// CLOCK_THREAD_CPUTIME_ID): unlike wall time, it leaves out the time the
// thread waited for a CPU on a shared machine. The caller locks its
// goroutine to its thread.
func threadCPU() time.Duration {
	var ts syscall.Timespec
	const clockThreadCPUTimeID = 3
	if _, _, e := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTimeID, uintptr(unsafe.Pointer(&ts)), 0); e != 0 {
		return 0
	}
	return time.Duration(ts.Nano())
}
