package dirlock

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/neuron-tai/meshp2p/internal/testbin"
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

// Another process's lock is held here, names that process, and ends with
// it (it exits without Release): flock on Unix, LockFileEx on Windows
// (make test-platforms runs this under wine).
func TestAcquireOtherProcess(t *testing.T) {
	if path := os.Getenv("DIRLOCK_TEST_HOLD"); path != "" {
		if _, err := Acquire(path); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println("held")
		_, _ = io.ReadAll(os.Stdin) // until the parent closes it
		os.Exit(0)
	}
	// Not t.TempDir: Wine 8 cannot os.RemoveAll (docs/platforms.md).
	dir, err := os.MkdirTemp("", "dirlock-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "node.lock")
	cmd := testbin.Self("-test.run=^TestAcquireOtherProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), "DIRLOCK_TEST_HOLD="+path)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	pr, pw := io.Pipe()
	cmd.Stdout = io.MultiWriter(pw, &out)
	if err := cmd.Start(); err != nil {
		t.Skip("cannot start a second process:", err)
	}
	line, _ := bufio.NewReader(pr).ReadString('\n')
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	if strings.TrimSpace(line) != "held" {
		stdin.Close()
		_ = cmd.Wait()
		t.Fatalf("holder: %q %s", line, out.String())
	}
	_, err = Acquire(path)
	var held *HeldError
	if !errors.As(err, &held) || held.PID != cmd.Process.Pid {
		t.Errorf("Acquire while pid %d holds it: %v", cmd.Process.Pid, err)
	}
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("holder: %v\n%s", err, out.String())
	}
	pw.Close()
	l, err := Acquire(path)
	if err != nil {
		t.Fatalf("after the holder exited: %v", err)
	}
	l.Release()
}
