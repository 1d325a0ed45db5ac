//go:build !unix

package node

import (
	"testing"
	"time"
)

// cpuTime needs getrusage (cputime_unix_test.go): the tests using it skip.
func cpuTime(t *testing.T) time.Duration {
	t.Skip("process CPU time: getrusage is Unix only")
	return 0
}
