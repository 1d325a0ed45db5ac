package failfile

import (
	"errors"
	"os"
	"time"

	"golang.org/x/sys/windows"
)

// lock takes an exclusive LockFileEx lock on the file at path, waiting at
// most wait; unlock releases it. The lock belongs to the handle, so
// goroutines of one process exclude each other as processes do.
func lock(path string, wait time.Duration) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	h := windows.Handle(f.Fd())
	deadline := time.Now().Add(wait)
	for {
		ol := windows.Overlapped{}
		err = windows.LockFileEx(h, windows.LOCKFILE_EXCLUSIVE_LOCK|windows.LOCKFILE_FAIL_IMMEDIATELY, 0, 1, 0, &ol)
		if err == nil {
			return func() {
				ol := windows.Overlapped{}
				_ = windows.UnlockFileEx(h, 0, 1, 0, &ol)
				f.Close()
			}, nil
		}
		if !errors.Is(err, windows.ERROR_LOCK_VIOLATION) || time.Now().After(deadline) {
			f.Close()
			return nil, err
		}
		time.Sleep(lockPoll)
	}
}

const lockPoll = 10 * time.Millisecond
