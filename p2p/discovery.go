package p2p

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ipfs/go-cid"
	dht "github.com/libp2p/go-libp2p-kad-dht"
	"github.com/libp2p/go-libp2p-kad-dht/dual"
	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/p2p/protocol/holepunch"
	"github.com/multiformats/go-multiaddr"
	mh "github.com/multiformats/go-multihash"
	"golang.org/x/time/rate"
)

// Discovery tunables; variables so tests can shrink them.
var (
	// withdrawTimeout bounds the tombstone publish in Close.
	withdrawTimeout = 2 * time.Second
	// withdrawFlush is how long Close waits after publishing the tombstone
	// so the router can hand it to its peers before the host goes away.
	withdrawFlush = 250 * time.Millisecond
	// provideTimeout bounds one DHT provide of one key.
	provideTimeout = 30 * time.Second
	// provideRetryMin/Max bound the backoff after a failed provide (for
	// example while the routing table is still empty).
	provideRetryMin = 500 * time.Millisecond
	provideRetryMax = 30 * time.Second
	// publishRetry is the re-publish delay while the adverts topic has no
	// peers yet.
	publishRetry = time.Second
	// advertStreamTimeout bounds one advert request/response exchange.
	advertStreamTimeout = 10 * time.Second
)

const (
	// advertSubBuffer bounds each Subscribe channel; a slow reader loses the
	// oldest events (drop-oldest), never the newest. Adverts() always has
	// the current table.
	advertSubBuffer = 64
	// maxLookupProviders bounds the providers one Lookup asks.
	maxLookupProviders = 20
	// lookupParallel bounds concurrent advert fetches in one Lookup.
	lookupParallel = 8
	// maxTableSize bounds the advert table (one entry per peer).
	maxTableSize = 4096
	// advertServiceName scopes advert streams in the resource manager.
	advertServiceName = "meshp2p.advert"
)

// Advert is one node's signed capability advert as seen locally.
type Advert struct {
	Peer      peer.ID
	Seq       uint64
	IssuedAt  time.Time
	ExpiresAt time.Time // effective: min(signed expiry, issued + MaxAge)
	// Keys are lookup keys (e.g. model fingerprints), each announced as a
	// DHT provider record.
	Keys []string
	// Body is opaque to p2p (≤ DiscoveryConfig.MaxBody). Do not modify.
	Body  []byte
	Addrs []multiaddr.Multiaddr
	// Reach is how this node reaches Peer right now (filled when read).
	Reach Path

	env []byte // the signed envelope as received, served to pulling peers
}

// AdvertEventKind says what changed in the advert table.
type AdvertEventKind int

const (
	AdvertAdded AdvertEventKind = iota + 1
	// AdvertUpdated: keys, body or addresses changed. A periodic
	// re-publish that changes none of them only extends the expiry and
	// emits nothing.
	AdvertUpdated
	// AdvertRemoved: expired, withdrawn, evicted or its peer unreachable;
	// see AdvertEvent.Reason.
	AdvertRemoved
)

func (k AdvertEventKind) String() string {
	switch k {
	case AdvertAdded:
		return "added"
	case AdvertUpdated:
		return "updated"
	case AdvertRemoved:
		return "removed"
	default:
		return "unknown"
	}
}

// Reasons for AdvertRemoved.
const (
	ReasonExpired   = "expired"
	ReasonWithdrawn = "withdrawn"
	ReasonEvicted   = "evicted" // the table was full (see maxTableSize)
	// ReasonUnreachable (liveness.go): the peer's connection closed and a
	// dial to it failed.
	ReasonUnreachable = "unreachable"
)

// AdvertEvent is one change to the advert table.
type AdvertEvent struct {
	Kind   AdvertEventKind
	Advert Advert
	Reason string // for AdvertRemoved: ReasonExpired, ReasonWithdrawn, ReasonEvicted or ReasonUnreachable
}

// ErrAdvertTooLarge is returned by SetLocalAdvert for keys or a body over
// the configured limits.
var ErrAdvertTooLarge = errors.New("local advert exceeds limits")

// Discovery gossips and looks up signed adverts.
type Discovery struct {
	n       *Node
	log     *slog.Logger
	cfg     DiscoveryConfig
	checker *advertChecker
	ps      *pubsub.PubSub
	topic   *pubsub.Topic
	sub     *pubsub.Subscription
	advPID  protocol.ID
	syncPID protocol.ID
	sync    *syncState

	// identified: identify completed with some peer; observedPublic: some
	// peer observed us at a public address (we sit behind a NAT or are
	// public). Read by awaitHolePunchReady.
	identified, observedPublic atomic.Bool

	publishNow chan struct{} // cap 1
	provideNow chan struct{} // cap 1

	mu       sync.Mutex
	local    *localAdvert // nil until SetLocalAdvert
	localEnv []byte       // last signed local advert (served over advPID)
	lastSeq  uint64
	table    map[peer.ID]*Advert
	subs     map[chan AdvertEvent]struct{}
	// gone marks peers dropped as unreachable, probing those being
	// checked (liveness.go).
	gone    map[peer.ID]goneMark
	probing map[peer.ID]bool
	leaving bool // Close started: no more regular adverts, only the tombstone
	// lastFullWarn rate-limits the table-full warning.
	lastFullWarn time.Time
	closed       bool

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

type localAdvert struct {
	keys []string
	body []byte
}

// TopicName returns the gossipsub topic carrying adverts for network.
func TopicName(network string) string { return "/meshp2p/" + network + "/adverts/1" }

// gossipSubProtocol is the swarm-scoped gossipsub protocol ID (v1.2
// features), so a meshp2p node never joins a public pubsub mesh.
func gossipSubProtocol(network string) protocol.ID {
	return protocol.ID("/meshp2p/" + network + "/meshsub/1.2.0")
}

func gossipFeatures(feat pubsub.GossipSubFeature, _ protocol.ID) bool {
	switch feat {
	case pubsub.GossipSubFeatureMesh, pubsub.GossipSubFeaturePX, pubsub.GossipSubFeatureIdontwant:
		return true
	default:
		return false
	}
}

func newDiscovery(n *Node) (*Discovery, error) {
	cfg := n.cfg.Discovery
	d := &Discovery{
		n:          n,
		log:        n.log.With("logger", "p2p.discovery"),
		cfg:        cfg,
		checker:    newAdvertChecker(n.cfg.Network, cfg),
		advPID:     ProtocolID(n.cfg.Network, "advert", "1.0.0"),
		syncPID:    ProtocolID(n.cfg.Network, "advert-sync", "1.0.0"),
		sync:       newSyncState(),
		publishNow: make(chan struct{}, 1),
		provideNow: make(chan struct{}, 1),
		table:      make(map[peer.ID]*Advert),
		subs:       make(map[chan AdvertEvent]struct{}),
		gone:       make(map[peer.ID]goneMark),
		probing:    make(map[peer.ID]bool),
	}
	d.ctx, d.cancel = context.WithCancel(n.ctx)

	params, thresholds := n.scoreParams()
	ps, err := pubsub.NewGossipSub(d.ctx, n.host,
		pubsub.WithGossipSubProtocols([]protocol.ID{gossipSubProtocol(n.cfg.Network)}, gossipFeatures),
		pubsub.WithMessageSignaturePolicy(pubsub.StrictSign),
		pubsub.WithPeerScore(params, thresholds),
		pubsub.WithPeerExchange(true),
		pubsub.WithFloodPublish(true),
		pubsub.WithMaxMessageSize(max(maxEnvelopeSize(cfg), MaxTopicMessage)+4096), // adverts are bounded by their validator
		// A duplicate that outlives the seen cache is stale by then.
		pubsub.WithSeenMessagesTTL(cfg.MaxAge+cfg.ClockSkew),
		pubsub.WithLogger(demote(d.log, libLevelShift)), // its internals, not the swarm's story (liblog.go)
	)
	if err != nil {
		d.cancel()
		return nil, fmt.Errorf("starting gossipsub: %w", err)
	}
	d.ps = ps
	topic := TopicName(n.cfg.Network)
	if err := ps.RegisterTopicValidator(topic, d.validate); err != nil {
		d.cancel()
		return nil, fmt.Errorf("registering advert validator: %w", err)
	}
	if d.topic, err = ps.Join(topic); err != nil {
		d.cancel()
		return nil, fmt.Errorf("joining %s: %w", topic, err)
	}
	if d.sub, err = d.topic.Subscribe(pubsub.WithBufferSize(128)); err != nil {
		d.cancel()
		return nil, fmt.Errorf("subscribing to %s: %w", topic, err)
	}
	idSub, err := d.subscribeIdentify()
	if err != nil {
		d.cancel()
		return nil, fmt.Errorf("subscribing to identify events: %w", err)
	}
	n.host.SetStreamHandler(d.advPID, d.handleAdvertStream)
	n.host.SetStreamHandler(d.syncPID, d.handleSyncStream)

	d.wg.Add(6)
	go d.livenessLoop(n.tracker.subscribe(d.ctx, n.ctx))
	go d.readLoop()
	go d.publishLoop()
	go d.provideLoop()
	go d.sweepLoop()
	go d.syncLoop(idSub)
	return d, nil
}

// scoreParams returns gossipsub peer-scoring parameters for the advert
// topic. Adverts are rare (one per peer per RepublishInterval), so mesh
// delivery-rate penalties (P3) are off: they would punish honest peers in
// quiet periods. Invalid messages (P4) weigh heavily: three rejected adverts
// push a peer below the gossip threshold. Bootstrap peers and static relays
// get an app-specific boost so only their peer exchange is accepted.
func (n *Node) scoreParams() (*pubsub.PeerScoreParams, *pubsub.PeerScoreThresholds) {
	trusted := make(map[peer.ID]bool)
	for _, ai := range n.cfg.Bootstrap {
		trusted[ai.ID] = true
	}
	for _, ai := range n.cfg.StaticRelays {
		trusted[ai.ID] = true
	}
	whitelist := []*net.IPNet{
		{IP: net.IPv4(127, 0, 0, 0), Mask: net.CIDRMask(8, 32)},
		{IP: net.IPv6loopback, Mask: net.CIDRMask(128, 128)},
	}
	for _, p := range n.cfg.TestMode.RelaxedCIDRs {
		p = p.Masked()
		whitelist = append(whitelist, &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())})
	}
	topic := &pubsub.TopicScoreParams{
		TopicWeight:                    1,
		TimeInMeshWeight:               0.01,
		TimeInMeshQuantum:              time.Second,
		TimeInMeshCap:                  300, // ≤ 3 points after 5 minutes in the mesh
		FirstMessageDeliveriesWeight:   1,
		FirstMessageDeliveriesDecay:    pubsub.ScoreParameterDecay(time.Hour),
		FirstMessageDeliveriesCap:      50,
		InvalidMessageDeliveriesWeight: -100,
		InvalidMessageDeliveriesDecay:  pubsub.ScoreParameterDecay(time.Hour),
	}
	params := &pubsub.PeerScoreParams{
		Topics:        map[string]*pubsub.TopicScoreParams{TopicName(n.cfg.Network): topic},
		TopicScoreCap: 100,
		AppSpecificScore: func(p peer.ID) float64 {
			if trusted[p] {
				return 100
			}
			return 0
		},
		AppSpecificWeight: 1,
		// Homes share one public IP; more than 10 peers from one address
		// is suspicious. Loopback and test CIDRs are exempt.
		IPColocationFactorWeight:    -10,
		IPColocationFactorThreshold: 10,
		IPColocationFactorWhitelist: whitelist,
		BehaviourPenaltyWeight:      -10,
		BehaviourPenaltyThreshold:   6,
		BehaviourPenaltyDecay:       pubsub.ScoreParameterDecay(10 * time.Minute),
		DecayInterval:               time.Second,
		DecayToZero:                 0.01,
		RetainScore:                 10 * time.Minute,
	}
	thresholds := &pubsub.PeerScoreThresholds{
		GossipThreshold:             -500,
		PublishThreshold:            -1000,
		GraylistThreshold:           -2500,
		AcceptPXThreshold:           50, // only trusted peers (app score 100)
		OpportunisticGraftThreshold: 5,
	}
	return params, thresholds
}

// validate is the topic validator: it accepts only signed, well-formed,
// fresh adverts whose signer is the message author and whose seq is newer
// than the last accepted one from that peer. Replays are ignored (dropped,
// not forwarded, no penalty); every other failure is rejected.
func (d *Discovery) validate(_ context.Context, _ peer.ID, msg *pubsub.Message) pubsub.ValidationResult {
	rec, err := d.checkMessage(msg, time.Now())
	switch {
	case err == nil:
		msg.ValidatorData = rec
		return pubsub.ValidationAccept
	case errors.Is(err, ErrAdvertReplayed), errors.Is(err, ErrAdvertRateLimited), errors.Is(err, ErrAdvertStale):
		// Dropped, not forwarded, no score penalty: replays and late
		// copies are normal in gossip, a rate-limited author only loses
		// the excess, and a stale advert usually means a skewed clock,
		// not malice (rejecting would graylist an honest peer).
		d.log.Debug("ignoring advert", "from", msg.GetFrom(), "err", err)
		return pubsub.ValidationIgnore
	default:
		d.log.Debug("rejecting advert", "from", msg.GetFrom(), "received_from", msg.ReceivedFrom, "err", err)
		return pubsub.ValidationReject
	}
}

// checkMessage validates a gossip message carrying an advert.
func (d *Discovery) checkMessage(msg *pubsub.Message, now time.Time) (*advertRecord, error) {
	if msg == nil || msg.Message == nil {
		return nil, fmt.Errorf("%w: empty message", ErrAdvertMalformed)
	}
	if len(msg.Signature) == 0 || len(msg.From) == 0 {
		return nil, fmt.Errorf("%w: gossip message without author signature", ErrAdvertUnsigned)
	}
	from, err := peer.IDFromBytes(msg.From)
	if err != nil {
		return nil, fmt.Errorf("%w: author: %v", ErrAdvertMalformed, err)
	}
	return d.checker.accept(from, msg.Data, now)
}

func (d *Discovery) readLoop() {
	defer d.wg.Done()
	self := d.n.host.ID()
	for {
		msg, err := d.sub.Next(d.ctx)
		if err != nil {
			return
		}
		rec, ok := msg.ValidatorData.(*advertRecord)
		if !ok || rec.Peer == self {
			continue
		}
		d.ingest(rec, msg.Data, time.Now())
	}
}

// ingest applies a verified advert or tombstone (env: its signed envelope)
// to the table. It reports whether the table changed.
func (d *Discovery) ingest(rec *advertRecord, env []byte, now time.Time) bool {
	if rec.Peer == d.n.host.ID() {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return false
	}
	old := d.table[rec.Peer]
	if (old != nil && rec.Seq <= old.Seq) || d.refusedLocked(rec) {
		return false
	}
	if rec.Withdrawn {
		if old != nil {
			delete(d.table, rec.Peer)
			d.emitLocked(AdvertEvent{Kind: AdvertRemoved, Advert: *old, Reason: ReasonWithdrawn})
			return true
		}
		return false
	}
	if old == nil && len(d.table) >= maxTableSize {
		d.evictLocked(now)
	}
	expires := rec.ExpiresAt
	if cap := rec.IssuedAt.Add(d.cfg.MaxAge); cap.Before(expires) {
		expires = cap
	}
	ad := &Advert{
		Peer: rec.Peer, Seq: rec.Seq, IssuedAt: rec.IssuedAt, ExpiresAt: expires,
		Keys: rec.Keys, Body: rec.Body, Addrs: rec.Addrs, env: env,
	}
	d.table[rec.Peer] = ad
	if ttl := expires.Sub(now); ttl > 0 && len(ad.Addrs) > 0 {
		d.n.host.Peerstore().AddAddrs(ad.Peer, ad.Addrs, ttl)
	}
	switch {
	case old == nil:
		d.emitLocked(AdvertEvent{Kind: AdvertAdded, Advert: *ad})
	case !sameContent(old, ad):
		d.emitLocked(AdvertEvent{Kind: AdvertUpdated, Advert: *ad})
	}
	return true
}

// evictLocked makes room in a full table: the advert closest to its expiry
// goes (a newcomer is never silently ignored), and a warning says so at most
// once a minute. A full table of 4096 peers is far above any real swarm;
// reaching it means many cheap identities (Sybil fill), which an open swarm
// cannot prevent, only bound.
func (d *Discovery) evictLocked(now time.Time) {
	var victim *Advert
	for _, ad := range d.table {
		if victim == nil || ad.ExpiresAt.Before(victim.ExpiresAt) {
			victim = ad
		}
	}
	if victim == nil {
		return
	}
	delete(d.table, victim.Peer)
	d.emitLocked(AdvertEvent{Kind: AdvertRemoved, Advert: *victim, Reason: ReasonEvicted})
	if now.Sub(d.lastFullWarn) >= time.Minute {
		d.lastFullWarn = now
		d.log.Warn("advert table full; evicting the adverts closest to expiry", "size", len(d.table)+1, "evicted", victim.Peer)
	}
}

func sameContent(a, b *Advert) bool {
	return slices.Equal(a.Keys, b.Keys) && bytes.Equal(a.Body, b.Body) &&
		slices.EqualFunc(a.Addrs, b.Addrs, func(x, y multiaddr.Multiaddr) bool { return x.Equal(y) })
}

func (d *Discovery) emitLocked(ev AdvertEvent) {
	ev.Advert.Reach = d.n.tracker.status(ev.Advert.Peer).Path
	for ch := range d.subs {
		sendDropOldest(ch, ev)
	}
}

// sweepLoop removes expired adverts and old replay state.
func (d *Discovery) sweepLoop() {
	defer d.wg.Done()
	every := min(max(d.cfg.AdvertTTL/8, 100*time.Millisecond), 30*time.Second)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-d.ctx.Done():
			return
		case now := <-t.C:
			d.sweep(now)
		}
	}
}

func (d *Discovery) sweep(now time.Time) {
	d.checker.prune(now)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.pruneGoneLocked(now)
	for p, ad := range d.table {
		if !ad.ExpiresAt.After(now) {
			delete(d.table, p)
			d.emitLocked(AdvertEvent{Kind: AdvertRemoved, Advert: *ad, Reason: ReasonExpired})
		}
	}
}

// SetLocalAdvert replaces the local advert and publishes it now; it is then
// re-signed and re-published every RepublishInterval, and each key is
// provided in the DHT (now and every ProvideInterval). Keys and body are
// copied.
func (d *Discovery) SetLocalAdvert(keys []string, body []byte) error {
	if len(body) > d.cfg.MaxBody {
		return fmt.Errorf("%w: body %d > %d bytes", ErrAdvertTooLarge, len(body), d.cfg.MaxBody)
	}
	if len(keys) > d.cfg.MaxKeys {
		return fmt.Errorf("%w: %d > %d keys", ErrAdvertTooLarge, len(keys), d.cfg.MaxKeys)
	}
	for _, k := range keys {
		if k == "" || len(k) > d.cfg.MaxKeyLen {
			return fmt.Errorf("%w: key length %d not in 1..%d", ErrAdvertTooLarge, len(k), d.cfg.MaxKeyLen)
		}
	}
	d.mu.Lock()
	// The DHT records name the keys only: a new body under the same keys
	// (a capacity change) needs no provide round.
	newKeys := d.local == nil || !slices.Equal(d.local.keys, keys)
	d.local = &localAdvert{keys: slices.Clone(keys), body: bytes.Clone(body)}
	d.mu.Unlock()
	poke(d.publishNow)
	if newKeys {
		poke(d.provideNow)
	}
	return nil
}

func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// nextSeqLocked returns a sequence number greater than every earlier one,
// also across restarts: unix nanoseconds, bumped if the clock stalls.
func (d *Discovery) nextSeqLocked(now time.Time) uint64 {
	s := uint64(now.UnixNano())
	if s <= d.lastSeq {
		s = d.lastSeq + 1
	}
	d.lastSeq = s
	return s
}

// signLocal signs the current local advert (or a tombstone).
func (d *Discovery) signLocal(withdrawn bool) ([]byte, error) {
	now := time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.local == nil || (d.leaving && !withdrawn) {
		return nil, nil
	}
	rec := &advertRecord{
		domain:    d.checker.domain,
		Peer:      d.n.host.ID(),
		Seq:       d.nextSeqLocked(now),
		IssuedAt:  now,
		ExpiresAt: now.Add(d.cfg.AdvertTTL),
		Withdrawn: withdrawn,
	}
	if !withdrawn {
		rec.Keys = d.local.keys
		rec.Body = d.local.body
		for _, a := range d.n.host.Addrs() {
			if len(rec.Addrs) < maxAdvertAddrs && len(a.Bytes()) <= maxAdvertAddrLen {
				rec.Addrs = append(rec.Addrs, a)
			}
		}
	}
	env, err := sealAdvert(rec, d.n.host.Peerstore().PrivKey(d.n.host.ID()))
	if err != nil {
		return nil, err
	}
	if !withdrawn {
		d.localEnv = env
	}
	return env, nil
}

func (d *Discovery) publishLoop() {
	defer d.wg.Done()
	d.awaitHolePunchReady()
	timer := time.NewTimer(d.cfg.RepublishInterval)
	defer timer.Stop()
	// Paced below what receivers accept from one author (authorBurst,
	// then one per authorRefill; more is dropped): changes that come
	// faster are coalesced, and the advert sent when the pace allows is
	// the latest, so the last state always goes out.
	pace := rate.NewLimiter(rate.Every(authorRefill), publishBurst)
	for {
		select {
		case <-d.ctx.Done():
			return
		case <-d.publishNow:
		case <-timer.C:
		}
		if pace.Wait(d.ctx) != nil {
			return
		}
		next := d.cfg.RepublishInterval
		if !d.publish() {
			// Nobody subscribed yet (start-up): a message published now
			// would reach no one, so try again soon instead of waiting a
			// full interval.
			next = min(publishRetry, next)
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(next)
	}
}

// awaitHolePunchReady holds the first advert back until this node can take
// part in a hole punch, when it sits behind a NAT. go-libp2p's DCUtR service
// only starts once the host knows a public address of its own (it polls with
// a backoff: 0.25, 0.75, 1.75, 3.75 s after start), and it only punches
// relayed connections that arrive after that. A node advertised before then
// is reached through the relay by a session opened at once — pull on connect
// makes that immediate — and the seam stays relayed for its whole life.
// So: wait until the DCUtR protocol is registered, as long as a peer has
// observed us at a public address (else there is nothing to punch: a LAN or
// loopback swarm waits for nothing), at most holePunchReadyMax.
func (d *Discovery) awaitHolePunchReady() {
	n := d.n
	if n.cfg.DisableHolePunching || n.cfg.ForceReachability == ReachabilityPublic {
		return
	}
	deadline := time.NewTimer(holePunchReadyMax)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if slices.Contains(n.host.Mux().Protocols(), holepunch.Protocol) {
			return
		}
		if d.identified.Load() && !d.observedPublic.Load() {
			return
		}
		select {
		case <-d.ctx.Done():
			return
		case <-deadline.C:
			d.log.Debug("publishing before hole punching is ready", "waited", holePunchReadyMax)
			return
		case <-tick.C:
		}
	}
}

// holePunchReadyMax bounds awaitHolePunchReady (go-libp2p's DCUtR service
// checks for a public address 3.75 s after start at the latest in this
// range).
const holePunchReadyMax = 4 * time.Second

// publish signs and gossips the local advert. It reports false when there
// was an advert but no topic peer to send it to.
func (d *Discovery) publish() bool {
	env, err := d.signLocal(false)
	if err != nil {
		d.log.Error("signing advert", "err", err)
		return true
	}
	if env == nil {
		return true
	}
	if len(d.topic.ListPeers()) == 0 {
		return false
	}
	if err := d.topic.Publish(d.ctx, env); err != nil && d.ctx.Err() == nil {
		d.log.Warn("publishing advert", "err", err)
	}
	return true
}

// errNoDHTPeers: neither DHT has a peer to store a provider record with.
var errNoDHTPeers = errors.New("no DHT peers yet")

// provideBoth announces c in the LAN and the WAN DHT, each that has peers
// (dual.DHT.Provide picks only one). It succeeds if either does.
func provideBoth(ctx context.Context, kad *dual.DHT, c cid.Cid) error {
	var errs []error
	done := false
	for _, k := range []*dht.IpfsDHT{kad.LAN, kad.WAN} {
		if k.RoutingTable().Size() == 0 {
			continue
		}
		if err := k.Provide(ctx, c, true); err != nil {
			errs = append(errs, err)
			continue
		}
		done = true
	}
	switch {
	case done:
		return nil
	case len(errs) == 0:
		return errNoDHTPeers
	default:
		return errors.Join(errs...)
	}
}

// keyCID maps a lookup key to the CID its DHT provider records use; the
// network name is part of the hash so swarms never share provider records.
func keyCID(network, key string) cid.Cid {
	h, _ := mh.Sum([]byte("/meshp2p/"+network+"/key/"+key), mh.SHA2_256, -1)
	return cid.NewCidV1(cid.Raw, h)
}

// provideLoop announces the local keys in the DHT when they change and every
// ProvideInterval, retrying failures with bounded exponential backoff.
func (d *Discovery) provideLoop() {
	defer d.wg.Done()
	kad := d.n.kad
	if kad == nil {
		return
	}
	timer := time.NewTimer(d.cfg.ProvideInterval)
	defer timer.Stop()
	backoff := provideRetryMin
	for {
		select {
		case <-d.ctx.Done():
			return
		case <-d.provideNow:
		case <-timer.C:
		}
		d.mu.Lock()
		var keys []string
		if d.local != nil {
			keys = slices.Clone(d.local.keys)
		}
		d.mu.Unlock()
		var failed error
		for _, k := range keys {
			ctx, cancel := context.WithTimeout(d.ctx, provideTimeout)
			err := provideBoth(ctx, kad, keyCID(d.n.cfg.Network, k))
			cancel()
			if err != nil {
				failed = err
				break
			}
		}
		if d.ctx.Err() != nil {
			return
		}
		next := d.cfg.ProvideInterval
		if failed != nil {
			d.log.Debug("DHT provide failed; retrying", "err", failed, "in", backoff)
			next = backoff
			backoff = min(2*backoff, provideRetryMax)
		} else {
			backoff = provideRetryMin
			if len(keys) > 0 {
				d.log.Debug("provided keys in DHT", "keys", len(keys))
			}
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(next)
	}
}

// handleAdvertStream answers an advert request: the request is empty (the
// asker half-closes), the response is a uvarint length and the latest signed
// local advert (length 0: none).
func (d *Discovery) handleAdvertStream(s network.Stream) {
	defer s.Close()
	if err := s.Scope().SetService(advertServiceName); err != nil {
		s.Reset()
		return
	}
	_ = s.SetDeadline(time.Now().Add(advertStreamTimeout))
	d.mu.Lock()
	env := d.localEnv
	d.mu.Unlock()
	var hdr [binary.MaxVarintLen64]byte
	n := binary.PutUvarint(hdr[:], uint64(len(env)))
	if _, err := s.Write(append(hdr[:n:n], env...)); err != nil {
		s.Reset()
	}
}

// fetchAdvert asks p for its advert over the advert protocol.
func (d *Discovery) fetchAdvert(ctx context.Context, p peer.ID) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, advertStreamTimeout)
	defer cancel()
	s, err := d.n.NewStream(ctx, p, d.advPID)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = s.SetDeadline(dl)
	}
	_ = s.CloseWrite()
	r := &byteReader{r: s}
	size, err := binary.ReadUvarint(r)
	if err != nil {
		s.Reset()
		return nil, fmt.Errorf("reading advert length: %w", err)
	}
	if size == 0 {
		return nil, nil
	}
	if size > uint64(maxEnvelopeSize(d.cfg)) {
		s.Reset()
		return nil, fmt.Errorf("%w: %d bytes", ErrAdvertOversized, size)
	}
	buf := make([]byte, size)
	if _, err := io.ReadFull(s, buf); err != nil {
		s.Reset()
		return nil, fmt.Errorf("reading advert: %w", err)
	}
	return buf, nil
}

// byteReader reads one byte at a time without buffering ahead.
type byteReader struct {
	r   io.Reader
	one [1]byte
}

func (b *byteReader) ReadByte() (byte, error) {
	_, err := io.ReadFull(b.r, b.one[:])
	return b.one[0], err
}

// Lookup finds providers of key in the DHT and asks each (up to 20, 8 at a
// time) for its advert directly. Verified adverts that list key are
// returned and also enter the local table. It returns an empty slice, not an
// error, when no provider answers; ctx bounds the whole lookup.
func (d *Discovery) Lookup(ctx context.Context, key string) ([]Advert, error) {
	kad := d.n.kad
	if kad == nil {
		return nil, errors.New("lookup: no DHT")
	}
	self := d.n.host.ID()
	providers := kad.FindProvidersAsync(ctx, keyCID(d.n.cfg.Network, key), maxLookupProviders)
	var (
		mu   sync.Mutex
		out  []Advert
		wg   sync.WaitGroup
		sem  = make(chan struct{}, lookupParallel)
		seen = make(map[peer.ID]bool)
	)
	for ai := range providers {
		if ai.ID == self || seen[ai.ID] {
			continue
		}
		seen[ai.ID] = true
		if len(ai.Addrs) > 0 {
			d.n.host.Peerstore().AddAddrs(ai.ID, ai.Addrs, 10*time.Minute)
		}
		sem <- struct{}{}
		wg.Add(1)
		go func(p peer.ID) {
			defer wg.Done()
			defer func() { <-sem }()
			ad, err := d.lookupOne(ctx, p, key)
			if err != nil {
				d.log.Debug("advert fetch failed", "peer", p, "key", key, "err", err)
				return
			}
			mu.Lock()
			out = append(out, ad)
			mu.Unlock()
		}(ai.ID)
	}
	wg.Wait()
	if len(out) == 0 && ctx.Err() != nil {
		return nil, fmt.Errorf("lookup %q: %w", key, ctx.Err())
	}
	return out, nil
}

func (d *Discovery) lookupOne(ctx context.Context, p peer.ID, key string) (Advert, error) {
	env, err := d.fetchAdvert(ctx, p)
	if err != nil {
		return Advert{}, err
	}
	if env == nil {
		return Advert{}, errors.New("peer has no advert")
	}
	now := time.Now()
	rec, err := d.checker.open(p, env, now)
	if err != nil {
		return Advert{}, err
	}
	if rec.Withdrawn || !slices.Contains(rec.Keys, key) {
		return Advert{}, fmt.Errorf("advert does not list key %q", key)
	}
	// Not recorded in the gossip replay state (see advertsync.go): the
	// same advert arriving by gossip must still be forwarded.
	if last, ok := d.checker.lastSeen(rec.Peer); !ok || rec.Seq >= last {
		d.ingest(rec, env, now)
	}
	expires := rec.ExpiresAt
	if cap := rec.IssuedAt.Add(d.cfg.MaxAge); cap.Before(expires) {
		expires = cap
	}
	return Advert{
		Peer: rec.Peer, Seq: rec.Seq, IssuedAt: rec.IssuedAt, ExpiresAt: expires,
		Keys: rec.Keys, Body: rec.Body, Addrs: rec.Addrs,
		Reach: d.n.tracker.status(rec.Peer).Path,
	}, nil
}

// Adverts returns the fresh adverts of other peers (not the local one),
// sorted by peer id, with Reach filled in.
func (d *Discovery) Adverts() []Advert {
	now := time.Now()
	d.mu.Lock()
	out := make([]Advert, 0, len(d.table))
	for _, ad := range d.table {
		if ad.ExpiresAt.After(now) {
			out = append(out, *ad)
		}
	}
	d.mu.Unlock()
	slices.SortFunc(out, func(a, b Advert) int { return bytes.Compare([]byte(a.Peer), []byte(b.Peer)) })
	for i := range out {
		out[i].Reach = d.n.tracker.status(out[i].Peer).Path
	}
	return out
}

// Advert returns p's fresh advert.
func (d *Discovery) Advert(p peer.ID) (Advert, bool) {
	d.mu.Lock()
	ad, ok := d.table[p]
	var cp Advert
	if ok {
		cp = *ad
	}
	d.mu.Unlock()
	if !ok || !cp.ExpiresAt.After(time.Now()) {
		return Advert{}, false
	}
	cp.Reach = d.n.tracker.status(p).Path
	return cp, true
}

// Subscribe delivers table changes until ctx ends or the node closes, then
// closes the channel. The channel buffers 64 events; when the reader falls
// behind the oldest pending event is dropped (Adverts has the full state).
func (d *Discovery) Subscribe(ctx context.Context) <-chan AdvertEvent {
	ch := make(chan AdvertEvent, advertSubBuffer)
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		close(ch)
		return ch
	}
	d.subs[ch] = struct{}{}
	d.mu.Unlock()
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		select {
		case <-ctx.Done():
		case <-d.ctx.Done():
		}
		d.mu.Lock()
		if _, ok := d.subs[ch]; ok {
			delete(d.subs, ch)
			close(ch)
		}
		d.mu.Unlock()
	}()
	return ch
}

// close withdraws the local advert (if any was published and the topic has
// peers) and stops the discovery goroutines.
func (d *Discovery) close() {
	d.mu.Lock()
	published := d.localEnv != nil
	d.leaving = true // publishLoop signs nothing newer than the tombstone
	d.localEnv = nil
	d.mu.Unlock()
	if published && len(d.topic.ListPeers()) > 0 {
		if env, err := d.signLocal(true); err == nil && env != nil {
			ctx, cancel := context.WithTimeout(d.ctx, withdrawTimeout)
			if err := d.topic.Publish(ctx, env); err != nil {
				d.log.Debug("publishing withdrawal", "err", err)
			} else {
				select { // let the router send it before the host closes
				case <-time.After(withdrawFlush):
				case <-ctx.Done():
				}
			}
			cancel()
		}
	}
	d.n.host.RemoveStreamHandler(d.advPID)
	d.n.host.RemoveStreamHandler(d.syncPID)
	d.cancel()
	d.sub.Cancel()
	d.wg.Wait()
	d.mu.Lock()
	d.closed = true
	for ch := range d.subs {
		delete(d.subs, ch)
		close(ch)
	}
	d.mu.Unlock()
	_ = d.topic.Close()
}
