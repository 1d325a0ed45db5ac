package route

import (
	"context"
	"math"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/p2p"
)

// This file is the tracker's route planner: a measured cost model and a
// shortest-path search over layer boundaries.
//
// # Cost model
//
// The quantity estimated is the time one generated token spends in a
// route, in milliseconds: every token crosses every hop once (hidden
// states flow head → … → tail, the sampled token returns to the head), so
// per-token time is the sum of per-hop costs:
//
//	hop cost = compute + latency + queue
//
//	compute = layers × ms_per_layer × (1 + LoadSlowdown × ρ)
//	    Decode time grows with the number of layers a hop runs, at that
//	    node's own speed (ms_per_layer: the node's measured
//	    decode_ms_per_layer from its signed advert, or the tracker's own
//	    measurement, DefaultMsPerLayer when neither exists, so unknown
//	    nodes compare by layer count alone). ρ = sessions in use / max
//	    sessions: concurrent sessions share the node's cores and memory
//	    bandwidth; llama.cpp batches their rows, so a fully busy node is
//	    about (1 + LoadSlowdown) times slower per token, not max-sessions
//	    times.
//
//	latency = RTT / 2                           (direct)
//	        = RTT / 2 × RelayRTTFactor + RelayExtra (reachable only via a relay)
//	    Each hop adds one network crossing per token. The tracker measures
//	    RTT to every node with libp2p ping and uses half of it as the
//	    one-way cost of entering the hop (node-to-node RTT is not known to
//	    the tracker; tracker-to-node is the best proxy it has). A relayed
//	    hop pays the relay's extra leg (the factor) and shares the relay's
//	    bandwidth and copy buffers with every other circuit (the fixed
//	    extra). Hops whose only path is a relay with go-libp2p's default
//	    limits (128 KiB / 2 min per circuit) are never used: the relay
//	    would cut the session's activation stream mid-generation.
//	    Unknown RTT (not measured yet) counts as DefaultRTT.
//
//	queue = layers × ms_per_layer × min(ρ / (1 − ρ), MaxQueue)
//	    A token arriving while the hop is busy with other sessions' rows
//	    waits for that step to finish; with utilisation ρ the expected wait
//	    grows like ρ/(1−ρ) (M/M/1), sharply near saturation. A hop with no
//	    free session (ρ = 1) is not a candidate at all (it would refuse
//	    with NO_CAPACITY).
//
// ρ counts the sessions the node advertises as in use plus the tickets
// this tracker issued for it in the last PendingWindow: adverts lag behind
// admissions (capacity is re-published every few seconds), and without
// the pending count a burst of requests would all be sent to the same
// cheapest replica. One client's tickets count at most
// MaxPendingPerClient per hop: sessions a client really opens show up in
// the advert soon, and tickets it only hoards must not fill the hop for
// every other client.
//
// Nodes the tracker has not been able to ping for StaleAfter are aged out
// (PeerStats.Stale) even while their advert is still valid.
//
// # Search
//
// The shared planner core (core.go: the capacity filter and the shortest
// path over layer boundaries), with the hop cost above as edge cost.
// Objective latency minimises the sum. Objective throughput minimises the
// slowest stage (compute + queue + relay penalty: with many sessions in
// flight the pipeline runs at the pace of its slowest hop), then the sum.
//
// # Spreading
//
// Edge costs are rounded to Quantum (default 1 ms), and replicas of one
// range within a quantum of the cheapest count as equal to it, so routes
// whose estimates differ by less than measurement noise tie; ties are
// broken by
// the sum of each hop's last-issued sequence number (never issued: 0), so
// the least recently used replicas win and equal routes take turns
// (round robin) instead of piling onto one.

// PeerStats is what a tracker knows about one peer besides its advert.
type PeerStats struct {
	// RTT is the measured round trip tracker ↔ peer (0: not measured).
	RTT time.Duration
	// Relayed: other nodes reach this peer only through a circuit relay.
	Relayed bool
	// Limited: the only path goes through a relay that limits circuits
	// (go-libp2p defaults); the hop is never used.
	Limited bool
	// Stale: the tracker has failed to reach the peer for too long.
	Stale bool
	// MsPerLayer is a measured decode time per layer (0: unknown; the
	// advert's value, then DefaultMsPerLayer, is used).
	MsPerLayer float64
}

// Objective selects what the planner minimises.
type Objective int

const (
	ObjectiveLatency    Objective = iota // per-token time of this session
	ObjectiveThroughput                  // slowest stage, then per-token time
)

func (o Objective) String() string {
	if o == ObjectiveThroughput {
		return "throughput"
	}
	return "latency"
}

// CostModel holds the model's constants; zero fields take the defaults
// from DefaultCostModel.
type CostModel struct {
	DefaultMsPerLayer float64       // unknown compute speed (1 ms)
	DefaultRTT        time.Duration // unknown RTT (20 ms: a typical WAN hop)
	RelayRTTFactor    float64       // relayed one-way latency multiplier (2: the relay's extra leg)
	RelayExtra        time.Duration // fixed relayed-hop penalty (10 ms: shared relay bandwidth)
	LoadSlowdown      float64       // per-token slowdown of a fully busy node (1: twice as slow)
	MaxQueue          float64       // cap of ρ/(1-ρ) (8)
	PendingWindow     time.Duration // issued tickets count as load this long (5 s)
	Quantum           time.Duration // tie tolerance per hop (1 ms)
	// MaxPendingPerClient caps the pending tickets of one client counted
	// per hop (2; Request.Client "" is not capped).
	MaxPendingPerClient int
}

func (m CostModel) withDefaults() CostModel {
	d := DefaultCostModel()
	if m.DefaultMsPerLayer <= 0 {
		m.DefaultMsPerLayer = d.DefaultMsPerLayer
	}
	if m.DefaultRTT <= 0 {
		m.DefaultRTT = d.DefaultRTT
	}
	if m.RelayRTTFactor <= 0 {
		m.RelayRTTFactor = d.RelayRTTFactor
	}
	if m.RelayExtra <= 0 {
		m.RelayExtra = d.RelayExtra
	}
	if m.LoadSlowdown <= 0 {
		m.LoadSlowdown = d.LoadSlowdown
	}
	if m.MaxQueue <= 0 {
		m.MaxQueue = d.MaxQueue
	}
	if m.PendingWindow <= 0 {
		m.PendingWindow = d.PendingWindow
	}
	if m.Quantum <= 0 {
		m.Quantum = d.Quantum
	}
	if m.MaxPendingPerClient <= 0 {
		m.MaxPendingPerClient = d.MaxPendingPerClient
	}
	return m
}

// HopCost is one hop's estimate in milliseconds per token.
type HopCost struct {
	Compute, Latency, Queue float64
	// Stage is the hop's pipeline stage time (throughput objective).
	Stage float64
	// Skip, when not empty, says why the hop is not a candidate.
	Skip string
}

// Total is the hop's per-token time.
func (c HopCost) Total() float64 { return c.Compute + c.Latency + c.Queue }

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Hop estimates one shard's cost; pending is the number of sessions issued
// to the peer that its advert does not show yet.
func (m CostModel) Hop(s Shard, st PeerStats, pending int) HopCost {
	m = m.withDefaults()
	var c HopCost
	switch {
	case st.Limited:
		c.Skip = "only reachable through a relay with limited circuits"
		return c
	case st.Stale:
		c.Skip = "stale: not reachable by the tracker"
		return c
	}
	msl := st.MsPerLayer
	if msl <= 0 {
		msl = float64(s.DecodeMsPerLayer)
	}
	if msl <= 0 {
		msl = m.DefaultMsPerLayer
	}
	rho := 0.0
	if cp := s.Capacity; cp != nil && cp.GetMaxSessions() > 0 {
		used := int(cp.GetMaxSessions()) - int(cp.GetFreeSessions()) + pending
		if used >= int(cp.GetMaxSessions()) {
			c.Skip = "no free session"
			return c
		}
		rho = float64(used) / float64(cp.GetMaxSessions())
	}
	base := float64(s.End-s.Start) * msl
	c.Compute = base * (1 + m.LoadSlowdown*rho)
	c.Queue = base * min(rho/(1-rho), m.MaxQueue)
	rtt := st.RTT
	if rtt <= 0 {
		rtt = m.DefaultRTT
	}
	c.Latency = ms(rtt) / 2
	c.Stage = c.Compute + c.Queue
	if st.Relayed {
		c.Latency = c.Latency*m.RelayRTTFactor + ms(m.RelayExtra)
		c.Stage += ms(m.RelayExtra)
	}
	return c
}

// Estimate is the planner's estimate for a route.
type Estimate struct {
	PerTokenMs   float64   // sum of hop costs
	BottleneckMs float64   // slowest stage
	Hops         []HopCost // per hop, in route order
	Candidates   int       // shards considered
}

// CostPlanner is the tracker's planner: the cost model above over a
// capability table plus the tracker's measurements. Every successful Plan
// is one issued route: it counts as pending load and moves the chosen
// peers to the back of the tie-break order. Safe for concurrent use.
type CostPlanner struct {
	Table *Table
	// Stats returns the tracker's measurements of a peer (nil: none).
	Stats func(peer.ID) PeerStats
	Model CostModel
	// Now defaults to time.Now.
	Now func() time.Time

	mu      sync.Mutex
	seq     uint64
	last    map[peer.ID]uint64          // sequence number of the last route through the peer
	pending map[peer.ID][]pendingTicket // tickets issued within PendingWindow
}

// pendingTicket is one issued ticket through a peer.
type pendingTicket struct {
	at     time.Time
	client peer.ID
}

// Plan implements Planner with the latency objective.
func (p *CostPlanner) Plan(ctx context.Context, req Request) (*Route, error) {
	rt, _, err := p.PlanObjective(ctx, req, ObjectiveLatency)
	return rt, err
}

// PlanObjective plans a route for req under obj and records it as issued.
func (p *CostPlanner) PlanObjective(ctx context.Context, req Request, obj Objective) (*Route, *Estimate, error) {
	if err := checkLayerCount(req); err != nil {
		return nil, nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	m := p.Model.withDefaults()
	now := time.Now()
	if p.Now != nil {
		now = p.Now()
	}
	shards := p.Table.Shards(req.Fingerprint)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.last == nil {
		p.last, p.pending = map[peer.ID]uint64{}, map[peer.ID][]pendingTicket{}
	}
	q := float64(m.Quantum) / float64(time.Millisecond)
	byStart, cands := p.edgesLocked(shards, req, m, now, q)
	tieReplicas(byStart, q)
	preferWarm(byStart, req.Warm)
	pinTakeover(byStart, req.Takeover)
	limit := int64(math.MaxInt64)
	if obj == ObjectiveThroughput {
		limit = bottleneckLimit(byStart)
	}
	path := shortest(byStart, req.MaxHops, limit)
	if path == nil {
		return nil, nil, noRoute(req, cands, shards)
	}
	rt, est := p.issueLocked(path, req, now, len(cands))
	if req.Standby {
		rt.Standby = p.standbyLocked(rt, shards, req, m, now)
	}
	return rt, est, nil
}

// standbyLocked picks rt's hot standby (req.Standby; PickStandby, the warm
// standbys and warm hops first) among the shards the cost model would
// route through now, its pending tickets counted (a standby holds a slot
// like a hop), and counts it as pending load in turn (p.mu held).
func (p *CostPlanner) standbyLocked(rt *Route, shards []Shard, req Request, m CostModel, now time.Time) *StandbyHop {
	avoid := func(id peer.ID) bool { return req.Exclude[id] }
	var ok []Shard
	for _, s := range shards {
		var st PeerStats
		if p.Stats != nil {
			st = p.Stats(s.Peer)
		}
		if m.Hop(s, st, p.pendingLocked(s.Peer, now, m)).Skip == "" {
			ok = append(ok, s)
		}
	}
	sb := PickStandby(rt, ok, req.NeedKV, avoid, append(slices.Clone(req.WarmStandby), req.Warm...))
	if sb != nil {
		p.pending[sb.Hop.Peer] = append(p.pending[sb.Hop.Peer], pendingTicket{at: now, client: req.Client})
	}
	return sb
}

// edgesLocked prices every usable shard the cost model does not skip (p.mu
// held): the edges of the planning graph by start layer, costs in quanta
// of q ms, and the shards they come from.
func (p *CostPlanner) edgesLocked(shards []Shard, req Request, m CostModel, now time.Time, q float64) ([][]edge, []Shard) {
	byStart := make([][]edge, req.NLayer)
	var cands []Shard
	for _, s := range shards {
		s = takeoverShard(s, req)
		if !usable(s, req) {
			continue
		}
		var st PeerStats
		if p.Stats != nil {
			st = p.Stats(s.Peer)
		}
		hc := m.Hop(s, st, p.pendingLocked(s.Peer, now, m))
		if hc.Skip != "" {
			continue
		}
		cands = append(cands, s)
		byStart[s.Start] = append(byStart[s.Start], edge{s: s, hc: hc, cost: int64(math.Round(hc.Total() / q)),
			stage: int64(math.Round(hc.Stage / q)), rec: p.last[s.Peer]})
	}
	return byStart, cands
}

// preferWarm makes a warm shard (Request.Warm: it holds KV the session
// can reuse) win its ties: among replicas of a range at its cost, the
// search's recency tie-break would spread sessions, so the warm edge
// takes the lowest recency and the others at least one more. A faster
// replica still wins: a prefix's prefill is saved once, a slower hop
// costs every token.
func preferWarm(byStart [][]edge, warm []Hop) {
	if len(warm) == 0 {
		return
	}
	for _, es := range byStart {
		for i := range es {
			if !isWarm(es[i].s, warm) {
				continue
			}
			for j := range es {
				if j != i && es[j].s.End == es[i].s.End && es[j].cost == es[i].cost {
					es[j].rec = max(es[j].rec, 1)
				}
			}
			es[i].rec = 0
		}
	}
}

// tieReplicas makes replicas of the same range whose estimates are within
// one quantum (q ms) of the cheapest cost the same: they are ties,
// whichever side of a rounding boundary they fall on (rounding alone made
// 0.49 and 0.51 ms different forever).
func tieReplicas(byStart [][]edge, q float64) {
	for _, es := range byStart {
		best := map[int]edge{}
		for _, e := range es {
			if b, ok := best[e.s.End]; !ok || e.hc.Total() < b.hc.Total() {
				best[e.s.End] = e
			}
		}
		for i := range es {
			b := best[es[i].s.End]
			if es[i].hc.Total()-b.hc.Total() < q {
				es[i].cost = b.cost
			}
			if math.Abs(es[i].hc.Stage-b.hc.Stage) < q {
				es[i].stage = b.stage
			}
		}
	}
}

// bottleneckLimit is the throughput objective's stage limit: the smallest
// bottleneck T with a route using only stages <= T (math.MaxInt64 when
// there is no edge or no route).
func bottleneckLimit(byStart [][]edge) int64 {
	var stages []int64
	for _, es := range byStart {
		for _, e := range es {
			stages = append(stages, e.stage)
		}
	}
	if len(stages) == 0 {
		return math.MaxInt64
	}
	sort.Slice(stages, func(i, j int) bool { return stages[i] < stages[j] })
	i := sort.Search(len(stages), func(i int) bool { return reachable(byStart, stages[i]) })
	if i < len(stages) {
		return stages[i]
	}
	return math.MaxInt64
}

// issueLocked turns path into the issued route and its estimate (of
// candidates shards considered; p.mu held): each hop's peer moves to the back of the tie-break order and
// counts the ticket as pending load.
func (p *CostPlanner) issueLocked(path []edge, req Request, now time.Time, candidates int) (*Route, *Estimate) {
	p.seq++
	est := &Estimate{Candidates: candidates}
	rt := &Route{Fingerprint: req.Fingerprint, NLayer: req.NLayer, Epoch: req.Epoch}
	for _, e := range path {
		reach := p2p.PathDirect
		if p.Stats != nil && p.Stats(e.s.Peer).Relayed {
			reach = p2p.PathRelayed
		}
		rt.Hops = append(rt.Hops, Hop{Peer: e.s.Peer, Start: e.s.Start, End: e.s.End, Addrs: e.s.Addrs, Reach: reach, KernelClass: e.s.KernelClass,
			MsPerLayer: float64(e.s.DecodeMsPerLayer)})
		est.Hops = append(est.Hops, e.hc)
		est.PerTokenMs += e.hc.Total()
		est.BottleneckMs = max(est.BottleneckMs, e.hc.Stage)
		p.last[e.s.Peer] = p.seq
		p.pending[e.s.Peer] = append(p.pending[e.s.Peer], pendingTicket{at: now, client: req.Client})
	}
	return rt, est
}

// pendingLocked prunes tickets older than the window and counts the rest,
// at most m.MaxPendingPerClient per client (anonymous ones uncapped).
func (p *CostPlanner) pendingLocked(id peer.ID, now time.Time, m CostModel) int {
	ts := p.pending[id]
	k := 0
	for _, t := range ts {
		if now.Sub(t.at) < m.PendingWindow {
			ts[k] = t
			k++
		}
	}
	if k == 0 {
		delete(p.pending, id)
		return 0
	}
	p.pending[id] = ts[:k]
	per := map[peer.ID]int{}
	n := 0
	for _, t := range ts[:k] {
		if t.client != "" && per[t.client] >= m.MaxPendingPerClient {
			continue
		}
		per[t.client]++
		n++
	}
	return n
}
