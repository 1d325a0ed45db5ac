package status

import (
	"context"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/protocol/ping"

	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/route"
)

// Probe bounds: a peer that is not connected gets one dial and one ping,
// each within ProbeTimeout, at most ProbeParallel at a time and
// MaxProbes per document; its result is kept for ProbeCache, so a page
// polling every second does not dial a dead peer every second.
const (
	ProbeTimeout  = 2 * time.Second
	ProbeParallel = 8
	MaxProbes     = 64
	ProbeCache    = 2 * time.Second
	MaxPeers      = 256 // peers listed in a document
)

// Collector builds Documents from a node's p2p host, route table and
// recorder. Safe for concurrent use.
type Collector struct {
	P2P   *p2p.Node
	Table *route.Table
	// Self describes the local node (its own shard is not in the table:
	// it is added to coverage here, as a live shard).
	Self     func() (Self, []route.Shard)
	Recorder *Recorder

	// round holds the one probe round in flight (a one-slot channel, made
	// under mu): concurrent requests wait for it, bounded by their own
	// context, and reuse its results. Not a mutex, so that a request
	// whose context ends stops waiting for another's dials.
	round  chan struct{}
	mu     sync.Mutex // guards probes and round
	probes map[peer.ID]probe
}

type probe struct {
	at   time.Time
	live bool
	rtt  time.Duration
}

// Document builds a snapshot; ctx bounds the probes.
func (c *Collector) Document(ctx context.Context) *Document {
	doc := &Document{Version: Version, Time: time.Now().UTC(), Models: []Model{}, Peers: []Peer{}, Routes: []Route{}}
	var own []route.Shard
	if c.Self != nil {
		doc.Self, own = c.Self()
	}
	if c.Recorder != nil {
		doc.Counters = c.Recorder.Counters()
		doc.Routes = c.Recorder.Routes()
	}
	doc.Counters.SessionsActive = doc.Self.Sessions
	shards := c.Table.Shards("")
	live := c.probeAll(ctx, shards)
	// Peers found dead lately are listed too, as dead (not probed: their
	// adverts were dropped because a dial failed; route.Table.Departed).
	for _, d := range c.Table.Departed() {
		shards = append(shards, d.Shard)
	}
	doc.Models = c.models(own, shards, live)
	doc.Peers = c.peers(shards, live)
	c.routePaths(doc.Routes)
	doc.Demand = c.demand(doc.Models)
	return doc
}

// demand is every model with demand or offers (and every model on
// offer): served and offered ones first, then by requests, at most
// MaxDemandModels.
func (c *Collector) demand(models []Model) []ModelDemand {
	byFP := map[string]*ModelDemand{}
	get := func(fp, name string) *ModelDemand {
		m := byFP[fp]
		if m == nil {
			m = &ModelDemand{Fingerprint: fp}
			byFP[fp] = m
		}
		if m.Name == "" {
			m.Name = name
		}
		return m
	}
	routable := map[string]bool{}
	for _, m := range models {
		get(m.Fingerprint, m.Name)
		routable[m.Fingerprint] = m.Routable
	}
	offers := map[string]map[peer.ID]bool{}
	for _, o := range c.Table.Offers("") {
		get(o.Fingerprint, o.ModelName)
		if offers[o.Fingerprint] == nil {
			offers[o.Fingerprint] = map[peer.ID]bool{}
		}
		offers[o.Fingerprint][o.Peer] = true
	}
	for fp, s := range c.Table.Demand(time.Now()) {
		m := get(fp, "")
		m.Requests, m.Queued, m.Refused, m.TokensPerSec = s.Requests, s.Queued, s.Refused, s.TokensPerSec
	}
	out := []ModelDemand{}
	for fp, m := range byFP {
		m.Offers = len(offers[fp])
		switch {
		case routable[fp]:
			m.State = "served"
		case m.Offers > 0 && m.Requests > 0:
			m.State = "warming"
		case m.Offers > 0:
			m.State = "warmable"
		default:
			m.State = "unserved"
		}
		out = append(out, *m)
	}
	sort.Slice(out, func(i, j int) bool {
		// Served and offered models first, then by requests: a flood of
		// reports naming unknown models cannot push them out of the list.
		if ki, kj := out[i].State != "unserved", out[j].State != "unserved"; ki != kj {
			return ki
		}
		if out[i].Requests != out[j].Requests {
			return out[i].Requests > out[j].Requests
		}
		return out[i].Fingerprint < out[j].Fingerprint
	})
	return out[:min(len(out), MaxDemandModels)]
}

// MaxDemandModels bounds the models the status document's demand lists.
const MaxDemandModels = 64

// models groups this node's own shards and the other peers' shards by
// model, sorted by name and fingerprint, each with its coverage.
func (c *Collector) models(own, shards []route.Shard, live map[peer.ID]probe) []Model {
	self := c.P2P.ID()
	byFP := map[string]*Model{}
	add := func(s route.Shard, isSelf bool) {
		m := byFP[s.Fingerprint]
		if m == nil {
			m = &Model{Fingerprint: s.Fingerprint, Name: s.ModelName, Arch: s.Arch, NLayer: s.NLayer}
			byFP[s.Fingerprint] = m
		}
		m.Shards = append(m.Shards, c.shard(s, isSelf, live))
	}
	for _, s := range own {
		add(s, true)
	}
	for _, s := range shards {
		if s.Peer != self {
			add(s, false)
		}
	}
	models := []Model{}
	for _, m := range byFP {
		cover(m)
		models = append(models, *m)
	}
	sort.Slice(models, func(i, j int) bool {
		if models[i].Name != models[j].Name {
			return models[i].Name < models[j].Name
		}
		return models[i].Fingerprint < models[j].Fingerprint
	})
	return models
}

// shard is the status of advertised shard s: this node's own (isSelf) or
// another peer's, with its probe result and path.
func (c *Collector) shard(s route.Shard, isSelf bool, live map[peer.ID]probe) Shard {
	sh := Shard{Peer: s.Peer.String(), Self: isSelf, Start: s.Start, End: s.End, Live: true, Path: "self",
		MsPerLayer: s.DecodeMsPerLayer, HasVocab: s.HasVocab, KernelClass: s.KernelClass}
	sh.Backend, sh.Device = BackendOf(s.KernelClass)
	if !isSelf {
		pr := live[s.Peer]
		sh.Live, sh.Path, sh.RTTMs = pr.live, c.pathOf(s.Peer), ms(pr.rtt)
	}
	if cp := s.Capacity; cp != nil {
		sh.FreeSessions, sh.MaxSessions, sh.FreeKV = cp.GetFreeSessions(), cp.GetMaxSessions(), cp.GetFreeKvTokens()
		sh.Planned = !isSelf && sh.MaxSessions == 0
		if sh.MaxSessions > 0 {
			sh.Load = 1 - float64(sh.FreeSessions)/float64(sh.MaxSessions)
		}
	}
	if s.DecodeMsPerLayer > 0 && s.End > s.Start {
		sh.TokensPerSec = 1000 / (float64(s.DecodeMsPerLayer) * float64(s.End-s.Start))
	}
	return sh
}

// cover sorts m's shards by start and peer and fills in its coverage:
// replicas, runs, gaps, and whether it is routable.
func cover(m *Model) {
	sort.Slice(m.Shards, func(i, j int) bool {
		a, b := m.Shards[i], m.Shards[j]
		if a.Start != b.Start {
			return a.Start < b.Start
		}
		return a.Peer < b.Peer
	})
	m.Replicas, m.Runs, m.Gaps = Coverage(m.NLayer, m.Shards)
	// Routable: live shards (this node's own included) cover every
	// layer.
	m.Routable = len(m.Gaps) == 0 && m.NLayer > 0
	if !m.Routable {
		m.Missing = gapText(m.Gaps)
	}
}

// routePaths fills in the path to each hop of routes: "self" for this
// node, else how this node reaches the hop's peer now.
func (c *Collector) routePaths(routes []Route) {
	self := c.P2P.ID()
	for i := range routes {
		for j := range routes[i].Hops {
			if id, err := peer.Decode(routes[i].Hops[j].Peer); err == nil && id != self {
				routes[i].Hops[j].Path = c.pathOf(id)
			} else if err == nil {
				routes[i].Hops[j].Path = "self"
			}
		}
	}
}

// pathOf is the path of this node's connection to p now.
func (c *Collector) pathOf(p peer.ID) string { return c.P2P.ConnStatus(p).Path.String() }

// peers lists every peer that serves a shard or is connected.
func (c *Collector) peers(shards []route.Shard, live map[peer.ID]probe) []Peer {
	byID := map[peer.ID]*Peer{}
	get := func(p peer.ID) *Peer {
		if x := byID[p]; x != nil {
			return x
		}
		st := c.P2P.ConnStatus(p)
		x := &Peer{ID: p.String(), Path: st.Path.String(), Live: st.Path != p2p.PathNone}
		if pr, ok := live[p]; ok {
			x.Live, x.RTTMs = pr.live, ms(pr.rtt)
		}
		if av, err := c.P2P.Host().Peerstore().Get(p, "AgentVersion"); err == nil {
			if s, ok := av.(string); ok && len(s) <= 128 {
				x.Agent = s
			}
		}
		byID[p] = x
		return x
	}
	for _, s := range shards {
		if len(byID) >= MaxPeers {
			break
		}
		x := get(s.Peer)
		name := s.ModelName
		if name == "" && len(s.Fingerprint) >= 16 {
			name = s.Fingerprint[:16]
		}
		x.Layers = append(x.Layers, name+" "+itoa(s.Start)+"-"+itoa(s.End))
	}
	for _, p := range c.P2P.Host().Network().Peers() {
		if len(byID) >= MaxPeers {
			break
		}
		get(p)
	}
	out := make([]Peer, 0, len(byID))
	for _, x := range byID {
		out = append(out, *x)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// probeAll finds out which shard peers are alive: connected peers are
// pinged for RTT; the others get one bounded dial and ping. Results are
// cached for ProbeCache.
func (c *Collector) probeAll(ctx context.Context, shards []route.Shard) map[peer.ID]probe {
	c.mu.Lock()
	if c.round == nil {
		c.round = make(chan struct{}, 1)
	}
	round := c.round
	c.mu.Unlock()
	select {
	case round <- struct{}{}:
		defer func() { <-round }()
	case <-ctx.Done():
		return c.cachedProbes(shards)
	}
	out := map[peer.ID]probe{}
	addrs := map[peer.ID]peer.AddrInfo{}
	for _, s := range shards {
		if s.Peer != c.P2P.ID() {
			addrs[s.Peer] = peer.AddrInfo{ID: s.Peer, Addrs: s.Addrs}
		}
	}
	now := time.Now()
	var todo []peer.AddrInfo
	c.mu.Lock()
	if c.probes == nil {
		c.probes = map[peer.ID]probe{}
	}
	for p, ai := range addrs {
		pr, ok := c.probes[p]
		connected := c.P2P.ConnStatus(p).Path != p2p.PathNone
		switch {
		case ok && now.Sub(pr.at) < ProbeCache && pr.live == connected:
			out[p] = pr
		case len(todo) < MaxProbes:
			todo = append(todo, ai)
		default:
			out[p] = probe{at: now, live: connected}
		}
	}
	for p, pr := range c.probes { // forget peers no longer advertised
		if _, ok := addrs[p]; !ok || now.Sub(pr.at) > time.Minute {
			delete(c.probes, p)
		}
	}
	c.mu.Unlock()

	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, ProbeParallel)
	for _, ai := range todo {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			pr := c.probeOne(ctx, ai)
			mu.Lock()
			out[ai.ID] = pr
			mu.Unlock()
		}()
	}
	wg.Wait()
	c.mu.Lock()
	for _, ai := range todo {
		c.probes[ai.ID] = out[ai.ID]
	}
	c.mu.Unlock()
	return out
}

func (c *Collector) probeOne(ctx context.Context, ai peer.AddrInfo) probe {
	ctx, cancel := context.WithTimeout(ctx, ProbeTimeout)
	defer cancel()
	pr := probe{at: time.Now()}
	if c.P2P.ConnStatus(ai.ID).Path == p2p.PathNone {
		if err := c.P2P.Connect(ctx, ai); err != nil {
			return pr
		}
	}
	pr.live = true // connected; the ping only measures
	select {
	case r := <-ping.Ping(ctx, c.P2P.Host(), ai.ID):
		if r.Error == nil {
			pr.rtt = r.RTT
		}
	case <-ctx.Done():
	}
	return pr
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func gapText(gaps []Run) string {
	s := "no live shard serves layers "
	for i, g := range gaps {
		if i > 0 {
			s += ", "
		}
		s += itoa(g.Start) + "-" + itoa(g.End)
	}
	return s
}

func itoa(i int) string { return strconv.Itoa(i) }

// cachedProbes is probeAll without probing: cached results, else whether
// the peer is connected (a request whose context ended while another
// round ran).
func (c *Collector) cachedProbes(shards []route.Shard) map[peer.ID]probe {
	now := time.Now()
	out := map[peer.ID]probe{}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range shards {
		if s.Peer == c.P2P.ID() {
			continue
		}
		if pr, ok := c.probes[s.Peer]; ok && now.Sub(pr.at) < ProbeCache {
			out[s.Peer] = pr
			continue
		}
		out[s.Peer] = probe{at: now, live: c.P2P.ConnStatus(s.Peer).Path != p2p.PathNone}
	}
	return out
}
