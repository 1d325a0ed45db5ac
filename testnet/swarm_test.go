package testnet_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/testnet"
)

// buildCLI compiles the CLI for the test (cached builds take seconds), or
// returns $MESHP2P_BIN.
func buildCLI(t *testing.T) string {
	t.Helper()
	if b := os.Getenv("MESHP2P_BIN"); b != "" { // a binary built by hand
		return b
	}
	out := filepath.Join(t.TempDir(), "meshp2p")
	cmd := exec.Command("go", "build", "-o", out, "../cmd/meshp2p")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	return out
}

func sharedModel(t *testing.T, name string) string {
	t.Helper()
	for _, d := range []string{os.Getenv("MESHP2P_MODELS"), "../../shared/models", "../../../shared/models"} {
		if d == "" {
			continue
		}
		if p, err := filepath.Abs(filepath.Join(d, name)); err == nil {
			if _, err := os.Stat(p); err == nil {
				return p
			}
		}
	}
	t.Skipf("test model %s not found (set MESHP2P_MODELS or provide ../shared/models)", name)
	return ""
}

type genJSON struct {
	Text     string  `json:"text"`
	Tokens   []int32 `json:"tokens"`
	Reroutes int     `json:"reroutes"`
	Route    []struct {
		Peer       string `json:"peer"`
		Start, End int
	} `json:"route"`
}

// A private swarm (swarm key, no tracker) across home NATs: one public
// node serves layers 0-2 and is everyone's bootstrap peer and relay; two
// home nodes behind different port-preserving NATs serve 2-4 and 4-5; a
// client behind a fourth NAT, holding no weights, generates through them.
// The seam between the two home nodes must come up direct (hole punched),
// and the text must equal the whole model run locally.
func TestPrivateSwarmAcrossNATs(t *testing.T) {
	model := sharedModel(t, "stories260K.gguf")
	topo := testnet.NewT(t, testnet.Spec{
		Public: []testnet.Public{{Name: "boot", Roles: []testnet.Role{testnet.RoleBootstrap, testnet.RoleRelay}}},
		Homes: []testnet.Home{
			{Name: "h1", Hosts: []string{"a"}},
			{Name: "h2", Hosts: []string{"b"}},
			{Name: "h3", Hosts: []string{"c"}},
		},
	})
	bin := buildCLI(t)
	dir := t.TempDir()
	key := filepath.Join(dir, "swarm.key")
	if b, err := exec.Command(bin, "key", "swarm-gen", "-o", key).CombinedOutput(); err != nil {
		t.Fatalf("swarm-gen: %v %s", err, b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	inet := "203.0.113.0/24"
	common := []string{"--network", "natswarm", "--swarm-key", key, "--test-mode", "--test-public-cidrs", inet,
		"--port-mapping=false", "--listen", "/ip4/0.0.0.0/tcp/4001"}
	startNode := func(node, layers, reach, dht string, extra ...string) *testnet.Proc {
		dd := filepath.Join(dir, node)
		args := append([]string{"start", "--model", model, "--layers", layers, "--data-dir", dd, "--reachability", reach, "--dht-mode", dht}, common...)
		p, err := topo.Start(ctx, node, bin, append(args, extra...)...)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.WaitLine(ctx, func(l []byte) bool { return bytes.HasPrefix(l, []byte("ready;")) }); err != nil {
			t.Fatalf("%s did not start: %v\n%s", node, err, p.StderrTail(30))
		}
		return p
	}
	boot := startNode("boot", "0-2", "public", "server", "--relay-service")
	var info struct {
		PeerID string `json:"peer_id"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "boot", "node.json"))
	if err != nil || json.Unmarshal(b, &info) != nil {
		t.Fatalf("boot node.json: %v", err)
	}
	bn, _ := topo.Node("boot")
	bootAddr := fmt.Sprintf("/ip4/%s/tcp/4001/p2p/%s", bn.Addr, info.PeerID)
	common = append(common, "--bootstrap", bootAddr)
	mid := startNode("a", "2-4", "private", "client")
	tail := startNode("b", "4-5", "private", "client")

	local, err := exec.CommandContext(ctx, bin, "generate", "--local", "--model", model, "--prompt", "Once upon a time", "--max-tokens", "24", "--json").Output()
	if err != nil {
		t.Fatalf("local: %v", err)
	}
	args := append([]string{"generate", "--model", "stories260K", "--prompt", "Once upon a time", "--max-tokens", "24", "--json",
		"--data-dir", filepath.Join(dir, "client"), "--reachability", "private", "--dht-mode", "client", "--wait", "45s"}, common...)
	cp, err := topo.Start(ctx, "c", bin, args...)
	if err != nil {
		t.Fatal(err)
	}
	if err := cp.Wait(ctx); err != nil {
		t.Fatalf("generate through the swarm: %v\n%s\nmid:\n%s\ntail:\n%s", err, cp.StderrTail(40), mid.StderrTail(20), tail.StderrTail(20))
	}
	var want, got genJSON
	if err := json.Unmarshal(local, &want); err != nil {
		t.Fatal(err)
	}
	out, _ := os.ReadFile(cp.StdoutPath)
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("client output %q: %v", out, err)
	}
	if fmt.Sprint(got.Tokens) != fmt.Sprint(want.Tokens) || len(got.Route) != 3 {
		t.Fatalf("swarm %v (route %+v)\nlocal %v", got.Tokens, got.Route, want.Tokens)
	}
	t.Logf("text through 3 NATed/public hops: %q", got.Text)
	// The seam a (home 1) → b (home 2) crosses two NATs: it must have
	// been hole-punched before the session stream opened.
	seam := ""
	for _, l := range strings.Split(mid.StderrTail(200), "\n") {
		if strings.Contains(l, "seam to next hop open") {
			seam = l
		}
	}
	if !strings.Contains(seam, "path=direct") {
		t.Fatalf("seam between the home nodes is not direct: %q\n%s", seam, mid.StderrTail(40))
	}
	t.Logf("home-to-home seam: %s", seam)
	_ = boot
}

// waitStderr polls a process's stderr for a line containing sub.
func waitStderr(ctx context.Context, p *testnet.Proc, sub string) (string, error) {
	for {
		b, _ := os.ReadFile(p.StderrPath)
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, sub) {
				return l, nil
			}
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-p.Done():
			return "", fmt.Errorf("%s exited", p.Name)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// SIGKILL the middle node's process mid-generation: the origin re-routes
// through a spare behind another NAT and the text is unchanged.
func TestKillMiddleProcessAcrossNATs(t *testing.T) {
	model := sharedModel(t, "stories260K.gguf")
	topo := testnet.NewT(t, testnet.Spec{
		Public: []testnet.Public{{Name: "boot", Roles: []testnet.Role{testnet.RoleBootstrap, testnet.RoleRelay}}},
		Homes: []testnet.Home{
			{Name: "h1", Hosts: []string{"a"}},
			{Name: "h2", Hosts: []string{"b"}},
			{Name: "h3", Hosts: []string{"c"}},
			{Name: "h4", Hosts: []string{"d"}},
		},
	})
	bin := buildCLI(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	common := []string{"--network", "natkill", "--test-mode", "--test-public-cidrs", "203.0.113.0/24",
		"--port-mapping=false", "--listen", "/ip4/0.0.0.0/tcp/4001"}
	startNode := func(node, layers, reach, dht string, extra ...string) *testnet.Proc {
		args := append([]string{"start", "--model", model, "--layers", layers, "--data-dir", filepath.Join(dir, node), "--reachability", reach, "--dht-mode", dht}, common...)
		p, err := topo.Start(ctx, node, bin, append(args, extra...)...)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.WaitLine(ctx, func(l []byte) bool { return bytes.HasPrefix(l, []byte("ready;")) }); err != nil {
			t.Fatalf("%s did not start: %v\n%s", node, err, p.StderrTail(2000))
		}
		return p
	}
	startNode("boot", "0-2", "public", "server", "--relay-service")
	var info struct {
		PeerID string `json:"peer_id"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "boot", "node.json"))
	if err != nil || json.Unmarshal(b, &info) != nil {
		t.Fatalf("boot node.json: %v", err)
	}
	bn, _ := topo.Node("boot")
	common = append(common, "--bootstrap", fmt.Sprintf("/ip4/%s/tcp/4001/p2p/%s", bn.Addr, info.PeerID))
	mids := map[string]*testnet.Proc{"a": startNode("a", "2-4", "private", "client"), "d": startNode("d", "2-4", "private", "client")}
	startNode("b", "4-5", "private", "client")

	const maxTok = "400"
	local, err := exec.CommandContext(ctx, bin, "generate", "--local", "--model", model, "--prompt", "Once upon a time", "--max-tokens", maxTok, "--json").Output()
	if err != nil {
		t.Fatalf("local: %v", err)
	}
	args := append([]string{"generate", "--model", "stories260K", "--prompt", "Once upon a time", "--max-tokens", maxTok, "--json",
		"--data-dir", filepath.Join(dir, "client"), "--reachability", "private", "--dht-mode", "client", "--wait", "45s"}, common...)
	cp, err := topo.Start(ctx, "c", bin, args...)
	if err != nil {
		t.Fatal(err)
	}
	// Whichever middle gets the session dies by SIGKILL.
	killed := make(chan string, 1)
	var once sync.Once
	for name, p := range mids {
		go func() {
			if _, err := waitStderr(ctx, p, "seam to next hop open"); err == nil {
				once.Do(func() {
					_ = p.Kill()
					killed <- name
				})
			}
		}()
	}
	var victim string
	select {
	case victim = <-killed:
	case <-cp.Done():
		t.Fatalf("generation ended before any middle node served it:\n%s", cp.StderrTail(3000))
	case <-ctx.Done():
		t.Fatal("timeout waiting for a session")
	}
	if err := cp.Wait(ctx); err != nil {
		t.Fatalf("generate: %v\n%s", err, cp.StderrTail(3000))
	}
	var want, got genJSON
	if err := json.Unmarshal(local, &want); err != nil {
		t.Fatal(err)
	}
	out, _ := os.ReadFile(cp.StdoutPath)
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("client output %q: %v", out, err)
	}
	if got.Reroutes != 1 || fmt.Sprint(got.Tokens) != fmt.Sprint(want.Tokens) {
		t.Fatalf("after killing %s: reroutes %d\nswarm %v\nlocal %v\n%s", victim, got.Reroutes, got.Tokens, want.Tokens, cp.StderrTail(3000))
	}
	t.Logf("killed middle node %s mid-generation; %d tokens identical to --local after %d reroute", victim, len(got.Tokens), got.Reroutes)
}
