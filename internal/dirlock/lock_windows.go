package dirlock

import (
	"errors"
	"os"

	"golang.org/x/sys/windows"
)

// lockAt is the byte LockFileEx locks, far past the pid the file holds:
// Windows locks are mandatory, and other processes read that pid.
var lockAt = windows.Overlapped{OffsetHigh: 1 << 30}

// acquire opens path and locks it with LockFileEx without waiting. The
// lock belongs to the handle, so two Acquires in one process exclude
// each other, and it ends when its process does, however that ends.
func acquire(path string) (*Lock, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	ol := lockAt
	err = windows.LockFileEx(windows.Handle(f.Fd()), windows.LOCKFILE_EXCLUSIVE_LOCK|windows.LOCKFILE_FAIL_IMMEDIATELY, 0, 1, 0, &ol)
	if err != nil {
		f.Close()
		if errors.Is(err, windows.ERROR_LOCK_VIOLATION) {
			return nil, &HeldError{Path: path, PID: readPID(path)}
		}
		return nil, err
	}
	return &Lock{f: f, path: path}, nil
}

// Release empties the file and gives up the lock; the file stays (as
// with flock).
func (l *Lock) Release() {
	_ = l.f.Truncate(0)
	ol := lockAt
	_ = windows.UnlockFileEx(windows.Handle(l.f.Fd()), 0, 1, 0, &ol)
	l.f.Close()
}
