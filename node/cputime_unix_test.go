//go:build unix

package node

import (
	"syscall"
	"testing"
	"time"
)

// cpuTime is the process's CPU time so far (user and system): every
// in-process node's compute, robust to a loaded machine.
func cpuTime(t *testing.T) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
