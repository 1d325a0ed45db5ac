// Package dirlock keeps two processes off one directory: a lock file
// that holds the pid of the process that holds it. The CLI's `start` and
// `tracker` take one in their data dir (two nodes there would share one
// identity and overwrite each other's node.json), and clients take one
// for their identity file, falling back to a temporary identity when
// another run holds it.
//
// Where flock(2) exists (and on Windows, LockFileEx) the lock is the kernel's: it ends with its
// process, however that process ends, so a lock file left by a dead
// process is simply taken over. Elsewhere the file itself is the lock,
// and one naming a process that no longer runs is taken over.
package dirlock

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ErrHeld is what a *HeldError matches (errors.Is).
var ErrHeld = errors.New("lock held by another process")

// HeldError: another process holds the lock at Path.
type HeldError struct {
	Path string
	// PID is the holder's process id (0: unknown, e.g. it has not written
	// it yet).
	PID int
}

func (e *HeldError) Error() string {
	if e.PID == 0 {
		return fmt.Sprintf("%s is held by another process", e.Path)
	}
	return fmt.Sprintf("%s is held by process %d", e.Path, e.PID)
}

// Is makes a *HeldError match ErrHeld.
func (e *HeldError) Is(target error) bool { return target == ErrHeld }

// Lock is a held lock; Release gives it up.
type Lock struct {
	f    *os.File
	path string
}

// Acquire takes the lock file at path (created 0600 if missing) without
// waiting and writes this process's pid into it; a lock another process
// holds is an error wrapping *HeldError.
func Acquire(path string) (*Lock, error) {
	l, err := acquire(path)
	if err != nil {
		return nil, err
	}
	if err := l.f.Truncate(0); err != nil {
		l.Release()
		return nil, err
	}
	if _, err := l.f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0); err != nil {
		l.Release()
		return nil, err
	}
	return l, nil
}

// readPID is the pid a lock file names (0: none or unreadable).
func readPID(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}
