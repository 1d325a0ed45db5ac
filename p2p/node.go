package p2p

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p"
	dht "github.com/libp2p/go-libp2p-kad-dht"
	"github.com/libp2p/go-libp2p-kad-dht/dual"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/event"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	"github.com/libp2p/go-libp2p/core/pnet"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/core/routing"
	"github.com/libp2p/go-libp2p/p2p/host/autorelay"
	"github.com/libp2p/go-libp2p/p2p/host/eventbus"
	"github.com/libp2p/go-libp2p/p2p/muxer/yamux"
	"github.com/libp2p/go-libp2p/p2p/net/connmgr"
	"github.com/libp2p/go-libp2p/p2p/net/swarm"
	circuitproto "github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/proto"
	"github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/relay"
	"github.com/libp2p/go-libp2p/p2p/security/noise"
	libp2ptls "github.com/libp2p/go-libp2p/p2p/security/tls"
	libp2pquic "github.com/libp2p/go-libp2p/p2p/transport/quic"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"
	"github.com/multiformats/go-multiaddr"
)

// Protection tags for the connection manager.
const (
	tagBootstrap = "meshp2p-bootstrap"
	tagRelay     = "meshp2p-relay"
)

// Tunables that are variables so tests can shrink them.
var (
	// autorelayBackoff replaces go-libp2p's 1 h backoff after a failed
	// reservation: our relays are few and known, and a relay that was not
	// up yet when we started must be retried soon.
	autorelayBackoff = 30 * time.Second
	// autorelayMinInterval is how often autorelay asks the peer source.
	autorelayMinInterval = 5 * time.Second
)

// maxRelayCandidates bounds how many relay candidates the peer source hands
// autorelay in one call.
const maxRelayCandidates = 8

// Node is a running libp2p host for one swarm plus its discovery service.
type Node struct {
	cfg  Config
	log  *slog.Logger
	host host.Host
	kad  *dual.DHT
	// provStores hold the LAN and WAN DHTs' provider records under quota
	// (providerquota.go).
	provStores [2]*quotaStore
	cm         *connmgr.BasicConnMgr
	relay      *relay.Relay
	tracker    *connTracker
	disc       *Discovery
	boot       *bootState
	pskFP      string // "" when not private
	// guard bounds each peer's use of an open relay (nil: no relay
	// service, or a private swarm); relayACL is the relay's member check
	// (nil: everyone who completed a handshake). relayguard.go.
	guard    *relayGuard
	relayACL func(peer.ID) bool

	ctx    context.Context // lifecycle; cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	closeOnce sync.Once
	closeErr  error
}

// New starts a host and its discovery service. Bootstrap peers are dialled
// in the background (and redialled while disconnected); New does not wait
// for them. ctx bounds start-up only; the node runs until Close.
func New(ctx context.Context, cfg Config) (*Node, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if cfg.TestMode.enabled() {
		applyTestOptions(cfg.TestMode)
		cfg.Logger.Warn("p2p test mode: process-global address and threshold overrides active",
			"public_cidrs", cfg.TestMode.PublicCIDRs, "relaxed_cidrs", cfg.TestMode.RelaxedCIDRs,
			"observed_addr_threshold", cfg.TestMode.ObservedAddrThreshold)
	}
	key, created, err := loadOrCreateIdentityFile(cfg.identityPath())
	if err != nil {
		return nil, err
	}
	log := cfg.Logger.With("logger", "p2p", "network", cfg.Network)
	if created {
		log.Info("created node identity", "file", cfg.identityPath())
	}
	psk, err := cfg.swarmKey()
	if err != nil {
		return nil, err
	}

	n := &Node{cfg: cfg, log: log, tracker: newConnTracker(), boot: newBootState(cfg.Bootstrap),
		provStores: [2]*quotaStore{newQuotaStore(), newQuotaStore()}}
	if psk != nil {
		if cfg, err = n.privateSwarm(cfg, psk); err != nil {
			return nil, err
		}
	}
	n.cfg = cfg
	if err := CheckListenAddrs(cfg.ListenAddrs); err != nil {
		return nil, err
	}
	if err := n.startHost(key, psk); err != nil {
		return nil, err
	}

	d, err := newDiscovery(n)
	if err != nil {
		n.closeHost()
		return nil, err
	}
	n.disc = d

	if cfg.RelayService {
		if err := n.startRelayService(); err != nil {
			n.Close()
			return nil, err
		}
	}
	if err := n.startRelayFinder(); err != nil {
		n.Close()
		return nil, err
	}

	if len(cfg.Bootstrap) > 0 {
		n.wg.Add(1)
		go n.bootstrapLoop()
	}
	log.Info("p2p host started", "peer_id", n.host.ID(), "user_agent", n.userAgent(), "addrs", n.host.Addrs(),
		"private", psk != nil, "swarm_key_fingerprint", n.pskFP, "dht_mode", cfg.DHTMode,
		"reachability", cfg.ForceReachability, "port_mapping", cfg.PortMapping,
		"bootstrap", len(cfg.Bootstrap), "static_relays", len(cfg.StaticRelays))
	return n, nil
}

// swarmKey is the pre-shared key of a private swarm, from SwarmKey or
// SwarmKeyPath (nil: a public swarm).
func (c Config) swarmKey() (pnet.PSK, error) {
	switch {
	case len(c.SwarmKey) > 0 && c.SwarmKeyPath != "":
		return nil, fmt.Errorf("%w: set SwarmKey or SwarmKeyPath, not both", ErrConfig)
	case len(c.SwarmKey) > 0:
		return DecodeSwarmKey(c.SwarmKey)
	case c.SwarmKeyPath != "":
		return ReadSwarmKey(c.SwarmKeyPath)
	}
	return nil, nil
}

// privateSwarm records psk's fingerprint and returns cfg listening on its
// TCP addresses only (go-libp2p has no QUIC with a PSK), or an error when
// none is left.
func (n *Node) privateSwarm(cfg Config, psk pnet.PSK) (Config, error) {
	n.pskFP = SwarmKeyFingerprint(psk)
	kept, dropped := tcpOnly(cfg.ListenAddrs)
	if len(kept) == 0 {
		return cfg, fmt.Errorf("%w: a private swarm (swarm key) is TCP-only and no TCP listen address is configured (got %v)", ErrConfig, cfg.ListenAddrs)
	}
	// A warning only when a QUIC address was asked for: the default
	// listen addresses' QUIC is dropped on every private client and node,
	// which nobody needs to be warned of (issue 41: "a QUIC warning on
	// every client run"); the swarm key's fingerprint is also in "p2p host
	// started".
	level := slog.LevelInfo
	if len(dropped) > 0 && !slices.Equal(cfg.ListenAddrs, DefaultListenAddrs) {
		level = slog.LevelWarn
	}
	cfg.ListenAddrs = kept
	n.log.Log(context.Background(), level, "private swarm: pre-shared key active; QUIC is disabled (go-libp2p does not support QUIC with a PSK), TCP only",
		"swarm_key_fingerprint", n.pskFP, "dropped_listen_addrs", dropped)
	return cfg, nil
}

// startHost creates the connection and resource managers, the open
// relay's guard, and the libp2p host (n.cfg is final), then has the
// connection tracker watch its network and protects bootstrap peers and
// static relays. On error nothing is left running.
func (n *Node) startHost(key crypto.PrivKey, psk pnet.PSK) error {
	cfg := n.cfg
	cm, err := connmgr.NewConnManager(cfg.ConnLow, cfg.ConnHigh, connmgr.WithGracePeriod(cfg.ConnGrace))
	if err != nil {
		return fmt.Errorf("creating connection manager: %w", err)
	}
	n.cm = cm
	rm, err := newResourceManager(cfg)
	if err != nil {
		return fmt.Errorf("creating resource manager: %w", err)
	}

	n.relayACL = cfg.RelayACL
	if cfg.RelayService && psk == nil {
		// An open relay: members only, and bounded per peer.
		n.guard = newRelayGuard(cfg.RelayBudget)
		if n.relayACL == nil {
			n.relayACL = n.RelayMember
		}
	}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	opts, err := n.hostOptions(key, psk, rm)
	if err != nil {
		n.cancel()
		rm.Close()
		return err
	}
	h, err := libp2p.New(opts...)
	if err != nil {
		n.cancel()
		if n.kad != nil {
			n.kad.Close()
		}
		return fmt.Errorf("creating libp2p host: %w", err)
	}
	n.host = h
	netw := h.Network()
	n.tracker.mu.Lock()
	n.tracker.net = func() network.Network { return netw }
	n.tracker.mu.Unlock()
	netw.Notify(n.tracker.notifiee())

	for _, ai := range cfg.Bootstrap {
		h.Peerstore().AddAddrs(ai.ID, ai.Addrs, peerstore.PermanentAddrTTL)
		cm.Protect(ai.ID, tagBootstrap)
	}
	for _, ai := range cfg.StaticRelays {
		h.Peerstore().AddAddrs(ai.ID, ai.Addrs, peerstore.PermanentAddrTTL)
		cm.Protect(ai.ID, tagRelay)
	}
	return nil
}

// startRelayService starts the circuit relay service (cfg.RelayService)
// with its resources, ACL and, on an open relay, the guard's loop. The
// caller closes n on error.
func (n *Node) startRelayService() error {
	cfg := n.cfg
	res := cfg.relayResources(n.guard != nil)
	r, err := relay.New(n.host, append(relayMetrics(cfg.Metrics), relay.WithResources(res), relay.WithACL(relayACL{n.relayAllow}))...)
	if err != nil {
		return fmt.Errorf("starting relay service: %w", err)
	}
	n.relay = r
	lim := "unlimited"
	if cfg.RelayLimit != nil {
		lim = fmt.Sprintf("%v / %d bytes per direction", cfg.RelayLimit.Duration, cfg.RelayLimit.Data)
	}
	attrs := []any{"limit", lim, "buffer", res.BufferSize, "max_circuits_per_peer", res.MaxCircuits,
		"max_reservations", res.MaxReservations, "acl", n.relayACL != nil}
	if g := n.guard; g != nil {
		attrs = append(attrs, "peer_bytes_per_window", g.budget.Bytes, "window", g.budget.Window, "max_circuit_duration", g.budget.CircuitDuration)
		n.wg.Add(1)
		go n.runRelayGuard()
	}
	n.log.Info("relay service on", attrs...)
	return nil
}

func (n *Node) userAgent() string {
	return fmt.Sprintf("meshp2p/%s/%s/%s", n.cfg.Network, n.cfg.Role, n.cfg.Version)
}

// tcpOnly splits listen addresses into TCP ones and the rest.
func tcpOnly(addrs []string) (kept, dropped []string) {
	for _, s := range addrs {
		a, err := multiaddr.NewMultiaddr(s)
		if err == nil {
			if _, err := a.ValueForProtocol(multiaddr.P_TCP); err == nil && !strings.Contains(s, "/ws") {
				kept = append(kept, s)
				continue
			}
		}
		dropped = append(dropped, s)
	}
	return kept, dropped
}

func (n *Node) hostOptions(key crypto.PrivKey, psk pnet.PSK, rm network.ResourceManager) ([]libp2p.Option, error) {
	cfg := n.cfg
	opts := []libp2p.Option{
		libp2p.Identity(key),
		libp2p.UserAgent(n.userAgent()),
		libp2p.ListenAddrStrings(cfg.ListenAddrs...),
		libp2p.Security(noise.ID, noise.New),
		libp2p.Security(libp2ptls.ID, libp2ptls.New),
		libp2p.Muxer(yamux.ID, yamux.DefaultTransport),
		libp2p.Transport(tcp.NewTCPTransport),
		libp2p.ResourceManager(rm),
		libp2p.ConnectionManager(n.cm),
		metricsOption(cfg.Metrics),
		libp2p.EnableRelay(),
		libp2p.EnableAutoRelayWithPeerSource(n.relayPeerSource,
			autorelay.WithMinCandidates(1),
			autorelay.WithMaxCandidates(maxRelayCandidates),
			autorelay.WithNumRelays(max(1, min(2, len(cfg.StaticRelays)))),
			autorelay.WithBootDelay(0),
			autorelay.WithBackoff(autorelayBackoff),
			autorelay.WithMinInterval(autorelayMinInterval),
		),
		libp2p.EnableNATService(),
		libp2p.EnableAutoNATv2(),
		libp2p.Routing(func(h host.Host) (routing.PeerRouting, error) {
			kad, err := n.newDHT(h)
			n.kad = kad
			return kad, err
		}),
	}
	if n.guard != nil {
		opts = append(opts, libp2p.BandwidthReporter(relayMeter{n.guard}))
	}
	if psk != nil {
		opts = append(opts, libp2p.PrivateNetwork(psk))
	} else {
		opts = append(opts, libp2p.Transport(libp2pquic.NewTransport))
	}
	if !cfg.DisableHolePunching {
		opts = append(opts, libp2p.EnableHolePunching(holePunchTracer(cfg.Metrics, n.tracker)))
	}
	switch cfg.ForceReachability {
	case ReachabilityPublic:
		opts = append(opts, libp2p.ForceReachabilityPublic())
	case ReachabilityPrivate:
		opts = append(opts, libp2p.ForceReachabilityPrivate())
	}
	if cfg.PortMapping {
		opts = append(opts, libp2p.NATPortMap())
	}
	if len(cfg.AnnounceAddrs) > 0 {
		announce := make([]multiaddr.Multiaddr, 0, len(cfg.AnnounceAddrs))
		for _, s := range cfg.AnnounceAddrs {
			a, err := multiaddr.NewMultiaddr(s)
			if err != nil {
				return nil, fmt.Errorf("%w: announce address %q: %v", ErrConfig, s, err)
			}
			announce = append(announce, a)
		}
		opts = append(opts, libp2p.AddrsFactory(func(in []multiaddr.Multiaddr) []multiaddr.Multiaddr {
			out := append([]multiaddr.Multiaddr(nil), announce...)
			for _, a := range in {
				if isRelayed(a) {
					out = append(out, a)
				}
			}
			return out
		}))
	}
	return opts, nil
}

// newDHT builds the swarm's own dual Kademlia DHT, as kubo runs it: a WAN
// DHT (/meshp2p/<network>/kad/1.0.0) among peers with public addresses,
// whose mode follows Config.DHTMode (auto: AutoNAT decides, so nodes behind
// NAT stay clients), and a LAN DHT (/meshp2p/<network>/kad/lan/1.0.0) among
// peers reached over private addresses, in which every node that is not a
// pure client is a server. So peers on one LAN, or one host, find each
// other's provider records even though AutoNAT never calls a private or
// loopback address public. It learns peers only from connections
// (bootstrapLoop dials the explicit bootstrap peers), never public ones.
func (n *Node) newDHT(h host.Host) (*dual.DHT, error) {
	mode := dht.ModeAuto
	switch n.cfg.DHTMode {
	case DHTModeServer:
		mode = dht.ModeServer
	case DHTModeClient:
		mode = dht.ModeClient
	}
	kad, err := dual.New(h,
		dual.DHTOption(
			dht.ProtocolPrefix(protocol.ID("/meshp2p/"+n.cfg.Network)),
			dht.Mode(mode),
			// No dht.BootstrapPeers: the DHT would dial them from inside
			// libp2p.New, before the host listens, so those connections
			// leave from a random source port and relays' observations of
			// our public address are ignored: hole punching then never
			// starts (found in the netns testnet, 4 of 6 runs).
			// bootstrapLoop dials the same peers once the host listens and
			// bootstraps the DHT then.
			dht.DisableValues(),
		),
		// kubo's LAN DHT drops loopback addresses from what it hands out;
		// a swarm on one host (the demo, a first try) has only those.
		dual.LanDHTOption(dht.AddressFilter(nil), dht.Datastore(n.provStores[0])),
		dual.WanDHTOption(dht.Datastore(n.provStores[1])),
	)
	if err != nil {
		return nil, fmt.Errorf("creating DHT: %w", err)
	}
	return kad, nil
}

// startRelayFinder makes a node whose reachability AutoNAT has not decided
// yet reserve relay slots at once. go-libp2p's autorelay starts its relay
// finder on an EvtLocalReachabilityChanged event saying private or unknown,
// but AutoNAT (v1) emits nothing until it has probed an address, and it
// only probes addresses that enough peers observed (four): in a small swarm
// behind a home NAT that never happens, the node never reserves a slot, and
// its adverts carry only LAN addresses no outsider can dial (found with the
// netns testnet on the shipped home preset). So we announce "unknown" once
// at start; AutoNAT's own verdicts follow (public stops the finder again).
// Forced reachability needs none of this: go-libp2p emits it itself.
func (n *Node) startRelayFinder() error {
	if n.cfg.ForceReachability != ReachabilityAuto {
		return nil
	}
	em, err := n.host.EventBus().Emitter(new(event.EvtLocalReachabilityChanged), eventbus.Stateful)
	if err != nil {
		return fmt.Errorf("reachability emitter: %w", err)
	}
	defer em.Close()
	if err := em.Emit(event.EvtLocalReachabilityChanged{Reachability: network.ReachabilityUnknown}); err != nil {
		return fmt.Errorf("announcing unknown reachability: %w", err)
	}
	return nil
}

// relayPeerSource feeds autorelay: static relays first, then connected peers
// that speak the relay v2 hop protocol.
func (n *Node) relayPeerSource(ctx context.Context, num int) <-chan peer.AddrInfo {
	num = min(num, maxRelayCandidates)
	out := make(chan peer.AddrInfo, max(num, 0))
	defer close(out)
	seen := make(map[peer.ID]bool)
	for _, ai := range n.cfg.StaticRelays {
		if len(out) >= num {
			return out
		}
		seen[ai.ID] = true
		out <- ai
	}
	h := n.hostOrNil()
	if h == nil {
		return out
	}
	for _, p := range h.Network().Peers() {
		if len(out) >= num {
			break
		}
		if seen[p] || p == h.ID() {
			continue
		}
		if ok, _ := h.Peerstore().SupportsProtocols(p, circuitproto.ProtoIDv2Hop); len(ok) == 0 {
			continue
		}
		seen[p] = true
		out <- peer.AddrInfo{ID: p, Addrs: h.Peerstore().Addrs(p)}
	}
	return out
}

func (n *Node) hostOrNil() host.Host {
	n.tracker.mu.Lock()
	defer n.tracker.mu.Unlock()
	if n.tracker.net == nil {
		return nil
	}
	return n.host
}

// relayACL adapts the relay's admission (Node.relayAllow) to go-libp2p's
// relay.ACLFilter.
type relayACL struct{ allow func(peer.ID) bool }

func (a relayACL) AllowReserve(p peer.ID, _ multiaddr.Multiaddr) bool {
	return a.allow(p)
}

func (a relayACL) AllowConnect(src peer.ID, _ multiaddr.Multiaddr, dst peer.ID) bool {
	return a.allow(src) && a.allow(dst)
}

// ID is the node's peer id.
func (n *Node) ID() peer.ID { return n.host.ID() }

// Host is the underlying libp2p host (for stream handlers).
func (n *Node) Host() host.Host { return n.host }

// Network is the swarm name.
func (n *Node) Network() string { return n.cfg.Network }

// Addrs are the host's advertised addresses, each ending in /p2p/<id>.
func (n *Node) Addrs() []multiaddr.Multiaddr {
	out, err := peer.AddrInfoToP2pAddrs(&peer.AddrInfo{ID: n.host.ID(), Addrs: n.host.Addrs()})
	if err != nil {
		return nil
	}
	return out
}

// AddrInfo is the node's id and advertised addresses (without /p2p/).
func (n *Node) AddrInfo() peer.AddrInfo {
	return peer.AddrInfo{ID: n.host.ID(), Addrs: n.host.Addrs()}
}

// ProtocolID returns "/meshp2p/<network>/<name>/<version>".
func (n *Node) ProtocolID(name, version string) protocol.ID {
	return ProtocolID(n.cfg.Network, name, version)
}

// ProtocolID returns "/meshp2p/<network>/<name>/<version>".
func ProtocolID(network, name, version string) protocol.ID {
	return protocol.ID("/meshp2p/" + network + "/" + name + "/" + version)
}

// Connect dials a peer (its addresses are added to the peerstore first).
func (n *Node) Connect(ctx context.Context, ai peer.AddrInfo) error {
	if err := n.host.Connect(ctx, ai); err != nil {
		return fmt.Errorf("connecting to %s: %w", ai.ID, err)
	}
	return nil
}

// NewStream opens a stream to p on the best connection: libp2p prefers an
// unlimited connection to a limited one and a direct connection to a relayed
// one, so after a hole punch new streams use the direct connection. Limited
// relayed connections are allowed (control-plane use); callers that must
// wait for a direct connection use Host().NewStream without
// network.WithAllowLimitedConn.
func (n *Node) NewStream(ctx context.Context, p peer.ID, pids ...protocol.ID) (network.Stream, error) {
	s, err := n.host.NewStream(network.WithAllowLimitedConn(ctx, "meshp2p"), p, pids...)
	if err != nil {
		return nil, fmt.Errorf("opening %v stream to %s: %w", pids, p, err)
	}
	return s, nil
}

// ConnStatus reports how p is reached now and its hole-punch counts.
func (n *Node) ConnStatus(p peer.ID) ConnStatus { return n.tracker.status(p) }

// SubscribeConn delivers connectivity events until ctx ends or the node
// closes, then closes the channel. The channel holds connSubBuffer (64) events; a slow reader loses
// the oldest ones, never the newest.
func (n *Node) SubscribeConn(ctx context.Context) <-chan ConnEvent {
	return n.tracker.subscribe(ctx, n.ctx)
}

// Protect keeps the connection manager from trimming connections to p while
// any tag is set (route neighbours, relays, bootstrap peers).
func (n *Node) Protect(p peer.ID, tag string) { n.cm.Protect(p, tag) }

// Unprotect removes one tag; it reports whether p is still protected.
func (n *Node) Unprotect(p peer.ID, tag string) bool { return n.cm.Unprotect(p, tag) }

// Private reports whether the node runs a private swarm (swarm key), and the
// key's fingerprint (never the key).
func (n *Node) Private() (bool, string) { return n.pskFP != "", n.pskFP }

// Discovery is the node's advert service.
func (n *Node) Discovery() *Discovery { return n.disc }

// Close withdraws the local advert (best effort, bounded by
// withdrawTimeout), then stops discovery, the DHT, the relay and the host.
func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		var errs []error
		if n.disc != nil {
			n.disc.close()
		}
		n.cancel()
		n.wg.Wait()
		errs = append(errs, n.closeHost())
		n.closeErr = errors.Join(errs...)
	})
	return n.closeErr
}

func (n *Node) closeHost() error {
	n.cancel()
	var errs []error
	if n.relay != nil {
		errs = append(errs, n.relay.Close())
	}
	if n.kad != nil {
		errs = append(errs, n.kad.Close())
	}
	if n.host != nil {
		errs = append(errs, n.host.Close())
	}
	if n.cm != nil {
		errs = append(errs, n.cm.Close())
	}
	return errors.Join(errs...)
}

// clearDialBackoff forgets the swarm's dial backoff for p.
func (n *Node) clearDialBackoff(p peer.ID) {
	if sw, ok := n.host.Network().(*swarm.Swarm); ok {
		sw.Backoff().Clear(p)
	}
}

// NewStreamPreferDirect opens a stream for long-lived traffic (activation
// streams). When the only connection to p is relayed and a hole punch may
// still succeed (none has failed yet), it first waits up to wait for the
// direct connection, so the stream starts on it instead of staying on the
// relay for its whole life; afterwards it behaves like NewStream. libp2p
// starts DCUtR as soon as a relayed connection is up, and measured punches
// finish in 20–220 ms, so the wait is short when punching works and is paid
// at most once per peer when it cannot (a failed round is remembered).
func (n *Node) NewStreamPreferDirect(ctx context.Context, p peer.ID, wait time.Duration, pids ...protocol.ID) (network.Stream, error) {
	if n.host.Network().Connectedness(p) != network.Connected {
		// A route names this peer as live now (its advert is fresh): dial
		// it even if an earlier dial failed moments ago. The swarm's dial
		// backoff would refuse without trying, e.g. a head that restarted
		// on the same address seconds ago ("dial backoff"; found by the
		// churn soak: the tail's ring open failed and honest tails were
		// blamed). One dial per session open is not hammering.
		n.clearDialBackoff(p)
		if err := n.host.Connect(network.WithAllowLimitedConn(ctx, "meshp2p"), peer.AddrInfo{ID: p}); err != nil {
			return nil, fmt.Errorf("connecting to %s: %w", p, err)
		}
	}
	if st := n.ConnStatus(p); st.Path == PathRelayed && st.HolePunch.Failures == 0 && wait > 0 && !n.cfg.DisableHolePunching {
		wctx, cancel := context.WithTimeout(ctx, wait)
		events := n.SubscribeConn(wctx)
		// While the punch runs, dial the peer's own addresses directly: a
		// peer on the same LAN (or one that is reachable after all) needs
		// no punch, and the relayed connection alone would make us wait
		// the whole DirectWait (the LAN swarm test's first token missed
		// its bound by that).
		direct := make(chan struct{}, 1)
		go func() {
			if n.host.Network().DialPeer(network.WithForceDirectDial(wctx, "meshp2p: direct beside the relay"), p); n.ConnStatus(p).Path == PathDirect {
				direct <- struct{}{}
			}
		}()
		// Re-check after subscribing: the punch may have finished meanwhile.
	wait:
		for n.ConnStatus(p).Path == PathRelayed && n.ConnStatus(p).HolePunch.Failures == 0 {
			select {
			case _, ok := <-events:
				if !ok {
					break wait // waited long enough: use the relay
				}
			case <-direct:
			}
		}
		cancel()
	}
	return n.NewStream(ctx, p, pids...)
}
