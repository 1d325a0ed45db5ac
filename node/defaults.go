package node

import (
	"net/netip"

	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/p2p"
)

// The node's defaults besides its timings: role presets, the network name,
// the engine shape, sizes and counts. Every duration (and the ratios that
// shape waits) is in timing.go.

// Role presets.
const (
	PresetHome   = "home"   // a shard node on a home machine: NAT traversal on, UPnP on
	PresetClient = "client" // an origin without weights: no port mapping, DHT client
	PresetRelay  = "relay"  // a public bootstrap/relay/tracker node: relay service, DHT server
	// PresetTest is the home preset with TestRelax applied, for in-process
	// loopback tests. It shortens nothing and forces nothing that
	// discovery or reachability depend on: tests run what users run.
	PresetTest = "test"
)

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

// The shard context a node creates unless told otherwise (DefaultEngine;
// start's --ctx, --batch, --max-sessions and --prefix-cache).
const (
	DefaultNCtx        = 4096 // KV cells shared by all sessions
	DefaultNBatch      = 512  // most rows per llama_decode
	DefaultMaxSessions = 8    // concurrent sessions a shard admits
	// DefaultPrefixCache is the KV cells, on top of --ctx, that keep
	// finished sessions' prefixes for the next turn of a conversation
	// (engine/prefixcache.go): half the sessions' cells (start's
	// --prefix-cache: half of --ctx), a few conversations' worth;
	// placement counts them like --ctx's.
	DefaultPrefixCache = DefaultNCtx / 2
)

// DefaultEngine is the shard context a node creates unless told otherwise.
func DefaultEngine() engine.Config {
	return engine.Config{NCtx: DefaultNCtx, NBatch: DefaultNBatch, MaxSessions: DefaultMaxSessions, PrefixCacheCells: DefaultPrefixCache}
}

// Sizes and counts.
const (
	// calibrationRows is how many single-row decodes measure a loaded
	// shard's speed (the advertised speed until live traffic refines it).
	calibrationRows = 8
	// LivenessDials is how many liveness dials a placement check runs at
	// once, and MaxLivenessDials how many one check makes at most.
	LivenessDials    = 8
	MaxLivenessDials = 64
	// maxManifestPeers is how many peers a URL fetch asks for the file's
	// manifest.
	maxManifestPeers = 16
	// rngStream is the second PCG word of placement's generator, mixed
	// with the seed (the golden-ratio constant).
	rngStream = 0x9e3779b97f4a7c15
)
