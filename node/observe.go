package node

import (
	"github.com/neuron-tai/meshp2p/metrics"
	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
	"github.com/neuron-tai/meshp2p/session"
	"github.com/neuron-tai/meshp2p/status"
)

// observers are what the node's hop and origins report to: the status
// recorder always, the process's metrics when Config.Metrics is set.
type observers struct {
	recorder *status.Recorder // totals and recent routes for the status document
	metrics  *metrics.Metrics
	// sessions receives (coalesced) when a session is admitted or ends,
	// so the advertiser re-publishes the capacity at once (advert.go).
	sessions sessionSignal
}

// sessionSignal is a hop observer that signals its channel (one pending
// signal at most) whenever a session is admitted or ends.
type sessionSignal struct {
	session.NopHop
	c chan struct{}
}

func (r sessionSignal) SessionAdmitted(session.SessionInfo) { r.signal() }
func (r sessionSignal) SessionEnded(meshp2pb.ErrorCode)     { r.signal() }

func (r sessionSignal) signal() {
	select {
	case r.c <- struct{}{}:
	default:
	}
}

// newObservers wires the observers into cfg before anything starts: the
// hop's observer, and go-libp2p's metrics through the p2p registerer.
func newObservers(cfg Config) (*observers, Config) {
	o := &observers{recorder: cfg.Recorder, metrics: cfg.Metrics, sessions: sessionSignal{c: make(chan struct{}, 1)}}
	if o.recorder == nil {
		o.recorder = &status.Recorder{}
	}
	obs := session.HopObservers{o.recorder, o.sessions}
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
	return o, cfg
}

// origin is what the node's origins report to.
func (o *observers) origin() session.OriginObserver {
	obs := session.OriginObservers{o.recorder}
	if m := o.metrics; m != nil {
		obs = append(obs, m)
	}
	return obs
}

// gauges adds the node's gauges to its metrics (once p2p and the hop
// service are up; the hop service is fixed from then on, nil on a client;
// the window may change with a placement move, so it is read from set at
// every scrape).
func (o *observers) gauges(p *p2p.Node, table *route.Table, hop *session.HopService, set *served) {
	m := o.metrics
	if m == nil {
		return
	}
	m.P2P(p)
	m.Table(table)
	if hop == nil {
		return
	}
	m.Gauge("sessions_active", "Route sessions open on this hop.", func() float64 { return float64(hop.Sessions()) })
	m.Gauge("kv_cells", "KV cache cells of this node's shard.", func() float64 { return float64(set.capacity().NCtx) })
	m.Gauge("kv_cells_used", "KV cache cells reserved by open sessions.", func() float64 {
		c := set.capacity()
		return float64(c.NCtx - c.FreeKV)
	})
	m.Counter("kv_compactions_total", "KV cache compactions of this node's shard (batch invariance; restarts from 0 when the node loads another window).",
		func() float64 { return float64(set.capacity().Compactions) })
	m.Gauge("prefix_cache_cells", "KV cells of this node's prefix cache (--prefix-cache).", func() float64 { return float64(set.capacity().PrefixCells) })
	m.Gauge("prefix_cache_cells_used", "Prefix cache cells holding finished sessions' prefixes.", func() float64 { return float64(set.capacity().PrefixHeld) })
	m.Gauge("prefix_cache_entries", "Prefixes this node's prefix cache keeps.", func() float64 { return float64(set.capacity().PrefixEntries) })
	standbyCounters(m, hop)
	m.Gauge("session_slots", "Session slots of this node's shard (--max-sessions).", func() float64 { return float64(set.capacity().MaxSessions) })
	m.Gauge("decode_seconds_per_layer", "Measured single-row compute time per layer, as advertised.", func() float64 {
		if v := hop.DecodeMsPerLayer(); v > 0 {
			return float64(v) / 1000
		}
		now := set.now()
		if !now.serving {
			return 0
		}
		return now.calibration.Seconds() / float64(max(1, now.window.Len()))
	})
}

// standbyCounters registers what hot standbys cost and did on hop
// (session.StandbyStats): as a standby and as the hop that mirrors its
// input frames to one.
func standbyCounters(m *metrics.Metrics, hop *session.HopService) {
	for _, c := range []struct {
		name, help string
		v          func(session.StandbyStats) float64
	}{
		{"standby_sessions_total", "Sessions this node stood by for as a hot standby.", func(s session.StandbyStats) float64 { return float64(s.Sessions) }},
		{"standby_rows_total", "Rows this node computed as a standby (outputs discarded).", func(s session.StandbyStats) float64 { return float64(s.Rows) }},
		{"standby_compute_seconds_total", "Engine time this node spent computing as a standby.", func(s session.StandbyStats) float64 { return s.Compute.Seconds() }},
		{"standby_mirrored_frames_total", "Input frames this node mirrored to the standbys of its sessions.", func(s session.StandbyStats) float64 { return float64(s.MirrorFrames) }},
		{"standby_mirrored_bytes_total", "Payload bytes of those frames.", func(s session.StandbyStats) float64 { return float64(s.MirrorBytes) }},
		{"standby_dropped_total", "Standbys this node stopped mirroring to (lagging behind the bounded queue, or failed).", func(s session.StandbyStats) float64 { return float64(s.Dropped) }},
	} {
		m.Counter(c.name, c.help, func() float64 { return c.v(hop.StandbyStats()) })
	}
}
