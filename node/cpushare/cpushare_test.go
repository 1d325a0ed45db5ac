package cpushare

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"testing"
)

// child starts a process of ours that lives until the test ends (killed
// by its PID).
func child(t *testing.T, script string) *exec.Cmd {
	t.Helper()
	c := exec.Command("sh", "-c", script)
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Process.Signal(syscall.SIGKILL); _ = c.Wait() })
	return c
}

// register writes a member file for pid as Join would (start time given).
func register(t *testing.T, m *Member, pid int, start string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(m.dir, strconv.Itoa(pid)), []byte(start), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestMembers(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("needs /proc")
	}
	m, err := Join(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Leave()
	if n := m.Members(); n != 1 {
		t.Fatalf("alone: %d members", n)
	}
	live := child(t, "sleep 60")
	register(t, m, live.Process.Pid, m.startTime(live.Process.Pid))
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	register(t, m, dead.Process.Pid, "1")
	reused := child(t, "sleep 60") // a live pid whose start time is not the member's
	register(t, m, reused.Process.Pid, "0")
	if n := m.Members(); n != 2 {
		t.Fatalf("self, a live member, a dead one and a reused pid: %d members, want 2", n)
	}
	for _, pid := range []int{dead.Process.Pid, reused.Process.Pid} {
		if _, err := os.Stat(filepath.Join(m.dir, strconv.Itoa(pid))); !os.IsNotExist(err) {
			t.Errorf("the file of pid %d (not a member) was kept", pid)
		}
	}
	other := child(t, "sleep 60")
	register(t, m, other.Process.Pid, m.startTime(other.Process.Pid))
	if got, want := m.Threads(context.Background()), max(1, runtime.NumCPU()/3); got > want {
		t.Fatalf("three members on %d CPUs: %d threads, want at most %d", runtime.NumCPU(), got, want)
	}
	m.Leave()
	if _, err := os.Stat(m.file); !os.IsNotExist(err) {
		t.Fatal("Leave kept the member's file")
	}
}

// A CPU spinning beside the process is not counted as free.
func TestThreadsLeaveBusyCPUs(t *testing.T) {
	if _, err := os.Stat("/proc/stat"); err != nil {
		t.Skip("needs /proc")
	}
	ncpu := runtime.NumCPU()
	if ncpu < 2 {
		t.Skip("one CPU: the share is 1 anyway")
	}
	m, err := Join(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Leave()
	child(t, "while :; do :; done")
	got := m.Threads(context.Background())
	t.Logf("%d CPUs, one spinning: %d threads", ncpu, got)
	if got < 1 || got > ncpu-1 {
		t.Fatalf("%d threads with one of %d CPUs spinning, want 1 to %d", got, ncpu, ncpu-1)
	}
}

func TestThreadsCancelled(t *testing.T) {
	m, err := Join(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Leave()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if got := m.Threads(ctx); got < 1 || got > runtime.NumCPU() {
		t.Fatalf("cancelled: %d threads", got)
	}
}
