package p2p

import "time"

// The p2p package's defaults: what a zero Config field becomes. Limits
// that bound resources or the wire (the resource manager's memory,
// advert and provider-record bounds) stay with what they bound; the open
// relay's per-peer budget is in relayguard.go.

// DefaultListenAddrs is used when Config.ListenAddrs is empty.
var DefaultListenAddrs = []string{"/ip4/0.0.0.0/tcp/0", "/ip4/0.0.0.0/udp/0/quic-v1"}

// Connection manager defaults (Config.ConnLow, ConnHigh, ConnGrace).
const (
	// DefaultConnLow is the low watermark: the connection manager trims
	// down to it.
	DefaultConnLow = 64
	// DefaultConnHigh is the high watermark at which trimming starts (at
	// least twice ConnLow).
	DefaultConnHigh = 128
	// DefaultConnGrace is how long a new connection is safe from
	// trimming.
	DefaultConnGrace = time.Minute
)

// DefaultDiscoveryConfig returns the production advert settings.
func DefaultDiscoveryConfig() DiscoveryConfig {
	return DiscoveryConfig{
		RepublishInterval: 2 * time.Minute,
		AdvertTTL:         6 * time.Minute,
		MaxAge:            6 * time.Minute,
		ClockSkew:         30 * time.Second,
		ProvideInterval:   time.Hour,
		MaxBody:           16 << 10,
		MaxKeys:           64,
		MaxKeyLen:         256,
		// A killed node's advert stops steering routes within about
		// LivenessGrace + one refused dial (liveness.go); a dead host
		// that does not refuse takes up to LivenessDialTimeout more.
		LivenessGrace:       time.Second,
		LivenessDialTimeout: 5 * time.Second,
	}
}

// Relay service defaults. go-libp2p's defaults (128 KiB and 2 minutes per
// circuit, 2 KiB copy buffer, 16 circuits per peer) cut an activation stream
// after a few tokens; a 1 MB transfer through them was reset every
// time. A meshp2p relay carries activations for members only (RelayACL,
// swarm key), so it runs without go-libp2p's per-circuit data or time
// limit; an open relay bounds each peer instead (relayguard.go).
const (
	defaultRelayMaxReservations      = 512
	defaultRelayMaxCircuits          = 64        // per peer: one node can be a relayed hop in many pipelines
	defaultRelayBufferSize           = 256 << 10 // per direction; 2 KiB default makes relaying syscall-bound
	defaultRelayMaxReservationsPerIP = 16        // homes share one public IP (default 8)
	defaultRelayReservationTTL       = time.Hour // go-libp2p default; clients refresh before expiry
)

// DefaultRelayResources returns the relay service sizing used when
// Config.RelayResources fields are zero.
func DefaultRelayResources() RelayResources {
	return RelayResources{
		MaxReservations:      defaultRelayMaxReservations,
		MaxCircuits:          defaultRelayMaxCircuits,
		BufferSize:           defaultRelayBufferSize,
		MaxReservationsPerIP: defaultRelayMaxReservationsPerIP,
		ReservationTTL:       defaultRelayReservationTTL,
	}
}
