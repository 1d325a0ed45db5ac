package main

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/internal/testbin"
	"github.com/neuron-tai/meshp2p/node/localnodes"
)

// `meshp2p ps` lists a running `start` (data dir, model, layers, peers)
// and `serve`, and drops a node once it is SIGKILLed.
func TestPS(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	bin := testbin.CLI(t)
	dir := t.TempDir()
	net := []string{"--network", "pstest", "--listen", "/ip4/127.0.0.1/tcp/0"}
	model := "../../models/stories260K.gguf"
	a := startCLI(t, bin, filepath.Join(dir, "a"), append([]string{"--model", model, "--layers", "0-5", "--threads", "1"}, net...)...)
	gw := launch(t, bin, append([]string{"serve", "--api", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "gw"), "--bootstrap", a.addr}, net...)...)
	apiURL(t, gw)
	ps := func() map[int]localnodes.Entry {
		out, err := exec.Command(bin, "ps", "--json").Output()
		if err != nil {
			t.Fatal(err)
		}
		var es []localnodes.Entry
		if err := json.Unmarshal(out, &es); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		m := map[int]localnodes.Entry{}
		for _, e := range es {
			m[e.PID] = e
		}
		return m
	}
	var node, gate localnodes.Entry
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		es := ps()
		node, gate = es[a.cmd.Process.Pid], es[gw.cmd.Process.Pid]
		if node.Peers > 0 && gate.Role == "serve" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ps: node %+v, gateway %+v", node, gate)
		}
	}
	if node.Role != "start" || node.DataDir != filepath.Join(dir, "a") || node.Model != "stories260K" || node.Layers != "0-5" || node.PeerID != a.peerID {
		t.Fatalf("ps lists the node as %+v", node)
	}
	if gate.DataDir != filepath.Join(dir, "gw") {
		t.Fatalf("ps lists the gateway as %+v", gate)
	}
	out, err := exec.Command(bin, "ps").Output()
	if err != nil || !strings.Contains(string(out), filepath.Join(dir, "a")) || !strings.HasPrefix(string(out), "PID") {
		t.Fatalf("ps table: %v\n%s", err, out)
	}
	if err := a.cmd.Process.Kill(); err != nil { // SIGKILL, by PID: no chance to remove its record
		t.Fatal(err)
	}
	_ = a.cmd.Wait() // reaped: a zombie still answers kill(pid, 0)
	if _, ok := ps()[a.cmd.Process.Pid]; ok {
		t.Fatal("ps still lists the killed node")
	}
}
