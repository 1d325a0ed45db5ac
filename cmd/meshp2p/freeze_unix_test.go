//go:build unix

package main

import (
	"syscall"
	"testing"
)

// freeze stops p (SIGSTOP, by PID) and returns its thaw (SIGCONT, once;
// also at the test's end). A test that must act "mid-generation" freezes
// a hop of the route first: the generation then waits for it instead of
// racing the test to its end (on a quiet machine a small model's
// generation can finish before a spare node has even started).
func freeze(t *testing.T, p *cliProc) (thaw func()) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP %d: %v", p.cmd.Process.Pid, err)
	}
	done := false
	thaw = func() {
		if !done {
			done = true
			_ = p.cmd.Process.Signal(syscall.SIGCONT)
		}
	}
	t.Cleanup(thaw)
	return thaw
}
