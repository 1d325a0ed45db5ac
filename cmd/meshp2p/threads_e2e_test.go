package main

import (
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/internal/testbin"
	"github.com/neuron-tai/meshp2p/internal/testmodels"
)

var readyThreads = regexp.MustCompile(`shard ready.* threads=(\d+)`)

// threadsOf waits for a node's "shard ready" line and returns its threads.
func threadsOf(t *testing.T, p *cliProc) int {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if m := readyThreads.FindStringSubmatch(p.log.String()); m != nil {
			n, _ := strconv.Atoi(m[1])
			return n
		}
	}
	t.Fatalf("no 'shard ready ... threads=' line:\n%s", p.log.String())
	return 0
}

// Issue 41: nodes started with the default --threads take their share of
// the machine: a CPU kept busy by another program is not theirs, and two
// nodes on one machine split its CPUs (the old default, one thread per
// CPU each, made a 1 ms token take hundreds on a busy 2-core machine).
// Only upper bounds are asserted: other tests' nodes on this machine also
// count. Where the platform has a cpushare.Gate (Unix), a node's pool is
// the CPUs meshp2p may use (not the spinner's), and each decode claims
// from it what the co-located nodes are not computing on at that moment
// (node/cpushare's tests); elsewhere the pool is the static share.
func TestStartSharesTheCPUs(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two nodes")
	}
	ncpu := runtime.NumCPU()
	if ncpu < 2 {
		t.Skip("one CPU: every share is 1")
	}
	bin := testbin.CLI(t)
	model := testmodels.Path(t, "stories260K.gguf")
	spin := exec.Command("sh", "-c", "while :; do :; done")
	if err := spin.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = spin.Process.Signal(syscall.SIGKILL); _ = spin.Wait() }) // ours, by PID
	net := []string{"--network", "threadtest", "--listen", "/ip4/127.0.0.1/tcp/0", "--test-mode"}
	a := startCLI(t, bin, t.TempDir(), append([]string{"--model", model, "--layers", "0-3"}, net...)...)
	na := threadsOf(t, a)
	t.Logf("%d CPUs, one spinning: the first node computes with %d threads", ncpu, na)
	if na > ncpu-1 {
		t.Fatalf("first node: %d threads with one of %d CPUs busy, want at most %d", na, ncpu, ncpu-1)
	}
	b := startCLI(t, bin, t.TempDir(), append([]string{"--model", model, "--layers", "3-5", "--bootstrap", a.addr}, net...)...)
	nb := threadsOf(t, b)
	t.Logf("the second node: %d threads", nb)
	want := max(1, ncpu/2)
	if runtime.GOOS != "windows" {
		want = ncpu - 1
	}
	if nb > want {
		t.Fatalf("second node: %d threads beside another node and a spinning CPU on %d CPUs, want at most %d", nb, ncpu, want)
	}
}
