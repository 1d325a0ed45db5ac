package p2p

import (
	"context"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// testLogger is silent unless MESHP2P_TEST_LOG=1.
func testLogger() *slog.Logger {
	if os.Getenv("MESHP2P_TEST_LOG") == "1" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// fastDiscovery is a discovery config for tests: quick republish, short TTL.
func fastDiscovery() DiscoveryConfig {
	return DiscoveryConfig{RepublishInterval: 300 * time.Millisecond, AdvertTTL: 3 * time.Second}
}

// newTestNode starts a node on loopback (TCP and QUIC, port 0) in a temp
// data dir; mod adjusts the config. The node is closed in cleanup.
func newTestNode(t *testing.T, mod func(*Config)) *Node {
	t.Helper()
	cfg := Config{
		Network:     "test",
		Role:        "test",
		Version:     "0",
		DataDir:     t.TempDir(),
		ListenAddrs: []string{"/ip4/127.0.0.1/tcp/0", "/ip4/127.0.0.1/udp/0/quic-v1"},
		Discovery:   fastDiscovery(),
		Logger:      testLogger(),
	}
	if mod != nil {
		mod(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := New(ctx, cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// bootstrapNode is a public DHT server other test nodes bootstrap from.
func bootstrapNode(t *testing.T, mod func(*Config)) *Node {
	t.Helper()
	return newTestNode(t, func(c *Config) {
		c.Role = "bootstrap"
		c.ForceReachability = ReachabilityPublic
		c.DHTMode = DHTModeServer
		if mod != nil {
			mod(c)
		}
	})
}

func withBootstrap(b *Node) func(*Config) {
	return func(c *Config) { c.Bootstrap = []peer.AddrInfo{b.AddrInfo()} }
}

// waitFor polls cond every 50 ms until it is true or ctx ends.
func waitFor(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-tick.C:
		}
	}
}

func testCtx(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
