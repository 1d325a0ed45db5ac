package node

import (
	"net/netip"
	"time"

	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/p2p"
)

// Role presets. Every default the node uses lives in this file.
const (
	PresetHome   = "home"   // a shard node on a home machine: NAT traversal on, UPnP on
	PresetClient = "client" // an origin without weights: no port mapping, DHT client
	PresetRelay  = "relay"  // a public bootstrap/relay/tracker node: relay service, DHT server
	// PresetTest is the home preset with TestRelax applied, for in-process
	// loopback tests. It shortens nothing and forces nothing that
	// discovery or reachability depend on: tests run what users run.
	PresetTest = "test"
)

// DirectWait is how long a data-plane stream to a peer reached only through
// a relay waits for a hole punch to give a direct connection (punches
// measured 20–220 ms in the NAT testnet; a failed one is remembered).
const DirectWait = 3 * time.Second

// DefaultNetwork is the swarm name when none is given.
const DefaultNetwork = "meshp2p"

// loopbackCIDR is what TestRelax exempts from per-IP limits.
var loopbackCIDR = netip.MustParsePrefix("127.0.0.0/8")

// Preset returns the p2p configuration of a role; callers then set
// DataDir, listen addresses and bootstrap peers. Discovery needs no
// per-role tuning: every preset pulls adverts on connect and runs the
// dual LAN/WAN DHT (p2p.Node.newDHT).
func Preset(role string) p2p.Config {
	c := p2p.Config{Network: DefaultNetwork, Role: role, Version: engine.Version}
	switch role {
	case PresetHome:
		c.PortMapping = true
	case PresetClient:
		c.DHTMode = p2p.DHTModeClient
	case PresetRelay:
		c.RelayService = true
		c.ForceReachability = p2p.ReachabilityPublic
		c.DHTMode = p2p.DHTModeServer
	case PresetTest:
		c = TestRelax(Preset(PresetHome))
		c.Role = PresetTest
		c.ListenAddrs = []string{"/ip4/127.0.0.1/tcp/0"}
	}
	return c
}

// TestRelax applies what only a test network needs, and nothing else:
// no UPnP/NAT-PMP (tests must not touch the LAN's router) and no per-IP
// connection limits for loopback (every test peer shares 127.0.0.1). It is
// what `--test-mode` does; `--test-public-cidrs` adds the netns test
// internet on top.
func TestRelax(c p2p.Config) p2p.Config {
	c.PortMapping = false
	c.TestMode.RelaxedCIDRs = append(c.TestMode.RelaxedCIDRs, loopbackCIDR)
	return c
}

// DefaultEngine is the shard context a node creates unless told otherwise.
func DefaultEngine() engine.Config {
	return engine.Config{NCtx: 4096, NBatch: 512, MaxSessions: 8}
}
