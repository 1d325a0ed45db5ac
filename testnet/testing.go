package testnet

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// RequireEnv, when set to 1, turns "skip: namespaces unavailable" into a
// test failure (for CI jobs that must run the NAT tests).
const RequireEnv = "MESHP2P_TESTNET_REQUIRE"

// Check reports whether this process can build topologies: root (or
// CAP_SYS_ADMIN+CAP_NET_ADMIN) and working ip/iptables. The error wraps
// ErrUnavailable and says what to do.
func Check(ctx context.Context) error {
	if runtime.GOOS != "linux" {
		return fmt.Errorf("%w: the NAT test network is built from Linux network namespaces (ip netns, iptables); this is %s", ErrUnavailable, runtime.GOOS)
	}
	for _, tool := range []string{"ip", "iptables", "iptables-restore", "sysctl"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%w: %s not found (run testnet/deps.sh as root: apt-get install iproute2 iptables)", ErrUnavailable, tool)
		}
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN) to create network namespaces; run the tests as root (CI does), or `unshare -Urnm --propagation private sh -c 'mount -t tmpfs tmpfs /run && go test ./testnet/'` where unprivileged user namespaces are allowed", ErrUnavailable)
	}
	// A real probe: creating a namespace needs more than uid 0 in some
	// containers.
	probe := fmt.Sprintf("tprobe%d", os.Getpid()%10000)
	if err := runCmd(ctx, nil, "", "ip", "netns", "add", probe); err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	var errs []error
	if err := runCmd(ctx, nil, "", "ip", "netns", "exec", probe, "iptables", "-w", "-t", "nat", "-L", "-n"); err != nil {
		errs = append(errs, fmt.Errorf("%w: iptables does not work inside a namespace: %w", ErrUnavailable, err))
	}
	if err := runCmd(ctx, nil, "", "ip", "netns", "del", probe); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// TestPrefix returns a fresh prefix for a test topology:
// "t" + this process's PID in base 36 (5 characters) + 2 random base-36
// characters. SweepStale recognises such prefixes and removes those whose
// process is gone.
func TestPrefix() string {
	var b [2]byte
	_, _ = rand.Read(b[:])
	const digits = "0123456789abcdefghijklmnopqrstuvwxyz"
	pid := strconv.FormatInt(int64(os.Getpid()), 36)
	pid = strings.Repeat("0", max(0, 5-len(pid))) + pid
	return fmt.Sprintf("t%s%c%c", pid, digits[int(b[0])%36], digits[int(b[1])%36])
}

// ownerOf parses the owner PID of a TestPrefix prefix.
func ownerOf(prefix string) (int, bool) {
	if len(prefix) != 8 || prefix[0] != 't' {
		return 0, false
	}
	pid, err := strconv.ParseInt(strings.TrimLeft(prefix[1:6], "0"), 36, 64)
	if err != nil || pid <= 0 {
		return 0, false
	}
	return int(pid), true
}

// SweepStale removes test topologies (TestPrefix names) whose owning
// process no longer exists: leftovers of an interrupted test run (a
// killed test binary cannot run its cleanups; its children die with it
// through the parent-death signal, the namespaces stay). Topologies of
// running processes, and all other prefixes, are left alone.
func SweepStale(ctx context.Context) error {
	prefixes, err := Prefixes(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range prefixes {
		pid, ok := ownerOf(p)
		if !ok || pid == os.Getpid() {
			continue
		}
		if alive(pid) {
			continue
		}
		errs = append(errs, Cleanup(ctx, p))
	}
	return errors.Join(errs...)
}

// alive reports whether pid is a live process (a zombie — dead but not
// reaped, common under a container's PID 1 — counts as dead).
func alive(pid int) bool {
	if !pidExists(pid) {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	// "pid (comm) S ...": the state follows the last ')'.
	if i := strings.LastIndexByte(string(b), ')'); i >= 0 && i+2 < len(b) {
		return b[i+2] != 'Z' && b[i+2] != 'X'
	}
	return true
}

// NewT builds spec under a fresh TestPrefix for a test. It skips the test
// (fails it when MESHP2P_TESTNET_REQUIRE=1) when namespaces are
// unavailable, and registers cleanup: processes killed by PID, namespaces
// deleted; on failure the tails of every process's stderr are logged.
func NewT(t testing.TB, spec Spec) *Topology {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := Check(ctx); err != nil {
		if os.Getenv(RequireEnv) == "1" {
			t.Fatalf("testnet required (%s=1) but unavailable: %v", RequireEnv, err)
		}
		t.Skipf("skipping network-namespace test: %v", err)
	}
	if err := SweepStale(ctx); err != nil {
		t.Logf("testnet: sweeping stale test topologies: %v", err)
	}
	var topo *Topology
	var err error
	for range 3 { // a random-suffix collision with a live run is unlikely; retry it
		topo, err = Up(ctx, TestPrefix(), spec, Options{LogDir: t.TempDir()})
		if !errors.Is(err, ErrExists) {
			break
		}
	}
	if err != nil {
		t.Fatalf("testnet.Up: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, p := range topo.Procs() {
				t.Logf("--- %s (pid %d) stderr tail:\n%s", p.Name, p.PID, p.StderrTail(4096))
			}
		}
		if err := topo.Close(); err != nil {
			t.Errorf("testnet.Close: %v", err)
		}
	})
	return topo
}
