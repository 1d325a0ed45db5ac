package p2p

import (
	"math"
	"net/netip"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/network"
	rcmgr "github.com/libp2p/go-libp2p/p2p/host/resource-manager"
	"github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/relay"
	"github.com/libp2p/go-libp2p/x/rate"
)

// Resource manager sizing. go-libp2p's defaults are built for many small
// IPFS streams; meshp2p streams carry activations (a 2k-token prefill of an
// 8192-wide model is 64 MiB in f32) and yamux grows a stream's receive
// window up to 16 MiB, charging the growth to the peer scope (a span of the
// connection's peer). When such a reservation fails yamux keeps the smaller
// window, so these limits cap throughput, not correctness. Session, seam
// and ring streams also charge their frame payload buffer to the stream
// scope (frame.Reader.ChargeTo): a frame the limits cannot hold is refused.
const (
	// streamMemory: the frame buffer of one stream: a 128-row prefill
	// chunk (session.DefaultChunk) of a 65536-wide f32 model, the widest
	// an advert may claim (default 16 MiB).
	streamMemory = 32 << 20
	// protocolPeerMemory: four full-window streams of one protocol with one
	// peer (e.g. parallel activation streams during prefill); default 16 MiB.
	protocolPeerMemory = 64 << 20
	// peerMemory: all protocols with one peer (default 64 MiB base).
	peerMemory = 256 << 20
	// protocolMemory: one protocol across all peers (default 64 MiB base).
	protocolMemory = 256 << 20
	// systemMemory: base before autoscaling adds 1 GiB per GiB of 1/8 RAM
	// (default base 128 MiB).
	systemMemory = 512 << 20
	// relayServiceMemory: the relay service reserves 2 × BufferSize per
	// circuit, so 256 MiB holds 512 circuits at the 256 KiB buffer
	// (go-libp2p's relay service default is 16 MiB base).
	relayServiceMemory = 256 << 20
)

func (r RelayResources) withDefaults() RelayResources {
	d := DefaultRelayResources()
	if r.MaxReservations <= 0 {
		r.MaxReservations = d.MaxReservations
	}
	if r.MaxCircuits <= 0 {
		r.MaxCircuits = d.MaxCircuits
	}
	if r.BufferSize <= 0 {
		r.BufferSize = d.BufferSize
	}
	if r.MaxReservationsPerIP <= 0 {
		r.MaxReservationsPerIP = d.MaxReservationsPerIP
	}
	if r.ReservationTTL <= 0 {
		r.ReservationTTL = d.ReservationTTL
	}
	return r
}

// relayResources sizes the relay service; an open relay (no swarm key)
// allows fewer circuits per peer unless configured (relayguard.go).
func (c Config) relayResources(open bool) relay.Resources {
	if open && c.RelayResources.MaxCircuits <= 0 {
		c.RelayResources.MaxCircuits = openRelayMaxCircuits
	}
	r := c.RelayResources.withDefaults()
	res := relay.Resources{
		ReservationTTL:        r.ReservationTTL,
		MaxReservations:       r.MaxReservations,
		MaxCircuits:           r.MaxCircuits,
		BufferSize:            r.BufferSize,
		MaxReservationsPerIP:  r.MaxReservationsPerIP,
		MaxReservationsPerASN: 4 * r.MaxReservationsPerIP,
	}
	if len(c.TestMode.RelaxedCIDRs) > 0 {
		// Every testnet home shares its router's IP.
		res.MaxReservationsPerIP = r.MaxReservations
		res.MaxReservationsPerASN = r.MaxReservations
	}
	if c.RelayLimit != nil {
		res.Limit = &relay.RelayLimit{Duration: c.RelayLimit.Duration, Data: c.RelayLimit.Data}
	}
	return res
}

// newResourceManager builds the resource manager described above.
func newResourceManager(cfg Config) (network.ResourceManager, error) {
	limits := rcmgr.DefaultLimits
	libp2p.SetDefaultServiceLimits(&limits)
	limits.SystemBaseLimit.Memory = systemMemory
	limits.PeerBaseLimit.Memory = peerMemory
	limits.ProtocolBaseLimit.Memory = protocolMemory
	limits.ProtocolPeerBaseLimit.Memory = protocolPeerMemory
	limits.StreamBaseLimit.Memory = streamMemory
	limits.AddServiceLimit(relay.ServiceName,
		rcmgr.BaseLimit{StreamsInbound: 1024, StreamsOutbound: 1024, Streams: 1024, Memory: relayServiceMemory},
		rcmgr.BaseLimitIncrease{StreamsInbound: 256, StreamsOutbound: 256, Streams: 256, Memory: 64 << 20},
	)
	var opts []rcmgr.Option
	if relaxed := cfg.TestMode.RelaxedCIDRs; len(relaxed) > 0 {
		opts = append(opts, relaxedConnLimits(relaxed)...)
	}
	return rcmgr.NewResourceManager(rcmgr.NewFixedLimiter(limits.AutoScale()), opts...)
}

// relaxedConnLimits lifts the per-IP connection rate limit and the per-subnet
// concurrent connection limit for the given prefixes (loopback stays
// unlimited as in go-libp2p); everything else keeps go-libp2p's defaults
// (0.2 conn/s with a burst of 16 per IPv4 /32, 8 concurrent per /32).
func relaxedConnLimits(relaxed []netip.Prefix) []rcmgr.Option {
	loop4, loop6 := netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")
	rl := &rate.Limiter{
		NetworkPrefixLimits: []rate.PrefixLimit{{Prefix: loop4}, {Prefix: loop6}},
		SubnetRateLimiter: rate.SubnetLimiter{
			IPv4SubnetLimits: []rate.SubnetLimit{{PrefixLength: 32, Limit: rate.Limit{RPS: 0.2, Burst: 16}}},
			IPv6SubnetLimits: []rate.SubnetLimit{
				{PrefixLength: 56, Limit: rate.Limit{RPS: 0.2, Burst: 16}},
				{PrefixLength: 48, Limit: rate.Limit{RPS: 0.5, Burst: 80}},
			},
			GracePeriod: time.Minute,
		},
	}
	v4 := []rcmgr.NetworkPrefixLimit{{Network: loop4, ConnCount: math.MaxInt}}
	v6 := []rcmgr.NetworkPrefixLimit{{Network: loop6, ConnCount: math.MaxInt}}
	for _, p := range relaxed {
		p = p.Masked()
		rl.NetworkPrefixLimits = append(rl.NetworkPrefixLimits, rate.PrefixLimit{Prefix: p})
		if p.Addr().Is4() {
			v4 = append(v4, rcmgr.NetworkPrefixLimit{Network: p, ConnCount: math.MaxInt})
		} else {
			v6 = append(v6, rcmgr.NetworkPrefixLimit{Network: p, ConnCount: math.MaxInt})
		}
	}
	return []rcmgr.Option{rcmgr.WithConnRateLimiters(rl), rcmgr.WithNetworkPrefixLimit(v4, v6)}
}
