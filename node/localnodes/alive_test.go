package localnodes

import (
	"os"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/internal/testbin"
)

// childEnv makes the test binary a child: "sleep" waits (until killed, or
// a minute), "exit" ends at once.
const childEnv = "MESHP2P_LOCALNODES_CHILD"

func TestMain(m *testing.M) {
	switch os.Getenv(childEnv) {
	case "sleep":
		time.Sleep(time.Minute)
		os.Exit(0)
	case "exit":
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// Alive tells a live process from one that ended (killed or exited), on
// every platform that can ask (Unix: kill 0; Windows: OpenProcess and
// GetExitCodeProcess, run under wine by make test).
func TestAlive(t *testing.T) {
	if !Alive(os.Getpid()) {
		t.Fatal("this process is not alive")
	}
	live := testbin.Self("-test.run=^$")
	live.Env = append(os.Environ(), childEnv+"=sleep")
	if err := live.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = live.Process.Kill(); _ = live.Wait() }()
	if !Alive(live.Process.Pid) {
		t.Fatal("a sleeping child is not alive")
	}
	exited := testbin.Self("-test.run=^$")
	exited.Env = append(os.Environ(), childEnv+"=exit")
	if err := exited.Run(); err != nil {
		t.Fatal(err)
	}
	if Alive(exited.Process.Pid) {
		t.Fatalf("pid %d, which exited, is alive", exited.Process.Pid)
	}
	_ = live.Process.Kill()
	_ = live.Wait()
	if Alive(live.Process.Pid) {
		t.Fatalf("pid %d, killed, is alive", live.Process.Pid)
	}
}
