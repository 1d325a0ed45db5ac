// Package p2p is meshp2p's network layer: a libp2p host for one swarm plus
// capability discovery. Nothing model-specific lives here: adverts carry
// opaque bodies and the package only moves bytes.
//
// # Host
//
// New builds a host from Config: a persisted Ed25519 identity
// (DataDir/identity.key, 0600), TCP and QUIC (TCP only under a swarm key),
// Noise and TLS, yamux, a resource manager sized for activation streams (see
// limits.go), a connection manager that protects bootstrap peers, static
// relays and route neighbours (Node.Protect), the relay v2 client with static
// relays and a peer source fed from connected peers, DCUtR hole punching,
// AutoNAT, optional UPnP/NAT-PMP (Config.PortMapping, off unless asked), and
// optionally the relay service with raised limits and an ACL.
//
// Nothing dials public infrastructure: there are no default bootstrap peers,
// the DHT uses its own protocol prefix, and gossipsub uses swarm-scoped
// protocol IDs.
//
// # Protocol IDs
//
// Every protocol is scoped by the swarm name ("network"):
//
//	/meshp2p/<network>/kad/1.0.0          Kademlia DHT, WAN half (dht.ProtocolPrefix)
//	/meshp2p/<network>/kad/lan/1.0.0      Kademlia DHT, LAN half (kad-dht's dual DHT)
//	/meshp2p/<network>/meshsub/1.2.0      gossipsub (v1.2 features, no floodsub fallback)
//	/meshp2p/<network>/adverts/1          gossipsub topic carrying adverts
//	/meshp2p/<network>/advert/1.0.0       advert request/response
//	/meshp2p/<network>/advert-sync/1.0.0  pull on connect: a bounded batch of signed adverts
//	/meshp2p/<network>/<name>/<version>   Node.ProtocolID for callers
//
// Relay v2, DCUtR (/libp2p/dcutr), identify, ping and AutoNAT keep their
// standard libp2p protocol IDs: they carry no swarm data, and under a swarm
// key outsiders cannot reach them at all.
//
// # Resource limits
//
// limits.go documents each number. In short: a stream may hold 32 MiB (the
// frame buffer its reader charges; yamux windows count against the peer),
// one protocol with one peer 64 MiB, one peer 256 MiB, one protocol
// 256 MiB; the system base is 512 MiB plus go-libp2p's autoscaling. The
// relay service runs with no per-circuit data/time limit (go-libp2p's
// 128 KiB / 2 min kills activation streams), a 256 KiB copy buffer, 512
// reservations, and RelayACL. With a swarm key (nil ACL: every handshake
// is a member) it allows 64 circuits per peer. Without one it is an open
// relay (relayguard.go): the ACL defaults to Node.RelayMember, and each
// peer may hold 16 circuits, relay 1 GiB per hour (counted by the host's
// bandwidth reporter on hop and stop streams) and keep a circuit 1 hour;
// a peer over its bytes has its circuits reset and is refused until its
// window ends. Config.RelayLimit re-imposes go-libp2p's per-circuit limit;
// clients then see the circuit as Limited.
//
// # Connection status
//
// Node.ConnStatus reports per peer whether the best live connection is
// direct or relayed (a /p2p-circuit remote address: an unlimited meshp2p
// relay does not mark connections Limited, so the address is the only
// reliable signal), and counts hole-punch attempts and outcomes (from the
// DCUtR tracer). Node.SubscribeConn pushes ConnEvents; PathChanged fires when
// a peer's best path moves from relayed to direct. libp2p opens new streams
// on the best connection (unlimited before limited, direct before relayed),
// so Node.NewStream after a PathChanged event lands on the direct
// connection; a long-lived stream opened earlier stays on the relayed
// connection until its owner reopens it, which is what PathChanged is for.
//
// # Discovery
//
// A node publishes one advert: a signed record (libp2p record envelope,
// domain "/meshp2p/<network>/advert") holding its peer id, a sequence number,
// issue and expiry times, lookup keys, its addresses and an opaque body.
// Adverts are gossiped on the adverts topic (StrictSign, a topic validator,
// peer scoring), re-published every Discovery interval, withdrawn with a
// tombstone on Close, and expire on their own when a node dies. Each key is
// also announced as a DHT provider record (LAN and WAN halves), so a node
// can Lookup a key and fetch the holder's advert directly over the advert
// protocol. And when identify completes with a peer, the node pulls the
// signed adverts that peer holds (advertsync.go: bounded, rate-limited, each
// advert verified on its own signature), so a newcomer knows the swarm after
// one round trip instead of one republish interval.
//
// Gossip validation: StrictSign, then the topic validator rejects unsigned,
// badly signed, malformed, oversized, stale (issued more than MaxAge ago,
// more than ClockSkew in the future, or expired) adverts and adverts whose
// signer is not the gossip author; a seq not above the last accepted one
// from that peer is ignored (dropped, no score penalty: honest republishes
// can arrive out of order). Sequence numbers are unix nanoseconds at
// signing, so they keep increasing across restarts. Subscribe channels hold
// 64 events and drop the oldest when the reader falls behind; Adverts is
// always complete.
//
// Lock order: Discovery.mu before connTracker.mu; nothing calls back into
// Discovery while holding connTracker.mu.
//
// # Joining
//
// A JoinToken (jointoken.go) carries what a new member needs, the swarm
// name, the swarm key and bootstrap peers, as one "mp1_" word with a
// checksum; it is a secret and never logged. ProbePeerID (peerprobe.go)
// learns the peer id behind a bare host:port by running the PSK layer and
// a Noise handshake itself (go-libp2p dials only known ids); it refuses to
// run without a swarm key, where the answer could come from anyone on the
// path.
//
// # Test mode
//
// TestOptions changes process-global libp2p settings (which address ranges
// count as public, the observed-address threshold). They exist for loopback
// tests and the netns test network only and must never be set in a
// deployment.
package p2p
