//go:build unix

package fingerprint

import (
	"syscall"
	"time"
)

// cpuTime is the CPU time the process has used, garbage collection
// included. Benchmarks compare it rather than wall time, which other work
// on a shared machine inflates at random.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
