package p2p

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"regexp"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"
)

// Reachability overrides for Config.ForceReachability.
const (
	ReachabilityAuto    = ""        // AutoNAT decides
	ReachabilityPublic  = "public"  // relays, bootstrap nodes, trackers
	ReachabilityPrivate = "private" // nodes known to sit behind NAT
)

// DHT modes for Config.DHTMode.
const (
	DHTModeAuto   = "auto"   // client until AutoNAT (or ForceReachability) says public
	DHTModeServer = "server" // answer DHT queries and store provider records
	DHTModeClient = "client" // query only
)

// Config configures a Node. The zero value is not valid: Network and DataDir
// (or Identity) are required; everything else has a default (see withDefaults).
type Config struct {
	// Network is the swarm name. It scopes every protocol ID
	// (/meshp2p/<network>/...), so two swarms never mix. Letters, digits,
	// '.', '_' and '-' only.
	Network string
	// Role and Version go into the user agent meshp2p/<network>/<role>/<version>.
	Role, Version string

	// DataDir holds identity.key (Ed25519, created with 0600 on first start).
	DataDir string
	// IdentityFile, when set, is the key file used instead of
	// DataDir/identity.key: a name inside DataDir, or an absolute path.
	// Clients keep theirs apart from a node's (ClientIdentityFile), so a
	// client and a node sharing a data dir never share a peer id.
	IdentityFile string

	// ListenAddrs defaults to DefaultListenAddrs (TCP and QUIC on all IPv4
	// interfaces, port 0). Under a swarm key, non-TCP addresses are dropped
	// and the drop is logged.
	ListenAddrs []string
	// AnnounceAddrs, when set, replaces the addresses the host advertises
	// (for a relay or bootstrap node with a known public address).
	AnnounceAddrs []string

	// Bootstrap peers: dialled at start, DHT bootstrap peers, protected in the
	// connection manager, gossipsub direct peers. There are no defaults.
	Bootstrap []peer.AddrInfo
	// StaticRelays are relay v2 servers this node reserves a slot with when it
	// is (or is forced) private. Protected in the connection manager.
	StaticRelays []peer.AddrInfo

	// SwarmKey is a libp2p swarm.key (/key/swarm/psk/1.0.0/ /base16/ <hex>);
	// SwarmKeyPath names a file holding one. Either makes the swarm private
	// (pnet): outsiders cannot complete a handshake, and the host is TCP-only
	// because go-libp2p's QUIC refuses a pre-shared key.
	SwarmKey     []byte
	SwarmKeyPath string

	// RelayService runs the circuit relay v2 service for mesh members, with
	// RelayLimit (nil: no data or time limit per circuit) and RelayResources
	// (zero fields: DefaultRelayResources).
	RelayService   bool
	RelayLimit     *RelayLimit
	RelayResources RelayResources
	// RelayACL decides which peers may reserve a slot or open a circuit
	// through this relay (as source or destination). nil admits every peer
	// that completed a handshake under a swarm key (members only), and
	// Node.RelayMember's members without one.
	RelayACL func(peer.ID) bool
	// MemberAdvert decides whether a peer's advert makes it a member for
	// the open relay's ACL (nil: any advert; node and tracker use
	// route.MemberAdvert).
	MemberAdvert func(Advert) bool
	// RelayBudget bounds each peer's use of an open relay (no swarm key);
	// zero fields take the defaults in relayguard.go.
	RelayBudget RelayBudget

	// ForceReachability is ReachabilityAuto, ReachabilityPublic or
	// ReachabilityPrivate.
	ForceReachability string
	// PortMapping turns on UPnP/NAT-PMP. Off unless set; never in tests.
	PortMapping bool
	// DisableHolePunching turns DCUtR off (it is on by default).
	DisableHolePunching bool

	// DHTMode is DHTModeAuto (default), DHTModeServer or DHTModeClient.
	DHTMode string

	// ConnLow and ConnHigh are the connection manager watermarks
	// (DefaultConnLow, DefaultConnHigh); ConnGrace defaults to
	// DefaultConnGrace.
	ConnLow, ConnHigh int
	ConnGrace         time.Duration

	// Discovery tunes adverts; zero fields take DefaultDiscoveryConfig values.
	Discovery DiscoveryConfig

	// TestMode holds test-only settings. Never set in a deployment.
	TestMode TestOptions

	// Metrics, if set, receives go-libp2p's metrics (resource manager,
	// swarm, identify, AutoNAT, hole punching, relay service; see
	// metrics.go). nil: go-libp2p's metrics are off.
	Metrics prometheus.Registerer

	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// RelayLimit bounds one relayed connection. Any non-nil limit makes clients
// mark circuits "limited" (go-libp2p then refuses streams on them unless the
// opener passes network.WithAllowLimitedConn, and gossipsub ignores them).
type RelayLimit struct {
	Duration time.Duration // per circuit
	Data     int64         // bytes per direction per circuit
}

// RelayResources sizes the relay service. Zero fields take the
// DefaultRelayResources value.
type RelayResources struct {
	MaxReservations      int
	MaxCircuits          int // per peer
	BufferSize           int // copy buffer per direction per circuit
	MaxReservationsPerIP int
	ReservationTTL       time.Duration
}

// DiscoveryConfig tunes advert publication. Zero fields take defaults.
type DiscoveryConfig struct {
	// RepublishInterval is how often the local advert is re-signed (new seq,
	// new issued_at) and gossiped. Default 2 minutes.
	RepublishInterval time.Duration
	// AdvertTTL is how long an advert stays valid after it is issued.
	// Default 3 × RepublishInterval, so two lost rounds do not drop a peer.
	AdvertTTL time.Duration
	// MaxAge rejects adverts issued longer ago than this (stale). Default
	// AdvertTTL.
	MaxAge time.Duration
	// ClockSkew tolerates adverts issued this far in the future. Default 30 s.
	ClockSkew time.Duration
	// ProvideInterval is how often keys are re-announced in the DHT.
	// Default 1 hour (provider records live 48 h in kad-dht).
	ProvideInterval time.Duration
	// MaxBody bounds Advert.Body; MaxKeys and MaxKeyLen bound Advert.Keys.
	// Defaults 16 KiB, 64 and 256 bytes.
	MaxBody, MaxKeys, MaxKeyLen int
	// LivenessGrace is how long after the last connection to a peer with
	// an advert closes discovery waits before dialing it, and
	// LivenessDialTimeout bounds that dial; a failed dial drops the advert
	// (liveness.go). Defaults 1 s and 5 s.
	LivenessGrace, LivenessDialTimeout time.Duration
}

// TestOptions are process-global tweaks for loopback tests and the netns test
// network. Setting any of them changes go-libp2p and go-multiaddr package
// variables for the whole process (there is no per-host option), so only test
// binaries and testnet child processes may use them.
type TestOptions struct {
	// PublicCIDRs are treated as public addresses (removed from
	// manet.Private4/Unroutable4), e.g. 203.0.113.0/24 for the test internet.
	// Hole punching and relay address filters only use public addresses.
	PublicCIDRs []netip.Prefix
	// RelaxedCIDRs lift the resource manager's per-IP connection rate limit
	// and per-subnet connection limits (every host behind one test NAT
	// shares an IP). Also whitelisted from gossipsub IP-colocation scoring.
	RelaxedCIDRs []netip.Prefix
	// ObservedAddrThreshold lowers observedaddrs.ActivationThresh (default 4
	// observers) so small swarms learn their external address. 0: unchanged.
	ObservedAddrThreshold int
}

func (t TestOptions) enabled() bool {
	return len(t.PublicCIDRs) > 0 || len(t.RelaxedCIDRs) > 0 || t.ObservedAddrThreshold > 0
}

// ErrConfig marks an invalid Config.
var ErrConfig = errors.New("invalid p2p config")

var networkNameRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

func (c Config) withDefaults() (Config, error) {
	if !networkNameRE.MatchString(c.Network) {
		return c, fmt.Errorf("%w: network name %q must be 1-64 of [A-Za-z0-9._-]", ErrConfig, c.Network)
	}
	if c.DataDir == "" {
		return c, fmt.Errorf("%w: DataDir is required", ErrConfig)
	}
	if c.Role == "" {
		c.Role = "node"
	}
	if c.Version == "" {
		c.Version = "dev"
	}
	if len(c.ListenAddrs) == 0 {
		c.ListenAddrs = append([]string(nil), DefaultListenAddrs...)
	}
	switch c.ForceReachability {
	case ReachabilityAuto, ReachabilityPublic, ReachabilityPrivate:
	default:
		return c, fmt.Errorf("%w: ForceReachability %q", ErrConfig, c.ForceReachability)
	}
	switch c.DHTMode {
	case "":
		c.DHTMode = DHTModeAuto
	case DHTModeAuto, DHTModeServer, DHTModeClient:
	default:
		return c, fmt.Errorf("%w: DHTMode %q", ErrConfig, c.DHTMode)
	}
	if c.ConnLow <= 0 {
		c.ConnLow = DefaultConnLow
	}
	if c.ConnHigh <= c.ConnLow {
		c.ConnHigh = max(DefaultConnHigh, 2*c.ConnLow)
	}
	if c.ConnGrace <= 0 {
		c.ConnGrace = DefaultConnGrace
	}
	c.Discovery = c.Discovery.withDefaults()
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}

func (d DiscoveryConfig) withDefaults() DiscoveryConfig {
	def := DefaultDiscoveryConfig()
	if d.RepublishInterval <= 0 {
		d.RepublishInterval = def.RepublishInterval
	}
	if d.AdvertTTL <= 0 {
		d.AdvertTTL = 3 * d.RepublishInterval
	}
	if d.MaxAge <= 0 {
		d.MaxAge = d.AdvertTTL
	}
	if d.ClockSkew <= 0 {
		d.ClockSkew = def.ClockSkew
	}
	if d.ProvideInterval <= 0 {
		d.ProvideInterval = def.ProvideInterval
	}
	if d.MaxBody <= 0 {
		d.MaxBody = def.MaxBody
	}
	if d.MaxKeys <= 0 {
		d.MaxKeys = def.MaxKeys
	}
	if d.MaxKeyLen <= 0 {
		d.MaxKeyLen = def.MaxKeyLen
	}
	if d.LivenessGrace <= 0 {
		d.LivenessGrace = def.LivenessGrace
	}
	if d.LivenessDialTimeout <= 0 {
		d.LivenessDialTimeout = def.LivenessDialTimeout
	}
	return d
}
