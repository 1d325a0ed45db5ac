package testnet_test

import (
	"context"
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

type genJSON struct {
	FirstTokenMs float64 `json:"first_token_ms"`
	Text         string  `json:"text"`
	Tokens       []int32 `json:"tokens"`
	Reroutes     int     `json:"reroutes"`
	Route        []struct {
		Peer       string `json:"peer"`
		Start, End int
	} `json:"route"`
}

// A private swarm (swarm key, no tracker) across home NATs: one public
// node serves layers 0-2 and is everyone's bootstrap peer and relay; two
// home nodes behind different port-preserving NATs serve 2-4 and 4-5; a
// client behind a third NAT, holding no weights, generates through them.
// The seam between the two home nodes must come up direct (hole punched),
// and the text must equal the whole model run locally.
func TestPrivateSwarmAcrossNATs(t *testing.T) {
	c := newCLISwarm(t, "natswarm", testnet.Spec{
		Public: []testnet.Public{{Name: "boot", Roles: []testnet.Role{testnet.RoleBootstrap, testnet.RoleRelay}}},
		Homes: []testnet.Home{
			{Name: "h1", Hosts: []string{"a"}},
			{Name: "h2", Hosts: []string{"b"}},
			{Name: "h3", Hosts: []string{"c"}},
		},
	}, 150*time.Second)
	key := filepath.Join(c.dir, "swarm.key")
	if b, err := exec.Command(c.bin, "key", "swarm-gen", "-o", key).CombinedOutput(); err != nil {
		t.Fatalf("swarm-gen: %v %s", err, b)
	}
	c.common = append(c.common, "--swarm-key", key)
	c.shard("boot", "0-2", "--reachability", "public", "--dht-mode", "server", "--relay-service")
	c.common = append(c.common, "--bootstrap", c.addr("boot"))
	mid := c.shard("a", "2-4", "--reachability", "private", "--dht-mode", "client")
	tail := c.shard("b", "4-5", "--reachability", "private", "--dht-mode", "client")

	want := c.local("24")
	got := c.result(c.generateProc("c", "24"), mid, tail)
	if fmt.Sprint(got.Tokens) != fmt.Sprint(want.Tokens) || len(got.Route) != 3 {
		t.Fatalf("swarm %v (route %+v)\nlocal %v", got.Tokens, got.Route, want.Tokens)
	}
	t.Logf("text through 3 NATed/public hops: %q", got.Text)
	// The seam a (home 1) → b (home 2) crosses two NATs: it must have
	// been hole-punched before the session stream opened.
	seam, err := waitStderr(c.ctx, mid, "seam to next hop open")
	if err != nil || !strings.Contains(seam, "path=direct") {
		t.Fatalf("seam between the home nodes is not direct: %q %v\n%s", seam, err, mid.StderrTail(3000))
	}
	t.Logf("home-to-home seam: %s", seam)
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
	c := newCLISwarm(t, "natkill", testnet.Spec{
		Public: []testnet.Public{{Name: "boot", Roles: []testnet.Role{testnet.RoleBootstrap, testnet.RoleRelay}}},
		Homes: []testnet.Home{
			{Name: "h1", Hosts: []string{"a"}},
			{Name: "h2", Hosts: []string{"b"}},
			{Name: "h3", Hosts: []string{"c"}},
			{Name: "h4", Hosts: []string{"d"}},
		},
	}, 150*time.Second)
	c.shard("boot", "0-2", "--reachability", "public", "--dht-mode", "server", "--relay-service")
	c.common = append(c.common, "--bootstrap", c.addr("boot"))
	home := []string{"--reachability", "private", "--dht-mode", "client"}
	mids := map[string]*testnet.Proc{"a": c.shard("a", "2-4", home...), "d": c.shard("d", "2-4", home...)}
	c.shard("b", "4-5", home...)

	const maxTok = "400"
	want := c.local(maxTok)
	cp := c.generateProc("c", maxTok)
	// Whichever middle gets the session dies by SIGKILL.
	killed := make(chan string, 1)
	var once sync.Once
	for name, p := range mids {
		go func() {
			if _, err := waitStderr(c.ctx, p, "seam to next hop open"); err == nil {
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
	case <-c.ctx.Done():
		t.Fatal("timeout waiting for a session")
	}
	got := c.result(cp)
	if got.Reroutes != 1 || fmt.Sprint(got.Tokens) != fmt.Sprint(want.Tokens) {
		t.Fatalf("after killing %s: reroutes %d\nswarm %v\nlocal %v\n%s", victim, got.Reroutes, got.Tokens, want.Tokens, cp.StderrTail(3000))
	}
	t.Logf("killed middle node %s mid-generation; %d tokens identical to --local after %d reroute", victim, len(got.Tokens), got.Reroutes)
}

// A seam that starts on the relay (--direct-wait 0: no waiting for the hole
// punch) moves to the direct connection once the punch succeeds, in the
// middle of a generation, and the text is unchanged.
func TestSeamMovesToDirectAcrossNATs(t *testing.T) {
	c := newCLISwarm(t, "natmove", testnet.Spec{
		Public: []testnet.Public{{Name: "boot", Roles: []testnet.Role{testnet.RoleBootstrap, testnet.RoleRelay}}},
		Homes: []testnet.Home{
			{Name: "h1", Hosts: []string{"a"}},
			{Name: "h2", Hosts: []string{"b"}},
			{Name: "h3", Hosts: []string{"c"}},
		},
	}, 150*time.Second)
	c.shard("boot", "0-2", "--reachability", "public", "--dht-mode", "server", "--relay-service")
	c.common = append(c.common, "--bootstrap", c.addr("boot"))
	home := []string{"--reachability", "private", "--dht-mode", "client", "--direct-wait", "0"}
	mid := c.shard("a", "2-4", home...)
	tail := c.shard("b", "4-5", home...)
	want := c.local("300")
	got := c.result(c.generateProc("c", "300"), mid, tail)
	if fmt.Sprint(got.Tokens) != fmt.Sprint(want.Tokens) {
		t.Fatalf("swarm %v\nlocal %v", got.Tokens, want.Tokens)
	}
	seam, err := waitStderr(c.ctx, mid, "seam to next hop open")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("seam opened: %s", seam)
	if strings.Contains(seam, "path=direct") {
		t.Skip("the hole punch finished before the seam opened: nothing to move this time")
	}
	moved, err := waitStderr(c.ctx, mid, "seam to next hop moved to the direct connection")
	if err != nil {
		t.Fatalf("seam opened relayed and never moved: %v\n%s", err, mid.StderrTail(3000))
	}
	t.Logf("%s", moved)
}

// Discovery on the shipped presets across NATs, no tracker: three shard
// nodes behind the same home router and a client behind another, started
// with only --bootstrap (home and client presets: 2-minute republish, DHT
// mode auto/client, AutoNAT deciding reachability). The client joins 10 s
// after the nodes came up and must have its first token within 3 s of
// starting; the seams between the LAN peers must be direct (LAN
// addresses), not through the relay.
func TestLANSwarmOnShippedPresets(t *testing.T) {
	c := newCLISwarm(t, "lanswarm", testnet.Spec{
		Public: []testnet.Public{{Name: "boot", Roles: []testnet.Role{testnet.RoleBootstrap, testnet.RoleRelay}}},
		Homes: []testnet.Home{
			{Name: "h1", Hosts: []string{"a", "b", "c"}},
			{Name: "h2", Hosts: []string{"d"}},
		},
	}, 150*time.Second)
	// The public node is a relay and bootstrap peer serving another model,
	// so the route runs through the LAN.
	other := filepath.Join(c.dir, "relaymodel.gguf")
	if b, err := exec.Command(c.bin, "shard", "synth", "--arch", "llama", "--layers", "2", "--embd", "64", "--heads", "4", "--kv-heads", "2", "--ff", "128", "--name", "relaymodel", "-o", other).CombinedOutput(); err != nil {
		t.Fatalf("synth: %v %s", err, b)
	}
	c.start("boot", "start", "--model", other, "--reachability", "public", "--dht-mode", "server", "--relay-service")
	c.common = append(c.common, "--bootstrap", c.addr("boot"))
	procs := map[string]*testnet.Proc{}
	for node, layers := range map[string]string{"a": "0-2", "b": "2-4", "c": "4-5"} {
		procs[node] = c.shard(node, layers) // no reachability or DHT-mode flags: the home preset
	}
	want := c.local("8")
	time.Sleep(10 * time.Second)
	args := []string{"generate", "--model", "stories260K", "--prompt", "Once upon a time", "--max-tokens", "8", "--json",
		"--data-dir", filepath.Join(c.dir, "d"), "--wait", "30s"}
	p, err := c.topo.Start(c.ctx, "d", c.bin, append(args, c.common...)...)
	if err != nil {
		t.Fatal(err)
	}
	got := c.result(p, procs["a"], procs["b"])
	if fmt.Sprint(got.Tokens) != fmt.Sprint(want.Tokens) || len(got.Route) != 3 {
		t.Fatalf("swarm %v (route %+v)\nlocal %v", got.Tokens, got.Route, want.Tokens)
	}
	t.Logf("client behind another NAT: first token %.0f ms after it started (route %+v)", got.FirstTokenMs, got.Route)
	if got.FirstTokenMs <= 0 || got.FirstTokenMs > 3000 {
		t.Fatalf("first token %.0f ms after the client started, want ≤ 3000", got.FirstTokenMs)
	}
	for _, n := range []string{"a", "b"} {
		seam, err := waitStderr(c.ctx, procs[n], "seam to next hop open")
		if err != nil || !strings.Contains(seam, "path=direct") {
			t.Fatalf("LAN seam from %s is not direct: %q %v\n%s", n, seam, err, procs[n].StderrTail(3000))
		}
		t.Logf("LAN seam from %s: %s", n, seam)
	}
}
