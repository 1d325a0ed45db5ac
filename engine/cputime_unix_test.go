//go:build unix

package engine

import (
	"syscall"
	"testing"
	"time"
)

// cpuTime is the process's CPU time so far (user and system).
func cpuTime(t *testing.T) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
