//go:build !unix

package main

import "testing"

// freeze needs SIGSTOP (freeze_unix_test.go): the tests using it skip.
func freeze(t *testing.T, _ *cliProc) (thaw func()) {
	t.Helper()
	t.Skip("freezing a process needs SIGSTOP (Unix)")
	return func() {}
}

// mkfifo needs named pipes in the file system (fifo_unix_test.go).
func mkfifo(t *testing.T, _ string) {
	t.Helper()
	t.Skip("named pipes in the file system are Unix only")
}
