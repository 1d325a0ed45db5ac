// Package testbin builds the meshp2p CLI for tests that run it as a
// process (the netns scenarios, the churn soak).
package testbin

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
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

// childEnv asks a test binary started by Child to be a child process
// (Main) instead of running its tests.
const childEnv = "MESHP2P_TEST_CHILD"

// Child is a command that runs this test binary as a child process doing
// what: "sleep" (a minute, or until killed), "spin" (a CPU busy for a
// minute) or "exit" (ends at once). The package's TestMain must be Main.
// Tests use it instead of sh, so that they run under wine and qemu too.
func Child(what string) *exec.Cmd {
	c := Self("-test.run=^$")
	c.Env = append(os.Environ(), childEnv+"="+what)
	return c
}

// Main is a TestMain for packages whose tests start Child processes: it
// is that child when the environment says so, and runs the tests
// otherwise.
func Main(m *testing.M) {
	switch os.Getenv(childEnv) {
	case "sleep":
		time.Sleep(time.Minute)
		os.Exit(0)
	case "spin":
		for end := time.Now().Add(time.Minute); time.Now().Before(end); {
		}
		os.Exit(0)
	case "exit":
		os.Exit(0)
	}
	os.Exit(m.Run())
}
