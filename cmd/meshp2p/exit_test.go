package main

import (
	"bytes"
	"errors"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/internal/testbin"
	"github.com/neuron-tai/meshp2p/internal/testmodels"
)

// `meshp2p --version` is the version command.
func TestVersionFlag(t *testing.T) {
	var flag, cmd bytes.Buffer
	if rc := run([]string{"--version"}, &flag, &flag); rc != 0 {
		t.Fatalf("--version: exit %d\n%s", rc, flag.String())
	}
	if rc := run([]string{"version"}, &cmd, &cmd); rc != 0 {
		t.Fatalf("version: exit %d", rc)
	}
	first := func(b bytes.Buffer) string { l, _, _ := strings.Cut(b.String(), "\n"); return l }
	if first(flag) == "" || first(flag) != first(cmd) {
		t.Fatalf("--version printed %q, version %q", first(flag), first(cmd))
	}
}

// Ctrl-C during a generation ends it with exit status 130 and no error
// text (the shell's convention; it used to exit 1 with "context canceled").
func TestInterruptExits130(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the CLI")
	}
	bin := testbin.CLI(t)
	model := testmodels.Path(t, "stories260K.gguf")
	var out, errb syncBuf
	c := exec.Command(bin, "generate", "--local", "--model", model, "--prompt", "Once upon a time", "--max-tokens", "100000")
	c.Stdout, c.Stderr = &out, &errb
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Process.Kill(); _ = c.Wait() }() // ours, by PID
	for deadline := time.Now().Add(60 * time.Second); len(out.String()) < 40; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no text after 60 s\n%s", errb.String())
		}
	}
	if err := c.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	err := c.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitInterrupted {
		t.Fatalf("after SIGINT: %v, want exit status %d\nstderr: %s", err, exitInterrupted, errb.String())
	}
	if strings.Contains(errb.String(), "canceled") || strings.Contains(errb.String(), "meshp2p generate:") {
		t.Fatalf("an interrupted generation printed an error:\n%s", errb.String())
	}
}
