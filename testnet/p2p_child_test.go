package testnet_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/neuron-tai/meshp2p/p2p"
)

// testNetwork is the swarm name the testnet children use.
const testNetwork = "testnet"

// p2pTestMode: the testnet internet counts as public and its per-IP limits
// are relaxed — test mode only, never a deployment default.
//
// ObservedAddrThreshold stays at libp2p's default on purpose: hole punching
// already uses addresses seen by one observer, while a threshold of 1 makes
// NATed nodes advertise their observed WAN address, so the DCUtR initiator
// first tries a plain direct dial to it, which the router firewall drops:
// every punch then took 5 s longer (and some TCP trials did not finish
// within 10 s).
func p2pTestMode(inet string) (p2p.TestOptions, error) {
	pfx, err := netip.ParsePrefix(inet)
	if err != nil {
		return p2p.TestOptions{}, err
	}
	return p2p.TestOptions{PublicCIDRs: []netip.Prefix{pfx}, RelaxedCIDRs: []netip.Prefix{pfx}}, nil
}

func childLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// p2pRelay runs meshp2p's host as a public bootstrap + relay node.
func p2pRelay(life time.Duration, inet, limits string) error {
	tm, err := p2pTestMode(inet)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "testnet-relay-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cfg := p2p.Config{
		Network: testNetwork, Role: "relay", DataDir: dir,
		ListenAddrs:       []string{"/ip4/0.0.0.0/tcp/4001", "/ip4/0.0.0.0/udp/4001/quic-v1"},
		RelayService:      true,
		ForceReachability: p2p.ReachabilityPublic,
		DHTMode:           p2p.DHTModeServer,
		TestMode:          tm,
		Logger:            childLogger(),
	}
	if limits == "default" { // go-libp2p's defaults: 2 minutes, 128 KiB per direction
		cfg.RelayLimit = &p2p.RelayLimit{Duration: 2 * time.Minute, Data: 128 << 10}
	}
	ctx, cancel := context.WithTimeout(context.Background(), life)
	defer cancel()
	n, err := p2p.New(ctx, cfg)
	if err != nil {
		return err
	}
	defer n.Close()
	emit(map[string]any{"event": "ready", "id": n.ID().String(), "addrs": addrStrings(n.Host()), "impl": "p2p"})
	<-ctx.Done()
	return nil
}

// p2pPeer is meshp2p's host behind a home NAT.
type p2pPeer struct {
	n   *p2p.Node
	dir string // its data dir (identity), removed on Close
}

func (p p2pPeer) Host() host.Host { return p.n.Host() }

func (p p2pPeer) Close() error {
	err := p.n.Close()
	os.RemoveAll(p.dir)
	return err
}

func (p p2pPeer) Direct(id peer.ID) bool { return p.n.ConnStatus(id).Path == p2p.PathDirect }

func (p p2pPeer) Punches(id peer.ID) (int, int, []string) {
	hp := p.n.ConnStatus(id).HolePunch
	var errs []string
	if hp.LastError != "" {
		errs = append(errs, hp.LastError)
	}
	return hp.Successes, hp.Failures, errs
}

func (p p2pPeer) NewStream(ctx context.Context, id peer.ID, proto protocol.ID) (network.Stream, error) {
	return p.n.NewStream(ctx, id, proto)
}

func newP2PPeer(cfg peerConfig) (testPeer, error) {
	tm, err := p2pTestMode(cfg.inet)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "testnet-peer-")
	if err != nil {
		return nil, err
	}
	var listen []string
	switch cfg.transport {
	case "tcp":
		listen = []string{"/ip4/0.0.0.0/tcp/0"}
	case "quic":
		listen = []string{"/ip4/0.0.0.0/udp/0/quic-v1"}
	case "both":
		listen = p2p.DefaultListenAddrs
	default:
		return nil, fmt.Errorf("transport %q", cfg.transport)
	}
	// The relay is passed as a bootstrap peer too, as a real home node
	// would. This used to break hole punching (the DHT dialled bootstrap
	// peers before the host listened, from a random source port);
	// TestP2PBootstrapSourcePort guards the fix.
	var bootstrap []peer.AddrInfo
	if cfg.bootstrap {
		bootstrap = cfg.relays
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := p2p.New(ctx, p2p.Config{
		Network: testNetwork, Role: "home", DataDir: dir,
		ListenAddrs:       listen,
		Bootstrap:         bootstrap,
		StaticRelays:      cfg.relays,
		ForceReachability: p2p.ReachabilityPrivate,
		TestMode:          tm,
		Logger:            childLogger(),
	})
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return p2pPeer{n: n, dir: dir}, nil
}
