package p2p

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/client"
	"github.com/multiformats/go-multiaddr"
)

func TestConfigValidation(t *testing.T) {
	base := Config{Network: "n", DataDir: "/tmp/x"}
	tests := []struct {
		name string
		mod  func(*Config)
		ok   bool
	}{
		{"minimal", func(*Config) {}, true},
		{"no network", func(c *Config) { c.Network = "" }, false},
		{"slash in network", func(c *Config) { c.Network = "a/b" }, false},
		{"no data dir", func(c *Config) { c.DataDir = "" }, false},
		{"bad reachability", func(c *Config) { c.ForceReachability = "maybe" }, false},
		{"bad dht mode", func(c *Config) { c.DHTMode = "both" }, false},
		{"server", func(c *Config) { c.DHTMode = DHTModeServer; c.ForceReachability = ReachabilityPublic }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := base
			tt.mod(&c)
			got, err := c.withDefaults()
			if (err == nil) != tt.ok {
				t.Fatalf("withDefaults err = %v, want ok=%v", err, tt.ok)
			}
			if err != nil && !errors.Is(err, ErrConfig) {
				t.Fatalf("error %v does not wrap ErrConfig", err)
			}
			if tt.ok && (len(got.ListenAddrs) != 2 || got.Discovery.AdvertTTL != 3*got.Discovery.RepublishInterval) {
				t.Fatalf("defaults not applied: %+v", got)
			}
		})
	}
}

func TestNodeBasics(t *testing.T) {
	ctx := testCtx(t, 20*time.Second)
	a := newTestNode(t, nil)
	b := newTestNode(t, nil)

	if got, want := a.ProtocolID("act", "1.0.0"), "/meshp2p/test/act/1.0.0"; string(got) != want {
		t.Fatalf("ProtocolID = %s, want %s", got, want)
	}
	for _, addr := range a.Addrs() {
		if id, err := peer.IDFromP2PAddr(addr); err != nil || id != a.ID() {
			t.Fatalf("address %s does not end in /p2p/%s", addr, a.ID())
		}
	}
	if ua, _ := b.Host().Peerstore().Get(a.ID(), "AgentVersion"); ua != nil {
		t.Fatalf("agent known before connecting: %v", ua)
	}

	events := b.SubscribeConn(ctx)
	if err := a.Connect(ctx, b.AddrInfo()); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, "direct status", func() bool { return a.ConnStatus(b.ID()).Path == PathDirect })
	select {
	case ev := <-events:
		if ev.Kind != Connected || ev.Peer != a.ID() || ev.Status.Path != PathDirect {
			t.Fatalf("first conn event = %+v, want Connected/direct from %s", ev, a.ID())
		}
	case <-ctx.Done():
		t.Fatal("no Connected event")
	}
	waitFor(ctx, t, "identify", func() bool {
		ua, _ := b.Host().Peerstore().Get(a.ID(), "AgentVersion")
		return ua == "meshp2p/test/test/0"
	})

	b.Protect(a.ID(), "route")
	if !b.Host().ConnManager().IsProtected(a.ID(), "route") {
		t.Fatal("Protect did not protect the peer")
	}
	b.Unprotect(a.ID(), "route")
	if b.Host().ConnManager().IsProtected(a.ID(), "route") {
		t.Fatal("peer still protected under the tag after Unprotect")
	}

	// The DHT speaks only the swarm's own protocol.
	protos, err := b.Host().Peerstore().GetProtocols(a.ID())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range protos {
		if strings.HasPrefix(string(p), "/ipfs/kad") || strings.HasPrefix(string(p), "/meshsub") {
			t.Fatalf("node speaks public protocol %s", p)
		}
	}

	if err := a.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	waitFor(ctx, t, "disconnect", func() bool { return b.ConnStatus(a.ID()).Path == PathNone })
}

func TestIdentityPersists(t *testing.T) {
	dir := t.TempDir()
	n1 := newTestNode(t, func(c *Config) { c.DataDir = dir })
	id := n1.ID()
	n1.Close()
	n2 := newTestNode(t, func(c *Config) { c.DataDir = dir })
	if n2.ID() != id {
		t.Fatalf("restarted node has id %s, want %s", n2.ID(), id)
	}
}

func TestPrivateSwarm(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	k1, err := GenerateSwarmKey()
	if err != nil {
		t.Fatal(err)
	}
	k2, _ := GenerateSwarmKey()
	member := func(key []byte) func(*Config) {
		return func(c *Config) { c.SwarmKey = key }
	}
	a := newTestNode(t, member(k1))
	b := newTestNode(t, member(k1))
	other := newTestNode(t, member(k2))
	open := newTestNode(t, nil)

	if priv, fp := a.Private(); !priv || len(fp) != 16 {
		t.Fatalf("Private() = %v, %q", priv, fp)
	}
	if priv, _ := open.Private(); priv {
		t.Fatal("node without a key reports a private swarm")
	}
	for _, addr := range a.Addrs() {
		if _, err := addr.ValueForProtocol(multiaddr.P_QUIC_V1); err == nil {
			t.Fatalf("private node listens on QUIC: %s", addr)
		}
	}
	if err := b.Connect(ctx, a.AddrInfo()); err != nil {
		t.Fatalf("same-key member cannot connect: %v", err)
	}
	for name, n := range map[string]*Node{"different key": other, "no key": open} {
		dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		err := n.Connect(dctx, a.AddrInfo())
		cancel()
		if err == nil {
			t.Fatalf("%s: outsider completed a handshake with a private node", name)
		}
		if a.ConnStatus(n.ID()).Path != PathNone {
			t.Fatalf("%s: private node has a connection to an outsider", name)
		}
	}
}

// echoCount reads the whole stream and answers with the byte count.
func echoCount(s network.Stream) {
	defer s.Close()
	n, err := io.Copy(io.Discard, s)
	if err != nil {
		s.Reset()
		return
	}
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(n))
	s.Write(b[:])
}

// sendThrough writes size bytes to p over proto and returns the count p
// acknowledged.
func sendThrough(ctx context.Context, n *Node, p peer.ID, size int) (int64, error) {
	s, err := n.NewStream(ctx, p, "/meshp2p/test/count/1.0.0")
	if err != nil {
		return 0, err
	}
	defer s.Close()
	if dl, ok := ctx.Deadline(); ok {
		s.SetDeadline(dl)
	}
	chunk := bytes.Repeat([]byte{0xA5}, 64<<10)
	for sent := 0; sent < size; sent += len(chunk) {
		if _, err := s.Write(chunk[:min(len(chunk), size-sent)]); err != nil {
			return 0, err
		}
	}
	if err := s.CloseWrite(); err != nil {
		return 0, err
	}
	var b [8]byte
	if _, err := io.ReadFull(s, b[:]); err != nil {
		return 0, err
	}
	return int64(binary.BigEndian.Uint64(b[:])), nil
}

// relayedPair starts a relay configured by relayMod, a listener that reserves
// a slot on it and a dialer connected to the listener through the circuit.
func relayedPair(t *testing.T, ctx context.Context, relayMod func(*Config)) (dialer, listener *Node) {
	t.Helper()
	_, dialer, listener = relayedTrio(t, ctx, relayMod)
	return dialer, listener
}

// relayedTrio is relayedPair that also returns the relay.
func relayedTrio(t *testing.T, ctx context.Context, relayMod func(*Config)) (r, dialer, listener *Node) {
	t.Helper()
	r = newTestNode(t, func(c *Config) {
		c.Role = "relay"
		c.RelayService = true
		c.ForceReachability = ReachabilityPublic
		relayMod(c)
	})
	listener = newTestNode(t, func(c *Config) {
		c.DisableHolePunching = true
		c.ListenAddrs = []string{"/ip4/127.0.0.1/tcp/0"}
	})
	dialer = newTestNode(t, func(c *Config) {
		c.DisableHolePunching = true
		c.ListenAddrs = []string{"/ip4/127.0.0.1/tcp/0"}
	})
	listener.Host().SetStreamHandler("/meshp2p/test/count/1.0.0", echoCount)
	if err := listener.Connect(ctx, r.AddrInfo()); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Reserve(ctx, listener.Host(), r.AddrInfo()); err != nil {
		t.Fatalf("reserving a relay slot: %v", err)
	}
	var relayTCP multiaddr.Multiaddr
	for _, a := range r.Host().Addrs() {
		if _, err := a.ValueForProtocol(multiaddr.P_TCP); err == nil {
			relayTCP = a
		}
	}
	if err := dialer.Connect(ctx, peer.AddrInfo{ID: listener.ID(), Addrs: []multiaddr.Multiaddr{circuitAddr(t, r, relayTCP)}}); err != nil {
		t.Fatalf("connecting through the relay: %v", err)
	}
	return r, dialer, listener
}

// circuitAddr is the circuit address through relay r at its address a.
func circuitAddr(t *testing.T, r *Node, a multiaddr.Multiaddr) multiaddr.Multiaddr {
	t.Helper()
	circuit, err := multiaddr.NewMultiaddr(a.String() + "/p2p/" + r.ID().String() + "/p2p-circuit")
	if err != nil {
		t.Fatal(err)
	}
	return circuit
}

func TestRelayRaisedLimits(t *testing.T) {
	const size = 4 << 20 // 32× go-libp2p's default 128 KiB circuit budget
	ctx := testCtx(t, 30*time.Second)
	a, b := relayedPair(t, ctx, func(*Config) {}) // meshp2p defaults: unlimited
	st := a.ConnStatus(b.ID())
	if st.Path != PathRelayed || st.Limited {
		t.Fatalf("status through unlimited relay = %+v, want relayed, not limited", st)
	}
	got, err := sendThrough(ctx, a, b.ID(), size)
	if err != nil {
		t.Fatalf("sending %d bytes through the relay: %v", size, err)
	}
	if got != size {
		t.Fatalf("listener received %d bytes, want %d", got, size)
	}
	if st := a.ConnStatus(b.ID()); st.Path != PathRelayed {
		t.Fatalf("path after transfer = %v, want relayed", st.Path)
	}
}

func TestRelayDefaultLimitsCut(t *testing.T) {
	const size = 4 << 20
	ctx := testCtx(t, 30*time.Second)
	a, b := relayedPair(t, ctx, func(c *Config) {
		// go-libp2p's relay.DefaultLimit().
		c.RelayLimit = &RelayLimit{Duration: 2 * time.Minute, Data: 128 << 10}
	})
	st := a.ConnStatus(b.ID())
	if st.Path != PathRelayed || !st.Limited {
		t.Fatalf("status through default-limit relay = %+v, want relayed and limited", st)
	}
	got, err := sendThrough(ctx, a, b.ID(), size)
	if err == nil && got == size {
		t.Fatalf("a default-limit relay carried %d bytes; expected the circuit to be cut", got)
	}
	if ctx.Err() != nil {
		t.Fatalf("transfer timed out instead of being cut: %v", err)
	}
	t.Logf("default-limit relay cut the transfer: got %d bytes acknowledged, err %v", got, err)
}

func TestRelayACL(t *testing.T) {
	ctx := testCtx(t, 20*time.Second)
	var member atomic.Value // peer.ID
	member.Store(peer.ID(""))
	r := newTestNode(t, func(c *Config) {
		c.RelayService = true
		c.ForceReachability = ReachabilityPublic
		c.RelayACL = func(p peer.ID) bool { return p == member.Load().(peer.ID) }
	})
	in := newTestNode(t, func(c *Config) { c.DisableHolePunching = true })
	out := newTestNode(t, func(c *Config) { c.DisableHolePunching = true })
	member.Store(in.ID())
	for _, n := range []*Node{in, out} {
		if err := n.Connect(ctx, r.AddrInfo()); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := client.Reserve(ctx, in.Host(), r.AddrInfo()); err != nil {
		t.Fatalf("member could not reserve a slot: %v", err)
	}
	if _, err := client.Reserve(ctx, out.Host(), r.AddrInfo()); err == nil {
		t.Fatal("relay gave a slot to a peer its ACL refuses")
	}
}
