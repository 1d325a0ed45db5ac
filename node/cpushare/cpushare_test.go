package cpushare

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/internal/testbin"
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(gateChildEnv); dir != "" {
		gateChild(dir)
	}
	if dir := os.Getenv(memberChildEnv); dir != "" {
		if _, err := Join(dir); err != nil {
			os.Exit(2)
		}
	}
	testbin.Main(m)
}

// gateChildEnv makes a test binary a member that claims every CPU and
// holds the claim until killed (gateChild).
const gateChildEnv = "MESHP2P_CPUSHARE_GATE_CHILD"

// memberChildEnv makes a test binary started by child join the members
// of the directory it names first.
const memberChildEnv = "MESHP2P_CPUSHARE_MEMBER_CHILD"

func gateChild(dir string) {
	m, err := Join(dir)
	if err != nil {
		os.Exit(2)
	}
	g := m.Gate()
	if g == nil {
		os.Exit(3)
	}
	fmt.Println(g.Acquire(m.ncpu))
	time.Sleep(time.Minute)
	os.Exit(0)
}

// child starts a process of ours doing what (testbin.Child) that lives
// until the test ends (killed by its PID).
func child(t *testing.T, what string) *exec.Cmd {
	t.Helper()
	c := testbin.Child(what)
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
	return c
}

// tempDir is a directory removed when the test ends, as far as the
// platform lets it: wine 8.0 fails Go's os.RemoveAll, which t.TempDir
// would report as a failure.
func tempDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "cpushare")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}

// register writes a member file for pid as Join would (start time given).
func register(t *testing.T, m *Member, pid int, start string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(m.dir, strconv.Itoa(pid)), []byte(start), 0o600); err != nil {
		t.Fatal(err)
	}
}

// Members counts this process and live members, not a dead one nor a
// reused pid (a live process whose start time is not the member's).
func TestMembers(t *testing.T) {
	m, err := Join(tempDir(t))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Leave()
	if n := m.Members(); n != 1 {
		t.Fatalf("alone: %d members", n)
	}
	live := child(t, "sleep")
	start := m.startTime(live.Process.Pid)
	if start == "" {
		t.Fatalf("no start time for a live child (%s)", runtime.GOOS)
	}
	register(t, m, live.Process.Pid, start)
	dead := testbin.Child("exit")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	register(t, m, dead.Process.Pid, "1")
	reused := child(t, "sleep") // a live pid whose start time is not the member's
	register(t, m, reused.Process.Pid, "0")
	if n := m.Members(); n != 2 {
		t.Fatalf("self, a live member, a dead one and a reused pid: %d members, want 2", n)
	}
	for _, pid := range []int{dead.Process.Pid, reused.Process.Pid} {
		if _, err := os.Stat(filepath.Join(m.dir, strconv.Itoa(pid))); !os.IsNotExist(err) {
			t.Errorf("the file of pid %d (not a member) was kept", pid)
		}
	}
	other := child(t, "sleep")
	register(t, m, other.Process.Pid, m.startTime(other.Process.Pid))
	if got, want := m.Threads(context.Background()), max(1, runtime.NumCPU()/3); got > want {
		t.Fatalf("three members on %d CPUs: %d threads, want at most %d", runtime.NumCPU(), got, want)
	}
	// A member killed without leaving (a crash, Task Manager) stops
	// counting.
	_ = other.Process.Kill()
	_ = other.Wait()
	if n := m.Members(); n != 2 {
		t.Fatalf("after a member was killed: %d members, want 2", n)
	}
	m.Leave()
	if _, err := os.Stat(m.file); !os.IsNotExist(err) {
		t.Fatal("Leave kept the member's file")
	}
}

// A CPU spinning beside the process is not counted as free.
func TestThreadsLeaveBusyCPUs(t *testing.T) {
	ncpu := runtime.NumCPU()
	if ncpu < 2 {
		t.Skip("one CPU: the share is 1 anyway")
	}
	m, err := Join(tempDir(t))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Leave()
	if _, _, _, ok, err := m.ticks(); !ok || err != nil {
		t.Skipf("no CPU times on %s (ok %v, %v): every CPU counts as idle", runtime.GOOS, ok, err)
	}
	child(t, "spin")
	time.Sleep(50 * time.Millisecond) // the child has started spinning
	got := m.Threads(context.Background())
	t.Logf("%d CPUs, one spinning: %d threads", ncpu, got)
	if got < 1 || got > ncpu-1 {
		t.Fatalf("%d threads with one of %d CPUs spinning, want 1 to %d", got, ncpu, ncpu-1)
	}
}

// A member's CPU time is read (Cap counts it as the members' to share):
// a spinning member's time grows.
func TestOthersTicksReadsMembers(t *testing.T) {
	dir := tempDir(t)
	m, err := Join(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Leave()
	if _, _, _, ok, err := m.ticks(); !ok || err != nil {
		t.Skipf("no CPU times on %s (ok %v, %v)", runtime.GOOS, ok, err)
	}
	c := testbin.Child("spin")
	c.Env = append(c.Env, memberChildEnv+"="+dir)
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
	pid := c.Process.Pid
	var first uint64
	seen := false
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		ticks, ok := m.othersTicks()[pid]
		switch {
		case !ok:
		case !seen:
			first, seen = ticks, true
		case ticks > first:
			return
		}
	}
	t.Fatalf("the spinning member %d: read %v, its time never grew past %d (members' ticks: %v)", pid, seen, first, m.othersTicks())
}

func TestThreadsCancelled(t *testing.T) {
	m, err := Join(tempDir(t))
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
