// Package tracker is the optional route oracle: an ordinary swarm peer
// (relay, DHT server, gossipsub hub) that measures the swarm and answers
// route requests with signed tickets (docs/tracker.md). It never runs a
// model and does not link llama.cpp.
package tracker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/p2p/protocol/ping"
	"github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
	"golang.org/x/time/rate"

	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/p2p/peerlimit"
	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
)

// Key is the discovery key trackers announce themselves under.
const Key = "role:tracker"

// Config configures a Tracker. P2P usually comes from
// node.Preset(node.PresetRelay): relay service with raised limits, DHT server,
// public reachability (so it is also an AutoNAT server and gossipsub hub
// every member bootstraps from).
type Config struct {
	P2P p2p.Config
	// TicketTTL is how long an issued ticket is valid (default 2 min; a
	// ticket is checked at admission only, so it bounds the time between
	// asking and opening the session, not the session).
	TicketTTL time.Duration
	// PingInterval is how often every advertising peer's RTT is measured
	// (default 10 s); StaleAfter (default 3 × PingInterval) without a
	// successful ping ages a peer out of routes.
	PingInterval time.Duration
	StaleAfter   time.Duration
	Cost         route.CostModel
	Limits       frame.Limits
	Logger       *slog.Logger
	// RequestBurst and RequestsPerSecond rate-limit route requests per
	// client peer (token bucket; defaults RouteRequestBurst and
	// RouteRequestsPerSecond).
	RequestBurst      int
	RequestsPerSecond float64
	// Now defaults to time.Now (rate limits, pending load, ticket times).
	Now func() time.Time
	// VerifyLayers, if set, replaces fetching and verifying a model's
	// vocabulary to learn its layer count (tests without models).
	VerifyLayers func(ctx context.Context, fp string) (int, error)
	// AuditRate, above 0, makes every ticket carry an audit assignment
	// drawn with that probability (proofs.go). Judge, if set, checks the
	// fraud proofs clients submit; without it none are accepted.
	AuditRate float64
	Judge     Judge
	// ProofIdleTimeout is how long reading a proof may wait for its next
	// bytes (ProofIdleTimeout when 0; tests shorten it).
	ProofIdleTimeout time.Duration
}

// Tracker is the optional route oracle: an ordinary swarm peer that keeps
// its own view of the swarm (adverts, RTT, reachability, load) and answers
// /meshp2p/<network>/route/1.0.0 with signed route tickets.
type Tracker struct {
	cfg     Config
	log     *slog.Logger
	p2p     *p2p.Node
	table   *route.Table
	planner *route.CostPlanner
	key     crypto.PrivKey
	pid     protocol.ID

	limiter *peerlimit.Limiter // route requests per client
	proofs  *proofGate         // what proofs in flight may cost (proofgate.go)

	mu        sync.Mutex
	views     map[peer.ID]*peerView
	convicted map[peer.ID]Conviction // peers a verified proof convicted (proofs.go)

	layers layerCounts // verified layer counts per fingerprint

	issued atomic.Uint64
	bg     context.Context // ends at Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// peerView is the tracker's own measurement of one peer.
type peerView struct {
	rtt       time.Duration // minimum of the recent RTT samples
	samples   [RTTWindow]time.Duration
	nSamples  int
	lastOK    time.Time
	firstFail time.Time // first failure since the last success (zero: none)
}

// Start starts a tracker node.
func Start(ctx context.Context, cfg Config) (*Tracker, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.P2P.Logger == nil {
		cfg.P2P.Logger = cfg.Logger
	}
	if cfg.TicketTTL <= 0 {
		cfg.TicketTTL = DefaultTicketTTL
	}
	if cfg.PingInterval <= 0 {
		cfg.PingInterval = DefaultPingInterval
	}
	if cfg.StaleAfter <= 0 {
		cfg.StaleAfter = StaleAfterPings * cfg.PingInterval
	}
	if cfg.P2P.Role == "" {
		cfg.P2P.Role = "tracker"
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.RequestBurst <= 0 {
		cfg.RequestBurst = RouteRequestBurst
	}
	if cfg.RequestsPerSecond <= 0 {
		cfg.RequestsPerSecond = RouteRequestsPerSecond
	}
	if cfg.Cost.MaxPendingPerClient <= 0 {
		cfg.Cost.MaxPendingPerClient = MaxPendingPerClient
	}
	t := &Tracker{cfg: cfg, log: cfg.Logger.With("logger", "tracker"), table: route.NewTable(), views: map[peer.ID]*peerView{}, convicted: map[peer.ID]Conviction{},
		layers:  layerCounts{m: map[string]*layerEntry{}},
		limiter: peerlimit.NewLimiter(rate.Limit(cfg.RequestsPerSecond), cfg.RequestBurst, MaxTrackedClients),
		proofs:  newProofGate(cfg.ProofIdleTimeout)}
	// Without a swarm key the relay serves members only, each within its
	// budget (p2p.Node.RelayMember, p2p/relayguard.go); a member's advert
	// must list a shard inside route.DecodeAdvert's bounds.
	cfg.P2P.RelayService = true
	if cfg.P2P.MemberAdvert == nil {
		cfg.P2P.MemberAdvert = route.MemberAdvert
	}
	var err error
	if t.p2p, err = p2p.New(ctx, cfg.P2P); err != nil {
		return nil, err
	}
	t.cfg = cfg
	h := t.p2p.Host()
	t.key = h.Peerstore().PrivKey(h.ID())
	if t.key == nil {
		t.p2p.Close()
		return nil, errors.New("tracker: host has no private key")
	}
	t.planner = &route.CostPlanner{Table: t.table, Stats: t.stats, Model: cfg.Cost, Now: cfg.Now}
	t.pid = t.p2p.ProtocolID(route.ProtoRoute, route.ProtoRouteVersion)
	h.SetStreamHandler(t.pid, t.handle)
	h.SetStreamHandler(t.p2p.ProtocolID(route.ProtoProof, route.ProtoProofVersion), t.handleProof)
	if err := t.publish(); err != nil {
		t.p2p.Close()
		return nil, err
	}
	bg, cancel := context.WithCancel(context.Background())
	t.bg, t.cancel = bg, cancel
	t.wg.Add(2)
	go func() { defer t.wg.Done(); route.Follow(bg, t.p2p.Discovery(), t.table) }()
	go func() { defer t.wg.Done(); t.pingLoop(bg) }()
	t.log.Info("tracker started", "peer_id", h.ID(), "protocol", t.pid, "ticket_ttl", cfg.TicketTTL, "ping_interval", cfg.PingInterval)
	return t, nil
}

// ID is the tracker's peer id (what operators pin with --tracker/--trust-tracker).
func (t *Tracker) ID() peer.ID { return t.p2p.ID() }

// P2P returns the network node.
func (t *Tracker) P2P() *p2p.Node { return t.p2p }

// Table is the tracker's capability table.
func (t *Tracker) Table() *route.Table { return t.table }

// Issued counts tickets issued so far.
func (t *Tracker) Issued() uint64 { return t.issued.Load() }

// Info is what node.json holds for a tracker (the fields a node writes
// that a tracker has).
type Info struct {
	PeerID  string   `json:"peer_id"`
	Addrs   []string `json:"addrs"`
	Network string   `json:"network"`
}

// Info describes the tracker (addresses include /p2p/<id>).
func (t *Tracker) Info() Info {
	in := Info{PeerID: t.p2p.ID().String(), Network: t.cfg.P2P.Network}
	for _, a := range t.p2p.Addrs() {
		in.Addrs = append(in.Addrs, a.String())
	}
	return in
}

// WriteInfo writes node.json (peer_id, addrs, network) into the data dir.
func (t *Tracker) WriteInfo() (string, error) {
	b, err := json.MarshalIndent(t.Info(), "", "  ")
	if err != nil {
		return "", err
	}
	p := filepath.Join(t.cfg.P2P.DataDir, "node.json")
	if err := os.WriteFile(p+".tmp", append(b, '\n'), 0o644); err != nil {
		return "", err
	}
	return p, os.Rename(p+".tmp", p)
}

// Close stops the tracker.
func (t *Tracker) Close() error {
	t.cancel()
	t.p2p.Host().RemoveStreamHandler(t.pid)
	err := t.p2p.Close()
	t.wg.Wait()
	return err
}

// PeerStats is the tracker's current view of p (for tests and logs).
func (t *Tracker) PeerStats(p peer.ID) route.PeerStats { return t.stats(p) }

// stats combines the tracker's measurements with what the peer's advert
// and connection say about reachability.
func (t *Tracker) stats(p peer.ID) route.PeerStats {
	var st route.PeerStats
	t.mu.Lock()
	if v := t.views[p]; v != nil {
		st.RTT = v.rtt
		st.Stale = !v.firstFail.IsZero() && time.Since(v.lastOK) > t.cfg.StaleAfter && time.Since(v.firstFail) > t.cfg.StaleAfter/2
	}
	t.mu.Unlock()
	cs := t.p2p.ConnStatus(p)
	if a, ok := t.p2p.Discovery().Advert(p); ok {
		st.Relayed = relayedOnly(a.Addrs, t.loopbackOnly())
	}
	if cs.Path == p2p.PathRelayed {
		st.Relayed = true
		st.Limited = cs.Limited
	}
	return st
}

// relayedOnly: the peer advertises a circuit address and no address other
// nodes can dial directly: a public one, or — only in a swarm that lives
// on one machine (loopback is true when the tracker itself listens on
// loopback only) — a loopback one. A home node behind NAT advertises its
// LAN and loopback addresses and its relay circuit: only the circuit works
// from outside. (Hole punching may still turn a relayed seam direct later;
// the tracker cannot know that per pair.)
func relayedOnly(addrs []multiaddr.Multiaddr, loopback bool) bool {
	circuit := false
	for _, a := range addrs {
		if _, err := a.ValueForProtocol(multiaddr.P_CIRCUIT); err == nil {
			circuit = true
			continue
		}
		if manet.IsPublicAddr(a) || (loopback && manet.IsIPLoopback(a)) {
			return false
		}
	}
	return circuit
}

// loopbackOnly reports whether every address the tracker listens on is a
// loopback address (a one-machine swarm: tests, demos).
func (t *Tracker) loopbackOnly() bool {
	addrs := t.p2p.Host().Addrs()
	for _, a := range addrs {
		if !manet.IsIPLoopback(a) {
			return false
		}
	}
	return len(addrs) > 0
}

// pingLoop measures RTT to every peer with a shard advert, every
// PingInterval, at most 16 pings at once.
func (t *Tracker) pingLoop(ctx context.Context) {
	tick := time.NewTicker(t.cfg.PingInterval)
	defer tick.Stop()
	for {
		t.pingAll(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (t *Tracker) pingAll(ctx context.Context) {
	peers := map[peer.ID]bool{}
	for _, s := range t.table.Shards("") {
		peers[s.Peer] = true
	}
	t.mu.Lock()
	for p := range t.views { // forget peers whose adverts are gone
		if !peers[p] {
			delete(t.views, p)
		}
	}
	t.mu.Unlock()
	sem := make(chan struct{}, MaxConcurrentPings)
	var wg sync.WaitGroup
	for p := range peers {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			t.pingOne(ctx, p)
		}()
	}
	wg.Wait()
}

func (t *Tracker) pingOne(ctx context.Context, p peer.ID) {
	pctx, cancel := context.WithTimeout(ctx, min(PingTimeout, t.cfg.PingInterval))
	defer cancel()
	var res ping.Result
	select {
	case res = <-ping.Ping(pctx, t.p2p.Host(), p):
	case <-pctx.Done():
		res.Error = pctx.Err()
	}
	if ctx.Err() != nil {
		return
	}
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	v := t.views[p]
	if v == nil {
		v = &peerView{}
		t.views[p] = v
	}
	if res.Error != nil {
		if v.firstFail.IsZero() {
			v.firstFail = now
		}
		t.log.Debug("ping failed", "peer", p, "err", res.Error)
		return
	}
	// The minimum of the last RTTWindow pings: the path's latency without
	// the queueing noise of busy hosts (load is modelled separately), so
	// one slow ping neither reroutes the swarm nor breaks ties between
	// equal replicas.
	v.samples[v.nSamples%RTTWindow] = res.RTT
	v.nSamples++
	v.rtt = res.RTT
	for _, r := range v.samples[:min(v.nSamples, RTTWindow)] {
		v.rtt = min(v.rtt, r)
	}
	v.lastOK, v.firstFail = now, time.Time{}
}

// MeasureNow pings every advertising peer once (tests, and start-up).
func (t *Tracker) MeasureNow(ctx context.Context) { t.pingAll(ctx) }

// handle answers one route request.
func (t *Tracker) handle(s network.Stream) {
	defer s.Close()
	_ = s.SetDeadline(time.Now().Add(RequestTimeout))
	var req meshp2pb.RouteRequest
	if err := frame.ReadMessage(s, &req, t.cfg.Limits); err != nil {
		_ = s.Reset()
		return
	}
	resp := t.answer(context.Background(), s.Conn().RemotePeer(), &req)
	_ = frame.WriteMessage(s, resp)
}

func refuse(code meshp2pb.ErrorCode, format string, args ...any) *meshp2pb.RouteResponse {
	return &meshp2pb.RouteResponse{Error: &meshp2pb.Error{Code: code, Message: fmt.Sprintf(format, args...)}}
}

// warmHops reads a request's warm hops (unreadable peer ids left out).
func warmHops(ws []*meshp2pb.WarmHop) []route.Hop {
	var out []route.Hop
	for _, w := range ws {
		if id, err := peer.IDFromBytes(w.GetPeer()); err == nil {
			out = append(out, route.Hop{Peer: id, Start: int(w.GetStart()), End: int(w.GetEnd())})
		}
	}
	return out
}

func (t *Tracker) answer(ctx context.Context, client peer.ID, req *meshp2pb.RouteRequest) *meshp2pb.RouteResponse {
	if r := t.checkRequest(ctx, client, req); r != nil {
		return r
	}
	fp := req.GetModelFingerprint()
	rq := route.Request{Fingerprint: fp, NLayer: int(req.GetNLayer()), MaxHops: int(req.GetMaxHops()), NeedKV: int(req.GetNeedKv()),
		Epoch: max(req.GetEpoch(), 1), Exclude: map[peer.ID]bool{}, SessionID: req.GetSessionId(), Client: client}
	for _, b := range req.GetExclude() {
		if id, err := peer.IDFromBytes(b); err == nil {
			rq.Exclude[id] = true
		}
	}
	rq.Warm, rq.WarmStandby = warmHops(req.GetWarm()), warmHops(req.GetWarmStandby())
	for _, c := range t.Convicted() { // no tickets through a peer a verified proof convicted
		rq.Exclude[c.Peer] = true
	}
	if w := req.GetTakeover(); w != nil && req.GetEpoch() > 1 { // only a re-route has a failed epoch's standby
		if id, err := peer.IDFromBytes(w.GetPeer()); err == nil {
			rq.Takeover = &route.Hop{Peer: id, Start: int(w.GetStart()), End: int(w.GetEnd())}
		}
	}
	rq.Standby = req.GetStandby() // the planner picks it too, its pending load counted (docs/architecture.md, "Hot standby")
	obj := route.ObjectiveLatency
	if req.GetObjective() == meshp2pb.RouteObjective_ROUTE_OBJECTIVE_THROUGHPUT {
		obj = route.ObjectiveThroughput
	}
	rt, est, err := t.planner.PlanObjective(ctx, rq, obj)
	if err != nil {
		code := meshp2pb.ErrorCode_ERROR_CODE_NO_CAPACITY
		switch {
		case errors.Is(err, route.ErrUnknownModel):
			code = meshp2pb.ErrorCode_ERROR_CODE_MODEL_MISMATCH
		case errors.Is(err, route.ErrLayerCount):
			code = meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST
		}
		return refuse(code, "%v", err)
	}
	resp := t.issue(client, req, rt)
	if resp.GetTicket() != nil {
		hops := make([]string, len(rt.Hops))
		for i, h := range rt.Hops {
			hops[i] = fmt.Sprintf("%s[%d-%d]%s %.2fms", shortID(h.Peer), h.Start, h.End, h.Reach, est.Hops[i].Total())
		}
		sb := "none"
		if rt.Standby != nil {
			sb = fmt.Sprintf("%s[%d-%d] for hop %d", shortID(rt.Standby.Hop.Peer), rt.Standby.Hop.Start, rt.Standby.Hop.End, rt.Standby.Index)
		}
		t.log.Info("route ticket issued", "client", client, "model", fp[:min(16, len(fp))], "epoch", rq.Epoch, "objective", obj,
			"excluded", len(rq.Exclude), "hops", hops, "standby", sb, "est_ms_per_token", fmt.Sprintf("%.2f", est.PerTokenMs), "candidates", est.Candidates)
	}
	return resp
}

// checkRequest refuses a malformed request, one over the client's rate,
// or one for a model whose verified layer count is not the request's
// (nil: plan it).
func (t *Tracker) checkRequest(ctx context.Context, client peer.ID, req *meshp2pb.RouteRequest) *meshp2pb.RouteResponse {
	fp := req.GetModelFingerprint()
	if fp == "" || len(fp) > 128 || len(req.GetExclude()) > 1024 || len(req.GetWarm()) > route.MaxWarmHops || len(req.GetWarmStandby()) > route.MaxWarmHops {
		return refuse(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "bad route request")
	}
	if sid := req.GetSessionId(); len(sid) != 0 && len(sid) != frame.SessionIDLen {
		return refuse(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "session id must be %d bytes, not %d", frame.SessionIDLen, len(sid))
	}
	// n_layer is the client's number: bound it before anything is sized
	// by it, and require the model's own layer count.
	nl := req.GetNLayer()
	if nl == 0 || nl > gguf.MaxLayers {
		return refuse(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "n_layer %d not in 1..%d", nl, gguf.MaxLayers)
	}
	if ok, wait := t.limiter.Take(client, t.cfg.Now()); !ok {
		t.log.Debug("route request rate-limited", "client", client, "retry_after", wait)
		r := refuse(meshp2pb.ErrorCode_ERROR_CODE_NO_CAPACITY, "rate limited: at most %d route requests at once, %.3g/s sustained, per client", t.cfg.RequestBurst, t.cfg.RequestsPerSecond)
		r.Error.RetryAfterMs = uint64(max(wait.Milliseconds(), 1))
		return r
	}
	// The layer count the fingerprint binds, from the model's verified
	// vocabulary (layers.go), never a vote over adverts.
	if len(t.table.Shards(fp)) == 0 {
		return refuse(meshp2pb.ErrorCode_ERROR_CODE_MODEL_MISMATCH, "%v", fmt.Errorf("%w: no peer advertises model %.16s", route.ErrUnknownModel, fp))
	}
	want, err := t.layerCount(ctx, fp)
	switch {
	case errors.Is(err, errVerifying):
		r := refuse(meshp2pb.ErrorCode_ERROR_CODE_NO_CAPACITY, "%v", err)
		r.Error.RetryAfterMs = uint64(VerifyRetryAfter.Milliseconds())
		return r
	case err != nil:
		return refuse(meshp2pb.ErrorCode_ERROR_CODE_MODEL_MISMATCH, "%v", err)
	case int(nl) != want:
		return refuse(meshp2pb.ErrorCode_ERROR_CODE_MODEL_MISMATCH, "model %.16s has %d layers, request says %d", fp, want, nl)
	}
	return nil
}

// issue signs the ticket of route rt for client, with its audit draw.
func (t *Tracker) issue(client peer.ID, req *meshp2pb.RouteRequest, rt *route.Route) *meshp2pb.RouteResponse {
	nonce, err := route.NewNonce()
	if err != nil {
		return refuse(meshp2pb.ErrorCode_ERROR_CODE_INTERNAL, "nonce: %v", err)
	}
	now := t.cfg.Now()
	tk := &meshp2pb.RouteTicket{Network: t.cfg.P2P.Network, Route: route.WireRoute(rt), ClientPeerId: []byte(client), Nonce: nonce,
		IssuedAtMs: now.UnixMilli(), ExpiresAtMs: now.Add(t.cfg.TicketTTL).UnixMilli(), TrackerPeerId: []byte(t.p2p.ID()),
		SessionId: req.GetSessionId(), NCtxNeeded: req.GetNeedKv(), Standby: rt.Standby.Wire()}
	audit, err := t.assignAudit(tk)
	if err != nil {
		return refuse(meshp2pb.ErrorCode_ERROR_CODE_INTERNAL, "audit assignment: %v", err)
	}
	st, err := route.SignTicket(t.key, tk)
	if err != nil {
		return refuse(meshp2pb.ErrorCode_ERROR_CODE_INTERNAL, "sign: %v", err)
	}
	t.issued.Add(1)
	return &meshp2pb.RouteResponse{Ticket: st, Audit: audit}
}

func shortID(p peer.ID) string {
	s := p.String()
	return s[max(0, len(s)-6):]
}
