package p2p

import (
	"strings"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/metrics"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/proto"
	"github.com/libp2p/go-libp2p/p2p/protocol/identify"
	"github.com/multiformats/go-multiaddr"

	"github.com/neuron-tai/meshp2p/p2p/peerlimit"
)

// Open relays. A relay in a swarm without a swarm key (Config.RelayService
// and no key) carries traffic for anyone who passes its member check, and
// that check is self-asserted (docs/tracker.md, "Who may relay"). So every
// peer is also bounded, as source or destination of circuits: bytes per
// window, circuit age and circuits at once. A peer over its byte budget has
// its circuits reset and its reservations and new circuits refused until
// its window ends.
const (
	// DefaultRelayPeerBytes is what one peer may relay per window: an hour
	// of a relayed activation stream at a few hundred KiB/s, the fallback
	// until a hole punch moves it to a direct connection.
	DefaultRelayPeerBytes = 1 << 30
	// DefaultRelayPeerWindow is the byte budget's window.
	DefaultRelayPeerWindow = time.Hour
	// DefaultRelayCircuitDuration is the oldest a circuit may get before
	// it is reset (its peers may open a new one).
	DefaultRelayCircuitDuration = time.Hour
	// openRelayMaxCircuits is the circuits one peer may hold at once on an
	// open relay (private relays: defaultRelayMaxCircuits).
	openRelayMaxCircuits = 16
	// relayGuardMaxPeers bounds the peers whose usage is tracked; past it
	// the one whose window started first is forgotten (a peerlimit.Table
	// ordered by window start).
	relayGuardMaxPeers = 8192
	// relayIdentifyWait bounds the member check's wait for identify to
	// tell whether a peer speaks this swarm's protocols.
	relayIdentifyWait = 3 * time.Second
	// relayGuardTick is the longest interval between the guard's checks of
	// circuit age and window expiry.
	relayGuardTick = 10 * time.Second
)

// RelayBudget bounds what one peer may relay through an open relay; zero
// fields take the defaults above.
type RelayBudget struct {
	Bytes           int64         // per Window, as source or destination
	Window          time.Duration // the byte budget's window
	CircuitDuration time.Duration // a circuit older than this is reset
}

func (b RelayBudget) withDefaults() RelayBudget {
	if b.Bytes <= 0 {
		b.Bytes = DefaultRelayPeerBytes
	}
	if b.Window <= 0 {
		b.Window = DefaultRelayPeerWindow
	}
	if b.CircuitDuration <= 0 {
		b.CircuitDuration = DefaultRelayCircuitDuration
	}
	return b
}

// relayGuard accounts the bytes each peer relays through this node and
// says who is over budget. Safe for concurrent use.
type relayGuard struct {
	budget RelayBudget
	now    func() time.Time
	// over receives a peer the moment it goes over budget (its circuits
	// are reset by the guard loop); when full, the next tick catches it.
	over chan peer.ID

	mu    sync.Mutex
	peers *peerlimit.Table[*relayUse] // put when a window starts: oldest window first
}

// relayUse is one peer's usage in its current window.
type relayUse struct {
	start time.Time
	bytes int64
}

func newRelayGuard(b RelayBudget) *relayGuard {
	return &relayGuard{budget: b.withDefaults(), now: time.Now, over: make(chan peer.ID, 64),
		peers: peerlimit.NewTable[*relayUse](relayGuardMaxPeers)}
}

// add counts n bytes relayed with p.
func (g *relayGuard) add(p peer.ID, n int64) {
	if n <= 0 {
		return
	}
	now := g.now()
	g.mu.Lock()
	u, ok := g.peers.Peek(p)
	if !ok || now.Sub(u.start) >= g.budget.Window {
		u = &relayUse{start: now}
		g.peers.Put(p, u) // a full table forgets the oldest window
	}
	was := u.bytes
	u.bytes += n
	crossed := was < g.budget.Bytes && u.bytes >= g.budget.Bytes
	g.mu.Unlock()
	if crossed {
		select {
		case g.over <- p:
		default:
		}
	}
}

// overBudget reports whether p used its budget in its current window.
func (g *relayGuard) overBudget(p peer.ID) bool {
	now := g.now()
	g.mu.Lock()
	defer g.mu.Unlock()
	u, ok := g.peers.Peek(p)
	return ok && now.Sub(u.start) < g.budget.Window && u.bytes >= g.budget.Bytes
}

// overPeers prunes ended windows and lists the peers over budget.
func (g *relayGuard) overPeers() []peer.ID {
	now := g.now()
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []peer.ID
	for p, u := range g.peers.All() {
		switch {
		case now.Sub(u.start) >= g.budget.Window:
			g.peers.Delete(p)
		case u.bytes >= g.budget.Bytes:
			out = append(out, p)
		}
	}
	return out
}

// tracked is the number of peers whose usage is held.
func (g *relayGuard) tracked() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.peers.Len()
}

// relayStreamProtocol reports whether pid carries circuits.
func relayStreamProtocol(pid protocol.ID) bool {
	return pid == proto.ProtoIDv2Hop || pid == proto.ProtoIDv2Stop
}

// relayMeter is the host's bandwidth reporter on an open relay: it counts
// the bytes of circuit streams (hop and stop) per peer for the guard and
// reports nothing else.
type relayMeter struct{ g *relayGuard }

var _ metrics.Reporter = relayMeter{}

func (m relayMeter) LogSentMessage(int64) {}
func (m relayMeter) LogRecvMessage(int64) {}
func (m relayMeter) LogSentMessageStream(n int64, pid protocol.ID, p peer.ID) {
	if relayStreamProtocol(pid) {
		m.g.add(p, n)
	}
}
func (m relayMeter) LogRecvMessageStream(n int64, pid protocol.ID, p peer.ID) {
	if relayStreamProtocol(pid) {
		m.g.add(p, n)
	}
}
func (m relayMeter) GetBandwidthForPeer(peer.ID) metrics.Stats             { return metrics.Stats{} }
func (m relayMeter) GetBandwidthForProtocol(protocol.ID) metrics.Stats     { return metrics.Stats{} }
func (m relayMeter) GetBandwidthTotals() metrics.Stats                     { return metrics.Stats{} }
func (m relayMeter) GetBandwidthByPeer() map[peer.ID]metrics.Stats         { return nil }
func (m relayMeter) GetBandwidthByProtocol() map[protocol.ID]metrics.Stats { return nil }
func (m relayMeter) Reset()                                                {}
func (m relayMeter) TrimIdle(time.Time)                                    {}

// relayOwned reports whether s is a stream of this node's relay service:
// a circuit's inbound hop stream from its source or outbound stop stream
// to its destination (not a circuit this node itself uses through
// another relay).
func relayOwned(s network.Stream) bool {
	switch s.Protocol() {
	case proto.ProtoIDv2Hop:
		return s.Stat().Direction == network.DirInbound
	case proto.ProtoIDv2Stop:
		return s.Stat().Direction == network.DirOutbound
	}
	return false
}

// runRelayGuard enforces the budget until the node closes: it resets the
// circuits of a peer that goes over budget, and every circuit older than
// the circuit duration.
func (n *Node) runRelayGuard() {
	defer n.wg.Done()
	g := n.guard
	t := time.NewTicker(min(relayGuardTick, g.budget.CircuitDuration/4))
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case p := <-g.over:
			n.resetCircuits(p)
		case <-t.C:
			for _, p := range g.overPeers() {
				n.resetCircuits(p)
			}
			n.resetOldCircuits(g.budget.CircuitDuration)
		}
	}
}

// resetCircuits resets every circuit this node relays for p.
func (n *Node) resetCircuits(p peer.ID) {
	reset := 0
	for _, c := range n.host.Network().ConnsToPeer(p) {
		for _, s := range c.GetStreams() {
			if relayOwned(s) {
				_ = s.Reset()
				reset++
			}
		}
	}
	if reset > 0 {
		n.log.Info("relay budget used: circuits reset, new ones refused until the window ends", "peer", p, "circuits", reset,
			"bytes", n.guard.budget.Bytes, "window", n.guard.budget.Window)
	}
}

// resetOldCircuits resets the circuits relayed for longer than d.
func (n *Node) resetOldCircuits(d time.Duration) {
	now := time.Now()
	for _, c := range n.host.Network().Conns() {
		for _, s := range c.GetStreams() {
			if relayOwned(s) && now.Sub(s.Stat().Opened) >= d {
				n.log.Debug("relay circuit reached its maximum duration", "peer", c.RemotePeer(), "duration", d)
				_ = s.Reset()
			}
		}
	}
}

// RelayMember is the relay ACL of an open swarm (no swarm key): a member
// is connected to this node directly (not through another relay, and not
// merely remembered by the peerstore) and either holds an advert that
// Config.MemberAdvert accepts (any advert when nil), or (after identify)
// speaks one of this swarm's protocols (origins publish no advert). Both
// are self-asserted: in an open swarm this keeps out peers of other
// networks, not a determined stranger (docs/tracker.md, "Who may relay").
func (n *Node) RelayMember(p peer.ID) bool {
	h := n.hostOrNil()
	if h == nil {
		return false
	}
	var direct []network.Conn
	for _, c := range h.Network().ConnsToPeer(p) {
		if _, err := c.RemoteMultiaddr().ValueForProtocol(multiaddr.P_CIRCUIT); err != nil {
			direct = append(direct, c)
		}
	}
	if len(direct) == 0 {
		n.log.Debug("relay refused: peer not connected directly", "peer", p)
		return false
	}
	if n.disc != nil {
		if a, ok := n.disc.Advert(p); ok && (n.cfg.MemberAdvert == nil || n.cfg.MemberAdvert(a)) {
			return true
		}
	}
	if ids, ok := h.(interface{ IDService() identify.IDService }); ok {
		for _, c := range direct {
			select {
			case <-ids.IDService().IdentifyWait(c):
			case <-time.After(relayIdentifyWait):
			}
		}
	}
	prefix := "/meshp2p/" + n.cfg.Network + "/"
	protos, _ := h.Peerstore().GetProtocols(p)
	for _, pr := range protos {
		if strings.HasPrefix(string(pr), prefix) {
			return true
		}
	}
	n.log.Info("relay refused for a non-member", "peer", p)
	return false
}

// relayAllow is the relay's admission of one peer: the configured ACL (on
// an open relay by default RelayMember), and not over its budget.
func (n *Node) relayAllow(p peer.ID) bool {
	if n.guard != nil && n.guard.overBudget(p) {
		n.log.Debug("relay refused: peer over its budget", "peer", p)
		return false
	}
	return n.relayACL == nil || n.relayACL(p)
}
