package p2p

import (
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/pnet"
	"github.com/multiformats/go-multiaddr"
)

// A node that cannot join says why, per bootstrap peer, and keeps trying.
func TestBootstrapFailuresAreLoud(t *testing.T) {
	k1, _ := GenerateSwarmKey()
	k2, _ := GenerateSwarmKey()
	keyed := func(k []byte) func(*Config) {
		return func(c *Config) { c.SwarmKey = k; c.ListenAddrs = []string{"/ip4/127.0.0.1/tcp/0"} }
	}
	member := newTestNode(t, keyed(k1))
	openNode := newTestNode(t, nil)
	otherNet := newTestNode(t, func(c *Config) { c.Network = "elsewhere" })

	// A port nothing listens on: listen, note the port, close.
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedPort := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dead, _ := multiaddr.NewMultiaddr("/ip4/127.0.0.1/tcp/" + itoa(closedPort))

	for _, tc := range []struct {
		name string
		mod  func(*Config)
		boot peer.AddrInfo
		want string
	}{
		{"refused", nil, peer.AddrInfo{ID: openNode.ID(), Addrs: []multiaddr.Multiaddr{dead}}, "connection refused"},
		{"different swarm key", keyed(k2), member.AddrInfo(), "different swarm key? (this node's key fingerprint " + SwarmKeyFingerprint(mustPSK(t, k2))},
		{"no swarm key, private peer", nil, member.AddrInfo(), "may run a private swarm"},
		{"other network", nil, otherNet.AddrInfo(), `answers on --network "elsewhere"`},
		{"stale peer id", nil, peer.AddrInfo{ID: member.ID(), Addrs: openNode.AddrInfo().Addrs}, "another peer id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t, 20*time.Second)
			n := newTestNode(t, func(c *Config) {
				if tc.mod != nil {
					tc.mod(c)
				}
				c.Bootstrap = []peer.AddrInfo{tc.boot}
			})
			waitFor(ctx, t, "two definite failures", n.Unreachable)
			err := n.NoPeersError()
			if !errors.Is(err, ErrNoPeers) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("NoPeersError = %v\nwant it to say %q", err, tc.want)
			}
			st := n.BootstrapStatus()
			if len(st) != 1 || st[0].Connected || st[0].Failures < 2 {
				t.Fatalf("status %+v: want 1 peer, not connected, retried", st)
			}
			t.Logf("%s: %v", tc.name, err)
		})
	}
}

// A node started before its bootstrap peer connects soon after the peer
// comes up (backoff starts at a second), and then reports no error.
func TestBootstrapRetriesUntilPeerUp(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	// Reserve a port for the bootstrap peer, start the node first.
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	listen := "/ip4/127.0.0.1/tcp/" + itoa(port)
	dir := t.TempDir()
	id := mustIdentity(t, dir)
	addr, _ := multiaddr.NewMultiaddr(listen)
	n := newTestNode(t, func(c *Config) { c.Bootstrap = []peer.AddrInfo{{ID: id, Addrs: []multiaddr.Multiaddr{addr}}} })
	waitFor(ctx, t, "first failure", func() bool { st := n.BootstrapStatus(); return st[0].Failures > 0 })
	b := newTestNode(t, func(c *Config) { c.DataDir = dir; c.ListenAddrs = []string{listen} })
	start := time.Now()
	waitFor(ctx, t, "connection to the late bootstrap peer", func() bool { return n.ConnStatus(b.ID()).Path == PathDirect })
	t.Logf("connected %v after the bootstrap peer started", time.Since(start).Round(time.Millisecond))
	if err := n.NoPeersError(); err != nil {
		t.Fatal(err)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

func mustPSK(t *testing.T, key []byte) pnet.PSK {
	t.Helper()
	psk, err := DecodeSwarmKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return psk
}

func mustIdentity(t *testing.T, dir string) peer.ID {
	t.Helper()
	key, _, err := LoadOrCreateIdentity(dir)
	if err != nil {
		t.Fatal(err)
	}
	id, err := peer.IDFromPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// A data-plane stream to a peer that came back on the same address moments
// after a failed dial is opened, not refused by the swarm's dial backoff
// (found by the churn soak: a restarted head, the tail's ring open failed).
func TestStreamAfterPeerRestart(t *testing.T) {
	ctx := testCtx(t, 20*time.Second)
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	listen := "/ip4/127.0.0.1/tcp/" + itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	dir := t.TempDir()
	id := mustIdentity(t, dir)
	addr, _ := multiaddr.NewMultiaddr(listen)
	a := newTestNode(t, nil)
	a.Host().Peerstore().AddAddrs(id, []multiaddr.Multiaddr{addr}, time.Hour)
	if err := a.Connect(ctx, peer.AddrInfo{ID: id}); err == nil {
		t.Fatal("dial to a peer that is down succeeded")
	}
	b := newTestNode(t, func(c *Config) { c.DataDir = dir; c.ListenAddrs = []string{listen} })
	b.Host().SetStreamHandler("/meshp2p/test/echo/1.0.0", func(s network.Stream) { s.Close() })
	s, err := a.NewStreamPreferDirect(ctx, b.ID(), 0, "/meshp2p/test/echo/1.0.0")
	if err != nil {
		t.Fatalf("stream to the restarted peer: %v", err)
	}
	s.Close()
}
