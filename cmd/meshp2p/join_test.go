package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/node"
	"github.com/neuron-tai/meshp2p/p2p"
)

// host:port forms become TCP multiaddrs (IPv4, IPv6, DNS); a TCP
// multiaddr without /p2p is read as host:port; anything else is not.
func TestHostPortForms(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1:14001":    "/ip4/127.0.0.1/tcp/14001",
		"[::1]:4001":         "/ip6/::1/tcp/4001",
		"[::ffff:1.2.3.4]:1": "/ip4/1.2.3.4/tcp/1",
		"node.example:4001":  "/dns/node.example/tcp/4001",
	} {
		a, err := hostPortAddr(in)
		if err != nil || a.String() != want {
			t.Errorf("hostPortAddr(%q) = %v, %v; want %s", in, a, err, want)
		}
	}
	for _, bad := range []string{"127.0.0.1", ":4001", "a:b:c"} {
		if _, err := hostPortAddr(bad); err == nil {
			t.Errorf("hostPortAddr(%q) accepted", bad)
		}
	}
	for in, want := range map[string]string{
		"/ip4/192.0.2.7/tcp/4001":         "192.0.2.7:4001",
		"/ip6/::1/tcp/4001":               "[::1]:4001",
		"/dns4/node.example/tcp/4001":     "node.example:4001",
		"/ip4/192.0.2.7/udp/4001/quic-v1": "",
		"/ip4/192.0.2.7/tcp/4001/p2p/12D3KooWEMZYuRhHGFe1BC7e9kHSsQ4hAixNQohEWCr88xtepLTF": "",
	} {
		if hp, bare := bareTCPAddr(in); hp != want || bare != (want != "") {
			t.Errorf("bareTCPAddr(%q) = %q, %v; want %q", in, hp, bare, want)
		}
	}
}

// joinFlags parses args into a netFlags as a client command would.
func joinFlags(t *testing.T, args ...string) *netFlags {
	t.Helper()
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var nf netFlags
	nf.register(fs, node.PresetClient)
	if err := fs.Parse(append([]string{"--data-dir", t.TempDir()}, args...)); err != nil {
		t.Fatal(err)
	}
	return &nf
}

// --join (inline, @FILE, $MESHP2P_JOIN) sets the network, key and
// bootstrap; --bootstrap adds to it; conflicts and bare host:port
// without a key are usage errors; an explicit --swarm-key turns the
// environment off.
func TestJoinFlagPrecedence(t *testing.T) {
	key, _ := p2p.GenerateSwarmKey()
	psk, _ := p2p.DecodeSwarmKey(key)
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "swarm.key")
	if err := os.WriteFile(keyFile, key, 0o600); err != nil {
		t.Fatal(err)
	}
	tok := testJoinToken(t, psk)
	tokFile := filepath.Join(dir, "tok")
	if err := os.WriteFile(tokFile, []byte(tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	other := "/ip4/192.0.2.8/tcp/4001/p2p/12D3KooWEMZYuRhHGFe1BC7e9kHSsQ4hAixNQohEWCr88xtepLTF"
	t.Setenv(joinEnv, "")
	for _, args := range [][]string{{"--join", tok}, {"--join", "@" + tokFile}, {"--join", tok, "--network", "tnet", "--bootstrap", other}} {
		c, err := joinFlags(t, args...).config(node.PresetClient)
		if err != nil || c.Network != "tnet" || len(c.SwarmKey) == 0 || c.SwarmKeyPath != "" || len(c.Bootstrap) != 1+strings.Count(strings.Join(args, " "), other) {
			t.Fatalf("%q: network %q, key %d bytes, %d bootstrap peers, err %v", args[0:2], c.Network, len(c.SwarmKey), len(c.Bootstrap), err)
		}
	}
	for args, want := range map[string]string{
		"--join " + tok + " --swarm-key " + keyFile: "drop --swarm-key",
		"--join " + tok + " --network other":        `is for --network "tnet"`,
		"--bootstrap 127.0.0.1:1":                   "host:port works in a private swarm only",
		"--bootstrap /ip4/127.0.0.1/tcp/1":          "host:port works in a private swarm only",
		"--join mp1_aaaa":                           "too short",
	} {
		_, err := joinFlags(t, strings.Fields(args)...).config(node.PresetClient)
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), tok[4:30]) {
			t.Errorf("%.40s…: err %v, want a usage error with %q", args, err, want)
		}
	}
	t.Setenv(joinEnv, tok)
	if c, err := joinFlags(t).config(node.PresetClient); err != nil || c.Network != "tnet" || len(c.Bootstrap) != 1 {
		t.Fatalf("$%s: %+v, %v", joinEnv, c.Bootstrap, err)
	}
	c, err := joinFlags(t, "--swarm-key", keyFile, "--bootstrap", other).config(node.PresetClient)
	if err != nil || c.Network != node.DefaultNetwork || c.SwarmKeyPath != keyFile || len(c.Bootstrap) != 1 {
		t.Fatalf("--swarm-key with $%s set: network %q, key file %q, err %v (want the flags, the environment off)", joinEnv, c.Network, c.SwarmKeyPath, err)
	}
	if err := os.Chmod(tokFile, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := joinFlags(t, "--join", "@"+tokFile).config(node.PresetClient); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("a world-readable token file: %v", err)
	}
}

func testJoinToken(t *testing.T, psk []byte) string {
	t.Helper()
	ai, err := peer.AddrInfoFromString("/ip4/192.0.2.7/tcp/4001/p2p/12D3KooWMuZy8VHndkx8r5f43mUF9DpVzcsLqkh2RCEuGvZmjJUP")
	if err != nil {
		t.Fatal(err)
	}
	s, err := p2p.JoinToken{Network: "tnet", SwarmKey: psk, Bootstrap: []peer.AddrInfo{*ai}}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// invite names node.json's direct addresses: loopback only when there is
// nothing else, no relay or link-local ones; --addr replaces them and
// must not name another peer.
func TestInviteAddrs(t *testing.T) {
	const id = "12D3KooWMuZy8VHndkx8r5f43mUF9DpVzcsLqkh2RCEuGvZmjJUP"
	const other = "12D3KooWEMZYuRhHGFe1BC7e9kHSsQ4hAixNQohEWCr88xtepLTF"
	in := &inviteInfo{path: "node.json"}
	in.PeerID = id
	in.Addrs = []string{"/ip4/127.0.0.1/tcp/4001/p2p/" + id, "/ip4/192.168.1.5/tcp/4001/p2p/" + id, "/ip6/fe80::1/tcp/4001/p2p/" + id,
		"/ip4/198.51.100.1/tcp/4001/p2p/" + other + "/p2p-circuit/p2p/" + id}
	for addrs, want := range map[string]string{
		"":                               "/ip4/192.168.1.5/tcp/4001",
		"192.0.2.7:4001":                 "/ip4/192.0.2.7/tcp/4001",
		"/dns/a.example/tcp/1/p2p/" + id: "/dns/a.example/tcp/1",
	} {
		ai, err := inviteAddrs(in, addrs)
		if got := fmt.Sprint(ai.Addrs); err != nil || got != "["+want+"]" || ai.ID.String() != id {
			t.Errorf("--addr %q: %s %v, %v; want [%s]", addrs, ai.ID, got, err, want)
		}
	}
	if _, err := inviteAddrs(in, "/ip4/192.0.2.7/tcp/1/p2p/"+other); err == nil {
		t.Error("--addr naming another peer accepted")
	}
	in.Addrs = in.Addrs[:1]
	if ai, err := inviteAddrs(in, ""); err != nil || fmt.Sprint(ai.Addrs) != "[/ip4/127.0.0.1/tcp/4001]" {
		t.Errorf("loopback only: %v, %v", ai.Addrs, err)
	}
}
