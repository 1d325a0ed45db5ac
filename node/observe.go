package node

import (
	"context"
	"time"

	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/route"
	"github.com/neuron-tai/meshp2p/session"
	"github.com/neuron-tai/meshp2p/status"
)

// observe wires the node's observers into cfg before anything starts:
// the status recorder always, the process's metrics when cfg.Metrics is
// set (go-libp2p's metrics too, through the p2p registerer).
func (n *Node) observe(cfg Config) Config {
	n.recorder = cfg.Recorder
	if n.recorder == nil {
		n.recorder = &status.Recorder{}
	}
	obs := session.HopObservers{n.recorder}
	if m := cfg.Metrics; m != nil {
		obs = append(obs, m)
		if cfg.P2P.Metrics == nil {
			cfg.P2P.Metrics = m.Registry
		}
	}
	if cfg.Hop.Observer != nil {
		obs = append(obs, cfg.Hop.Observer)
	}
	cfg.Hop.Observer = obs
	return cfg
}

// registerGauges adds the node's gauges to its metrics (once p2p and the
// hop service are up; the hop service is fixed from then on, the shard
// may change with a placement move, so it is read at every scrape).
func (n *Node) registerGauges() {
	m := n.cfg.Metrics
	if m == nil {
		return
	}
	m.P2P(n.p2p)
	m.Table(n.table)
	hop := n.hop
	if hop == nil {
		return
	}
	m.Gauge("sessions_active", "Route sessions open on this hop.", func() float64 { return float64(hop.Sessions()) })
	m.Gauge("kv_cells", "KV cache cells of this node's shard.", func() float64 { return float64(n.capacity().NCtx) })
	m.Gauge("kv_cells_used", "KV cache cells reserved by open sessions.", func() float64 {
		c := n.capacity()
		return float64(c.NCtx - c.FreeKV)
	})
	m.Counter("kv_compactions_total", "KV cache compactions of this node's shard (batch invariance; restarts from 0 when the node loads another window).",
		func() float64 { return float64(n.capacity().Compactions) })
	m.Gauge("session_slots", "Session slots of this node's shard (--max-sessions).", func() float64 { return float64(n.capacity().MaxSessions) })
	m.Gauge("decode_seconds_per_layer", "Measured single-row compute time per layer, as advertised.", func() float64 {
		if v := hop.DecodeMsPerLayer(); v > 0 {
			return float64(v) / 1000
		}
		sh, cal := n.servingNow()
		if sh == nil {
			return 0
		}
		return cal.Seconds() / float64(max(1, sh.Info().End-sh.Info().Start))
	})
}

// servingNow is the served shard and its start-up calibration (nil: none
// loaded).
func (n *Node) servingNow() (*engine.Shard, time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.shard, n.calibration
}

// originObserver is what the node's origins report to.
func (n *Node) originObserver() session.OriginObserver {
	obs := session.OriginObservers{n.recorder}
	if m := n.cfg.Metrics; m != nil {
		obs = append(obs, m)
	}
	return obs
}

// Recorder holds the node's running totals and recent routes.
func (n *Node) Recorder() *status.Recorder { return n.recorder }

// StatusCollector builds the node's status document (GET /api/status,
// `meshp2p status --json`).
func (n *Node) StatusCollector(role string) *status.Collector {
	hop := n.hop // fixed once Start returned; the shard may move (placement)
	return &status.Collector{P2P: n.p2p, Table: n.table, Recorder: n.recorder, Self: func() (status.Self, []route.Shard) {
		fp, nl := n.servedModel()
		s := status.Self{PeerID: n.p2p.ID().String(), Role: role, Network: n.cfg.P2P.Network, Model: n.ModelName(), Fingerprint: fp, NLayer: nl}
		for _, a := range n.p2p.Addrs() {
			s.Addrs = append(s.Addrs, a.String())
		}
		if pl := n.Placement(); pl.Auto || pl.Moving != nil || pl.Loading != nil {
			s.Placement = &status.Placement{BudgetBytes: pl.Budget, Start: pl.Current.Start, End: pl.Current.End,
				Loading: window(pl.Loading), Draining: window(pl.Moving), Moves: pl.Moves, LastReason: pl.LastWhy, HealPlan: pl.Plan, ModelReason: pl.ModelWhy}
		}
		sh := n.Shard()
		if sh == nil || hop == nil {
			return s, nil
		}
		c := sh.Capacity()
		s.Sessions, s.MaxSessions, s.KVUsed, s.KVTotal = hop.Sessions(), c.MaxSessions, c.NCtx-c.FreeKV, c.NCtx
		s.MsPerLayer = hop.DecodeMsPerLayer()
		info := sh.Info()
		s.Start, s.End = info.Start, info.End
		n.mu.Lock()
		hasVocab := n.vocabPath != ""
		n.mu.Unlock()
		own := route.Shard{Peer: n.p2p.ID(), Fingerprint: fp, ModelName: n.ModelName(), Arch: info.Arch, NLayer: nl,
			NEmbd: info.NEmbd, Start: info.Start, End: info.End, HasVocab: hasVocab, DecodeMsPerLayer: s.MsPerLayer,
			KernelClass: n.cfg.Device.KernelClass()}
		return s, append([]route.Shard{own}, n.extraRouteShards()...)
	}}
}

// Status builds the node's status document now.
func (n *Node) Status(ctx context.Context, role string) *status.Document {
	return n.StatusCollector(role).Document(ctx)
}

// window is r as a status window (nil for nil).
func window(r *gguf.Range) *status.Window {
	if r == nil {
		return nil
	}
	return &status.Window{Start: r.Start, End: r.End}
}
