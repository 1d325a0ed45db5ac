//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package dirlock

import (
	"errors"
	"os"
	"syscall"
)

// acquire opens path and takes an exclusive flock on it without waiting.
// flock locks belong to the open file, so two Acquires in one process
// exclude each other as two processes do.
func acquire(path string) (*Lock, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, &HeldError{Path: path, PID: readPID(path)}
		}
		return nil, err
	}
	return &Lock{f: f, path: path}, nil
}

// Release empties the file and gives up the lock. The file stays: removing
// it would let a process that opened it a moment before lock a file no
// longer in the directory while a third creates and locks a new one.
func (l *Lock) Release() {
	_ = l.f.Truncate(0)
	_ = syscall.Flock(int(l.f.Fd()), syscall.LOCK_UN)
	l.f.Close()
}
