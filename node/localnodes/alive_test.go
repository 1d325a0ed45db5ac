package localnodes

import (
	"os"
	"testing"

	"github.com/neuron-tai/meshp2p/internal/testbin"
)

func TestMain(m *testing.M) { testbin.Main(m) }

// Alive tells a live process from one that ended (killed or exited), on
// every platform that can ask (Unix: kill 0; Windows: OpenProcess and
// GetExitCodeProcess, run under wine by make test).
func TestAlive(t *testing.T) {
	if !Alive(os.Getpid()) {
		t.Fatal("this process is not alive")
	}
	live := testbin.Child("sleep")
	if err := live.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = live.Process.Kill(); _ = live.Wait() }()
	if !Alive(live.Process.Pid) {
		t.Fatal("a sleeping child is not alive")
	}
	exited := testbin.Child("exit")
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
