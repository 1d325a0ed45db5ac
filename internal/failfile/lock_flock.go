//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package failfile

import (
	"errors"
	"os"
	"syscall"
	"time"
)

// lock takes an exclusive advisory lock (flock) on the file at path,
// waiting at most wait; unlock releases it. flock locks belong to the open
// file, so goroutines of one process exclude each other as processes do.
func lock(path string, wait time.Duration) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(wait)
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) || time.Now().After(deadline) {
			f.Close()
			return nil, err
		}
		time.Sleep(lockPoll)
	}
}

const lockPoll = 10 * time.Millisecond
