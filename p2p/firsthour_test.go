package p2p

import (
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/multiformats/go-multiaddr"
)

// A listen address on a port another socket holds is refused, naming the
// port, whether that socket is a plain one or a libp2p host's (which binds
// with SO_REUSEPORT, so libp2p alone would share the port silently).
func TestListenPortInUse(t *testing.T) {
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := itoa(l.Addr().(*net.TCPAddr).Port)
	err = CheckListenAddrs([]string{"/ip4/127.0.0.1/tcp/0", "/ip4/127.0.0.1/tcp/" + port})
	if !errors.Is(err, ErrPortInUse) || !strings.Contains(err.Error(), "tcp port "+port+" is in use") {
		t.Fatalf("held TCP port: %v", err)
	}
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	uport := itoa(pc.LocalAddr().(*net.UDPAddr).Port)
	if err := CheckListenAddrs([]string{"/ip4/127.0.0.1/udp/" + uport + "/quic-v1"}); !errors.Is(err, ErrPortInUse) || !strings.Contains(err.Error(), "udp port "+uport) {
		t.Fatalf("held UDP port: %v", err)
	}
	if err := CheckListenAddrs([]string{"/ip4/127.0.0.1/tcp/0", "/ip4/127.0.0.1/udp/0/quic-v1", "not a multiaddr"}); err != nil {
		t.Fatalf("port 0: %v", err)
	}

	first := newTestNode(t, func(c *Config) { c.ListenAddrs = []string{"/ip4/127.0.0.1/tcp/0"} })
	taken, err := first.Host().Addrs()[0].ValueForProtocol(multiaddr.P_TCP)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Network: "test", DataDir: t.TempDir(), ListenAddrs: []string{"/ip4/127.0.0.1/tcp/" + taken}, Logger: testLogger()}
	if n, err := New(testCtx(t, 10*time.Second), cfg); !errors.Is(err, ErrPortInUse) {
		if n != nil {
			n.Close()
		}
		t.Fatalf("a second host on the first one's port %s: %v", taken, err)
	}
}

// An endpoint that accepts TCP connections and never answers is "no
// answer from" its address, once (it took a dial timeout), and never a
// swarm key, with or without one.
func TestBootstrapSilentEndpoint(t *testing.T) {
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() }) // after the parallel subtests
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	addr, _ := multiaddr.NewMultiaddr("/ip4/127.0.0.1/tcp/" + itoa(l.Addr().(*net.TCPAddr).Port))
	key, _ := GenerateSwarmKey()
	for _, tc := range []struct {
		name string
		key  []byte
	}{{"open swarm", nil}, {"private swarm", key}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t, 30*time.Second)
			start := time.Now()
			n := newTestNode(t, func(c *Config) {
				c.SwarmKey = tc.key
				c.ListenAddrs = []string{"/ip4/127.0.0.1/tcp/0"}
				c.Bootstrap = []peer.AddrInfo{{ID: randomID(t), Addrs: []multiaddr.Multiaddr{addr}}}
			})
			waitFor(ctx, t, "the silent endpoint to count as unreachable", n.Unreachable)
			err := n.NoPeersError()
			t.Logf("after %v: %v", time.Since(start).Round(time.Millisecond), err)
			if !strings.Contains(err.Error(), "no answer from "+addr.String()) || strings.Contains(err.Error(), "swarm key") {
				t.Fatalf("NoPeersError = %v; want no answer from %s, and no swarm key", err, addr)
			}
		})
	}
}

// randomID is the peer id of a fresh key.
func randomID(t *testing.T) peer.ID {
	t.Helper()
	k, _, err := LoadOrCreateIdentity(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	id, err := peer.IDFromPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// Settle is true only after a second look at each connected peer, and by
// then an advert that reached the peer after the first look is in.
func TestSettleLooksTwice(t *testing.T) {
	const gap = 2 * time.Second
	ctx := testCtx(t, 30*time.Second)
	b := newTestNode(t, shippedDiscovery)
	if err := b.Discovery().SetLocalAdvert([]string{"key-b"}, []byte("body-b")); err != nil {
		t.Fatal(err)
	}
	c := newTestNode(t, func(c *Config) { shippedDiscovery(c); withBootstrap(b)(c) })
	waitFor(ctx, t, "the first look", func() bool { return hasAdvert(c, b.ID(), "body-b") })
	looked := time.Now()
	if c.Discovery().Settle(time.Time{}, gap) {
		t.Fatal("settled after one look")
	}
	h := newTestNode(t, func(c *Config) { shippedDiscovery(c); withBootstrap(b)(c) })
	if err := h.Discovery().SetLocalAdvert([]string{"key-h"}, []byte("body-h")); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, "the bootstrap peer to learn the newcomer", func() bool { return hasAdvert(b, h.ID(), "body-h") })
	if time.Since(looked) >= gap {
		t.Skipf("the newcomer took %v to reach the bootstrap peer: no longer within the gap", time.Since(looked))
	}
	waitFor(ctx, t, "settled", func() bool { return c.Discovery().Settle(time.Time{}, gap) })
	t.Logf("settled %v after the first look", time.Since(looked).Round(time.Millisecond))
	if !hasAdvert(c, h.ID(), "body-h") {
		t.Fatal("settled without the advert that reached the bootstrap peer after the first look")
	}
	if time.Since(looked) < gap {
		t.Fatalf("settled %v after the first look, before the gap %v", time.Since(looked), gap)
	}
	// Asked about a later moment, a settled client looks again first.
	since := time.Now()
	if c.Discovery().Settle(since, gap) {
		t.Fatal("settled as of now without a look since")
	}
	waitFor(ctx, t, "settled again", func() bool { return c.Discovery().Settle(since, gap) })
	if took := time.Since(since); took < gap {
		t.Fatalf("settled %v after the moment asked about, before the gap %v", took, gap)
	}
}
