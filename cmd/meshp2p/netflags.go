package main

import (
	"flag"
	"fmt"
	"net/netip"
	"strings"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"

	"github.com/neuron-tai/meshp2p/node"
	"github.com/neuron-tai/meshp2p/p2p"
)

// netFlags are the p2p flags shared by start, generate, serve, status
// and tracker.
type netFlags struct {
	network     string
	listen      string
	bootstrap   string
	relays      string
	swarmKey    string
	dataDir     string
	dhtMode     string
	reach       string
	portMapping bool
	relay       bool
	relayMiB    int64
	test        bool
	testPublic  string
	join        string
	fs          *flag.FlagSet // what given looks the flags up in
}

// Defaults of the p2p flags that no package names: the test switches
// (off) and the open relay's per-peer budget (0: p2p's default, 1 GiB/h).
const (
	// notGiven is the default of a string flag whose absence means "the
	// role's, or the package's, default" (named in the flag's usage).
	notGiven            = ""
	defaultTestMode     = false
	defaultRelayPeerMiB = 0
)

func (f *netFlags) register(fs *flag.FlagSet, preset string) {
	f.fs = fs
	fs.StringVar(&f.join, "join", notGiven, joinUsage)
	fs.StringVar(&f.network, "network", node.DefaultNetwork, "swarm name; scopes every protocol ID, so swarms never mix")
	fs.StringVar(&f.listen, "listen", notGiven, "comma-separated listen multiaddrs (default TCP and QUIC on all IPv4 interfaces, random ports)")
	fs.StringVar(&f.bootstrap, "bootstrap", notGiven, "comma-separated bootstrap peers: multiaddrs ending in /p2p/<id>, or host:port with --swarm-key or --join (the peer id is learnt under the swarm key); there are no public defaults")
	fs.StringVar(&f.relays, "relay", notGiven, "comma-separated static relays (multiaddrs with /p2p/<id>); default: the bootstrap peers")
	fs.StringVar(&f.swarmKey, "swarm-key", notGiven, "private swarm key file (libp2p swarm.key; makes the node TCP-only)")
	fs.StringVar(&f.dataDir, "data-dir", defaultDataDir(), "data directory: a node's identity.key, shard cache and node.json (one node per directory: it is locked), a client's client.key and fetched vocabularies")
	fs.StringVar(&f.dhtMode, "dht-mode", notGiven, "DHT mode: auto, server or client (default by role)")
	fs.StringVar(&f.reach, "reachability", notGiven, "force reachability: public or private (default: AutoNAT decides)")
	fs.BoolVar(&f.portMapping, "port-mapping", preset == node.PresetHome, "map a port on the home router with UPnP/NAT-PMP")
	fs.BoolVar(&f.test, "test-mode", defaultTestMode, "TEST ONLY: lift per-IP connection limits for 127.0.0.0/8 and turn UPnP/NAT-PMP off; changes nothing else (intervals, DHT mode and reachability stay as the role's preset)")
	fs.StringVar(&f.testPublic, "test-public-cidrs", notGiven, "TEST ONLY (with --test-mode): treat these CIDRs as public internet and lift per-IP limits for them, e.g. the netns test network's 203.0.113.0/24 (changes go-libp2p's address classification for the whole process)")
	fs.BoolVar(&f.relay, "relay-service", preset == node.PresetRelay, "run a circuit relay v2 for swarm members (raised limits for activation traffic; without --swarm-key: members by advert or protocol, 16 circuits, 1 GiB/h and 1 h per circuit per peer)")
	fs.Int64Var(&f.relayMiB, "relay-peer-mib", defaultRelayPeerMiB, "with --relay-service and no --swarm-key: MiB one peer may relay per hour, as source or destination (0: 1024)")
}

func parseAddrInfos(s string) ([]peer.AddrInfo, error) {
	var out []peer.AddrInfo
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		m, err := multiaddr.NewMultiaddr(part)
		if err != nil {
			return nil, fmt.Errorf("%w: bad multiaddr %q: %v", errUsage, part, err)
		}
		ai, err := peer.AddrInfoFromP2pAddr(m)
		if err != nil {
			return nil, fmt.Errorf("%w: %q must end in /p2p/<peer id>: %v", errUsage, part, err)
		}
		out = append(out, *ai)
	}
	return out, nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// config builds the p2p configuration from a preset and the flags.
func (f *netFlags) config(preset string) (p2p.Config, error) {
	c := node.Preset(preset)
	if f.test {
		c = node.TestRelax(c)
	}
	if f.dataDir == "" {
		return c, fmt.Errorf("%w: --data-dir is required (no home directory found)", errUsage)
	}
	c.DataDir = f.dataDir
	if l := splitList(f.listen); len(l) > 0 {
		c.ListenAddrs = l
	}
	if err := f.applyJoin(&c); err != nil {
		return c, err
	}
	var err error
	c.StaticRelays = c.Bootstrap
	if f.relays != "" {
		if c.StaticRelays, err = parseAddrInfos(f.relays); err != nil {
			return c, err
		}
	}
	if f.dhtMode != "" {
		c.DHTMode = f.dhtMode
	}
	if f.reach != "" {
		c.ForceReachability = f.reach
	}
	// Never UPnP/NAT-PMP in test mode, nor when only loopback is listened
	// on (nothing a router could map).
	c.PortMapping = f.portMapping && !f.test && !loopbackOnly(c.ListenAddrs)
	c.RelayService = f.relay
	if f.relayMiB < 0 || f.relayMiB > 1<<30 {
		return c, fmt.Errorf("%w: --relay-peer-mib must be 0..%d", errUsage, 1<<30)
	}
	c.RelayBudget.Bytes = f.relayMiB << 20
	if f.testPublic != "" {
		if !f.test {
			return c, fmt.Errorf("%w: --test-public-cidrs needs --test-mode", errUsage)
		}
		for _, s := range splitList(f.testPublic) {
			pfx, err := netip.ParsePrefix(s)
			if err != nil {
				return c, fmt.Errorf("%w: --test-public-cidrs: %v", errUsage, err)
			}
			c.TestMode.PublicCIDRs = append(c.TestMode.PublicCIDRs, pfx)
			c.TestMode.RelaxedCIDRs = append(c.TestMode.RelaxedCIDRs, pfx)
		}
	}
	return c, nil
}

// loopbackOnly reports whether every listen address is a loopback one.
func loopbackOnly(addrs []string) bool {
	if len(addrs) == 0 {
		return false
	}
	for _, s := range addrs {
		a, err := multiaddr.NewMultiaddr(s)
		if err != nil || !manet.IsIPLoopback(a) {
			return false
		}
	}
	return true
}
