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
	PresetTest   = "test"   // loopback tests and the demo: no UPnP, fast adverts
)

// DirectWait is how long a data-plane stream to a peer reached only through
// a relay waits for a hole punch to give a direct connection (punches
// measured 20–220 ms in the NAT testnet; a failed one is remembered).
const DirectWait = 3 * time.Second

// DefaultNetwork is the swarm name when none is given.
const DefaultNetwork = "meshp2p"

// Preset returns the p2p configuration of a role; callers then set
// DataDir, listen addresses and bootstrap peers.
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
		// Loopback peers reach each other directly; without this, AutoNAT
		// can call a node private, autorelay then advertises only relay
		// addresses and sessions run through (and die with) the relay.
		c.ForceReachability = p2p.ReachabilityPublic
		c.DHTMode = p2p.DHTModeServer
		c.ListenAddrs = []string{"/ip4/127.0.0.1/tcp/0"}
		c.Discovery = p2p.DiscoveryConfig{RepublishInterval: 5 * time.Second}
		c.TestMode = p2p.TestOptions{RelaxedCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}
	}
	return c
}

// DefaultEngine is the shard context a node creates unless told otherwise.
func DefaultEngine() engine.Config {
	return engine.Config{NCtx: 4096, NBatch: 512, MaxSessions: 8}
}
