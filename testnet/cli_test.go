package testnet_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/internal/testbin"
	"github.com/neuron-tai/meshp2p/internal/testmodels"
	"github.com/neuron-tai/meshp2p/testnet"
)

// cliSwarm runs the real meshp2p binary in the nodes of a topology.
type cliSwarm struct {
	t      *testing.T
	ctx    context.Context
	topo   *testnet.Topology
	bin    string
	dir    string
	model  string
	common []string // network flags every process gets
	procs  map[string]*testnet.Proc
}

// newCLISwarm builds the topology and the binary; every process is killed
// when the test ends or after timeout.
func newCLISwarm(t *testing.T, network string, spec testnet.Spec, timeout time.Duration) *cliSwarm {
	t.Helper()
	model := testmodels.Path(t, "stories260K.gguf")
	topo := testnet.NewT(t, spec)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	return &cliSwarm{t: t, ctx: ctx, topo: topo, bin: testbin.CLI(t), dir: t.TempDir(), model: model, procs: map[string]*testnet.Proc{},
		common: []string{"--network", network, "--test-mode", "--test-public-cidrs", "203.0.113.0/24",
			"--port-mapping=false", "--listen", "/ip4/0.0.0.0/tcp/4001"}}
}

// start runs `meshp2p args... <common flags> --data-dir <dir>/<node>` in
// node and waits until it prints "ready;".
func (c *cliSwarm) start(node string, args ...string) *testnet.Proc {
	c.t.Helper()
	args = append(append(args, "--data-dir", filepath.Join(c.dir, node)), c.common...)
	p, err := c.topo.Start(c.ctx, node, c.bin, args...)
	if err != nil {
		c.t.Fatal(err)
	}
	c.procs[node] = p
	c.waitReady(node)
	return p
}

// waitReady waits until the process started in node prints "ready;".
func (c *cliSwarm) waitReady(node string) {
	c.t.Helper()
	p := c.procs[node]
	if p == nil {
		c.t.Fatalf("no process in %s", node)
	}
	if _, err := p.WaitLine(c.ctx, func(l []byte) bool { return bytes.HasPrefix(l, []byte("ready;")) }); err != nil {
		c.t.Fatalf("%s did not start: %v\n%s", node, err, p.StderrTail(3000))
	}
}

// shard starts a shard node serving layers.
func (c *cliSwarm) shard(node, layers string, args ...string) *testnet.Proc {
	c.t.Helper()
	return c.start(node, append([]string{"start", "--model", c.model, "--layers", layers}, args...)...)
}

// addr is the public TCP multiaddr (with /p2p/) of a started public node.
func (c *cliSwarm) addr(node string) string {
	c.t.Helper()
	var info struct {
		PeerID string `json:"peer_id"`
	}
	b, err := os.ReadFile(filepath.Join(c.dir, node, "node.json"))
	if err != nil || json.Unmarshal(b, &info) != nil || info.PeerID == "" {
		c.t.Fatalf("%s node.json %q: %v", node, b, err)
	}
	n, err := c.topo.Node(node)
	if err != nil {
		c.t.Fatal(err)
	}
	return fmt.Sprintf("/ip4/%s/tcp/4001/p2p/%s", n.Addr, info.PeerID)
}

// local runs the whole model in-process (the reference), outside the
// namespaces.
func (c *cliSwarm) local(maxTokens string) genJSON {
	c.t.Helper()
	out, err := exec.CommandContext(c.ctx, c.bin, "generate", "--local", "--model", c.model, "--prompt", "Once upon a time", "--max-tokens", maxTokens, "--json").Output()
	if err != nil {
		c.t.Fatalf("local: %v", err)
	}
	var g genJSON
	if err := json.Unmarshal(out, &g); err != nil {
		c.t.Fatal(err)
	}
	return g
}

// generateProc starts a thin client in node; wait for it with result.
func (c *cliSwarm) generateProc(node, maxTokens string, args ...string) *testnet.Proc {
	c.t.Helper()
	args = append([]string{"generate", "--model", "stories260K", "--prompt", "Once upon a time", "--max-tokens", maxTokens, "--json",
		"--data-dir", filepath.Join(c.dir, node), "--reachability", "private", "--dht-mode", "client", "--wait", "45s"}, append(args, c.common...)...)
	p, err := c.topo.Start(c.ctx, node, c.bin, args...)
	if err != nil {
		c.t.Fatal(err)
	}
	return p
}

// result waits for a client and decodes its JSON output; diag is printed
// on failure.
func (c *cliSwarm) result(p *testnet.Proc, diag ...*testnet.Proc) genJSON {
	c.t.Helper()
	if err := p.Wait(c.ctx); err != nil {
		msg := fmt.Sprintf("generate: %v\n%s", err, p.StderrTail(3000))
		for _, d := range diag {
			msg += fmt.Sprintf("\n--- %s:\n%s", d.Name, d.StderrTail(2000))
		}
		c.t.Fatal(msg)
	}
	out, _ := os.ReadFile(p.StdoutPath)
	var g genJSON
	if err := json.Unmarshal(out, &g); err != nil {
		c.t.Fatalf("client output %q: %v", out, err)
	}
	return g
}
