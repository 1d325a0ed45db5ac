package dirlock

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// A held lock names its holder; released, it is free again; a lock file
// naming a process that is gone is taken over.
func TestAcquire(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.lock")
	l, err := Acquire(path)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); strings.TrimSpace(string(b)) != strconv.Itoa(os.Getpid()) {
		t.Fatalf("lock file holds %q, want this pid %d", b, os.Getpid())
	}
	_, err = Acquire(path)
	var held *HeldError
	if !errors.As(err, &held) || !errors.Is(err, ErrHeld) || held.PID != os.Getpid() || !strings.Contains(err.Error(), "process "+strconv.Itoa(os.Getpid())) {
		t.Fatalf("second Acquire: %v; want held by pid %d", err, os.Getpid())
	}
	l.Release()
	l, err = Acquire(path)
	if err != nil {
		t.Fatalf("after Release: %v", err)
	}
	l.Release()

	// A stale lock file: the pid of a process that has exited.
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Skip("no `true` to run:", err)
	}
	stale := filepath.Join(t.TempDir(), "node.lock")
	if err := os.WriteFile(stale, []byte(strconv.Itoa(dead.Process.Pid)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err = Acquire(stale)
	if err != nil {
		t.Fatalf("stale lock of dead pid %d: %v", dead.Process.Pid, err)
	}
	defer l.Release()
	if b, _ := os.ReadFile(stale); strings.TrimSpace(string(b)) != strconv.Itoa(os.Getpid()) {
		t.Fatalf("taken-over lock file holds %q, want this pid", b)
	}
}
