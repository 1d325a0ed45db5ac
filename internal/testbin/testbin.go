// Package testbin builds the meshp2p CLI for tests that run it as a
// process (the netns scenarios, the churn soak).
package testbin

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// CLI compiles ./cmd/meshp2p of the module into a temporary directory
// (cached builds take seconds) and returns its absolute path, or returns
// $MESHP2P_BIN (a binary built by hand) when it is set.
func CLI(t testing.TB) string {
	t.Helper()
	if b := os.Getenv("MESHP2P_BIN"); b != "" {
		abs, err := filepath.Abs(b)
		if err != nil {
			t.Fatal(err)
		}
		return abs
	}
	out := filepath.Join(t.TempDir(), "meshp2p")
	cmd := exec.Command("go", "build", "-o", out, "github.com/neuron-tai/meshp2p/cmd/meshp2p")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	return out
}

// Self is a command that runs this test binary again with args (a child
// process of the test). Under qemu-user without binfmt_misc, which is how
// the platform tests run ARM64 test binaries (docs/platforms.md), the
// child goes through the emulator that $MESHP2P_TEST_EXEC names.
func Self(args ...string) *exec.Cmd {
	if emu := os.Getenv("MESHP2P_TEST_EXEC"); emu != "" {
		return exec.Command(emu, append([]string{os.Args[0]}, args...)...)
	}
	return exec.Command(os.Args[0], args...)
}
