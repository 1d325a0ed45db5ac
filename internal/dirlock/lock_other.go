//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly || windows)

package dirlock

import (
	"errors"
	"io/fs"
	"os"
)

// acquire creates path exclusively; an existing one naming a live process
// is held, one naming no live process is stale and taken over.
func acquire(path string) (*Lock, error) {
	for try := 0; ; try++ {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
		if err == nil {
			return &Lock{f: f, path: path}, nil
		}
		if !errors.Is(err, fs.ErrExist) || try > 0 {
			return nil, err
		}
		pid := readPID(path)
		if pid != 0 && alive(pid) {
			return nil, &HeldError{Path: path, PID: pid}
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
	}
}

// alive reports whether process pid exists (os.FindProcess fails for one
// that does not on the platforms this file builds for).
func alive(pid int) bool {
	p, err := os.FindProcess(pid)
	if err != nil {
		return false
	}
	p.Release()
	return true
}

// Release closes and removes the lock file.
func (l *Lock) Release() {
	l.f.Close()
	_ = os.Remove(l.path)
}
