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
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/testnet"
)

// A tracker on the public segment is the only peer anybody is told about:
// two home nodes behind different NATs (serving layers 0-3 and 3-5, and
// admitting only sessions with a ticket from that tracker) and a client
// behind a third NAT find each other through it, reach each other through
// its relay, and a generation through a tracker-issued route
// (--require-tracker) equals --local.
func TestTrackerAcrossNATs(t *testing.T) {
	model := sharedModel(t, "stories260K.gguf")
	topo := testnet.NewT(t, testnet.Spec{
		Public: []testnet.Public{{Name: "trk", Roles: []testnet.Role{testnet.RoleTracker, testnet.RoleRelay, testnet.RoleBootstrap}}},
		Homes: []testnet.Home{
			{Name: "h1", Hosts: []string{"a"}},
			{Name: "h2", Hosts: []string{"b"}},
			{Name: "h3", Hosts: []string{"c"}},
		},
	})
	bin := buildCLI(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	common := []string{"--network", "nattrk", "--test-mode", "--test-public-cidrs", "203.0.113.0/24", "--port-mapping=false",
		"--listen", "/ip4/0.0.0.0/tcp/4001"}
	ready := func(p *testnet.Proc, name string) {
		if _, err := p.WaitLine(ctx, func(l []byte) bool { return bytes.HasPrefix(l, []byte("ready;")) }); err != nil {
			t.Fatalf("%s did not start: %v\n%s", name, err, p.StderrTail(3000))
		}
	}
	trk, err := topo.Start(ctx, "trk", bin, append([]string{"tracker", "--data-dir", filepath.Join(dir, "trk"), "--reachability", "public",
		"--ping-interval", "2s"}, common...)...)
	if err != nil {
		t.Fatal(err)
	}
	ready(trk, "tracker")
	var info struct {
		PeerID string   `json:"peer_id"`
		Addrs  []string `json:"addrs"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "trk", "node.json"))
	if err != nil || json.Unmarshal(b, &info) != nil || len(info.Addrs) == 0 {
		t.Fatalf("tracker node.json %q: %v", b, err)
	}
	tn, _ := topo.Node("trk")
	trkAddr := fmt.Sprintf("/ip4/%s/tcp/4001/p2p/%s", tn.Addr, info.PeerID)
	start := func(node, layers string) *testnet.Proc {
		p, err := topo.Start(ctx, node, bin, append([]string{"start", "--model", model, "--layers", layers, "--data-dir", filepath.Join(dir, node),
			"--reachability", "private", "--dht-mode", "client", "--tracker", trkAddr, "--require-ticket", "-v"}, common...)...)
		if err != nil {
			t.Fatal(err)
		}
		ready(p, node)
		return p
	}
	head := start("a", "0-3")
	start("b", "3-5")

	local, err := exec.CommandContext(ctx, bin, "generate", "--local", "--model", model, "--prompt", "Once upon a time", "--max-tokens", "24", "--json").Output()
	if err != nil {
		t.Fatalf("local: %v", err)
	}
	cp, err := topo.Start(ctx, "c", bin, append([]string{"generate", "--model", "stories260K", "--prompt", "Once upon a time", "--max-tokens", "24", "--json",
		"--data-dir", filepath.Join(dir, "client"), "--reachability", "private", "--dht-mode", "client", "--wait", "40s",
		"--tracker", trkAddr, "--require-tracker"}, common...)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := cp.Wait(ctx); err != nil {
		t.Fatalf("generate through the tracker: %v\n%s\ntracker:\n%s\nhead:\n%s", err, cp.StderrTail(3000), trk.StderrTail(3000), head.StderrTail(3000))
	}
	var want, got genJSON
	if err := json.Unmarshal(local, &want); err != nil {
		t.Fatal(err)
	}
	out, _ := os.ReadFile(cp.StdoutPath)
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("client output %q: %v", out, err)
	}
	if fmt.Sprint(got.Tokens) != fmt.Sprint(want.Tokens) || len(got.Route) != 2 {
		t.Fatalf("swarm %v (route %+v)\nlocal %v", got.Tokens, got.Route, want.Tokens)
	}
	// The ticket came from the tracker, which saw both home nodes as
	// reachable only through its relay.
	issued, err := waitStderr(ctx, trk, "route ticket issued")
	if err != nil {
		t.Fatalf("tracker issued no ticket: %v\n%s", err, trk.StderrTail(3000))
	}
	if strings.Count(issued, "relayed") != 2 {
		t.Errorf("tracker does not see both home nodes as relay-only: %s", issued)
	}
	t.Logf("tracker: %s", issued)
	if seam, err := waitStderr(ctx, head, "seam to next hop open"); err == nil {
		t.Logf("head's seam: %s", seam)
	}
	t.Logf("text through a tracker-issued route across NATs: %q", got.Text)
}
