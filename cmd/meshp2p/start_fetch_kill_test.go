package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/internal/testbin"
)

// stagedBytes sums a fetch's staging directory (verified and partial tensors).
func stagedBytes(t *testing.T, dir string) int64 {
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, e := range ents {
		fi, err := e.Info()
		if err == nil && !e.IsDir() {
			n += fi.Size()
		}
	}
	return n
}

// A `meshp2p start --model URL --layers 4-8` process SIGKILLed a third of
// the way through its download resumes when started again: it downloads
// the header and only the bytes it did not have, then serves.
func TestStartFromURLKilledAndResumed(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the CLI")
	}
	t.Parallel() // its processes mostly wait on timers (make test: -parallel = cores)
	bin := testbin.CLI(t)
	dir := t.TempDir()
	model, fp, need := synthFetchModel(t, dir, "kill12", gguf.Range{Start: 4, End: 8})
	srv := countingServer(t, model)
	sent, throttle := &srv.sent, &srv.throttle
	net := []string{"--network", "killtest", "--listen", "/ip4/127.0.0.1/tcp/0"}
	boot, _ := startNode(t, filepath.Join(dir, "a"), append([]string{"--model", model, "--layers", "0-4"}, net...)...)

	dd := filepath.Join(dir, "b")
	args := append([]string{"start", "--model", srv.URL + "/kill12.gguf", "--layers", "4-8", "--bootstrap", boot, "--data-dir", dd}, net...)
	throttle.Store(16 << 10) // ~1.6 MB/s: the download takes about 1.5 s
	cmd := exec.Command(bin, args...)
	logs := &syncBuf{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(60 * time.Second); sent.Load() < 256<<10+need/3; time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("download never reached a third:\n%s", logs.String())
		}
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil { // our own child, by PID
		t.Fatal(err)
	}
	_ = cmd.Wait()
	throttle.Store(0)
	srv.quiesce(t)
	staging := filepath.Join(dd, "shards", fp[:16], "staging")
	have := stagedBytes(t, staging)
	if have == 0 || have >= need {
		t.Fatalf("after SIGKILL %d of %d bytes staged", have, need)
	}

	sent.Store(0)
	cmd = exec.Command(bin, args...)
	logs2 := &syncBuf{}
	cmd.Stdout, cmd.Stderr = logs2, logs2
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}()
	for deadline := time.Now().Add(60 * time.Second); !strings.Contains(logs2.String(), "ready; node info"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) || cmd.ProcessState != nil {
			t.Fatalf("restarted node not ready:\n%s", logs2.String())
		}
	}
	srv.quiesce(t)
	if got := sent.Load(); got != 256<<10+need-have {
		t.Fatalf("restart downloaded %d bytes, want header %d + missing %d (had %d of %d)", got, 256<<10, need-have, have, need)
	}
	if _, err := os.Stat(staging); !os.IsNotExist(err) {
		t.Fatal("staging left behind after the shard was written")
	}
	t.Logf("killed with %d of %d tensor bytes staged; the restart downloaded %d bytes (header %d + %d missing)", have, need, sent.Load(), 256<<10, need-have)
}
