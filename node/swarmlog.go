package node

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/route"
)

// swarmLogCheck is how often the swarm log re-checks models' routability
// without an advert event (the node's own window changes emit none).
const swarmLogCheck = 2 * time.Second

// swarmLog tells the swarm's story in the node's log at the default
// level: peers joining, changing what they serve, leaving (a withdrawn
// advert), dying (their connection closed and they did not answer a
// dial: p2p's liveness check) or going silent (an expired advert), each
// with the layers it serves; and each model becoming routable or losing a
// layer range (with the gap). It keeps its own table from the events, so
// it never races the node's route table, and counts the node's own shards
// (own; nil on a client).
type swarmLog struct {
	log    *slog.Logger
	self   peer.ID
	own    func() []route.Shard
	table  *route.Table
	serves map[peer.ID]string // what each peer serves, as last logged
	// routable is each model's last logged state; a model is logged
	// only once it has been routable (a swarm still gathering is not
	// "not routable" to the log).
	routable map[string]bool
}

func newSwarmLog(log *slog.Logger, self peer.ID, own func() []route.Shard) *swarmLog {
	return &swarmLog{log: log, self: self, own: own, table: route.NewTable(),
		serves: map[peer.ID]string{}, routable: map[string]bool{}}
}

// run follows d until ctx ends.
func (l *swarmLog) run(ctx context.Context, d *p2p.Discovery) {
	events := d.Subscribe(ctx)
	for _, a := range d.Adverts() {
		l.event(p2p.AdvertEvent{Kind: p2p.AdvertAdded, Advert: a})
	}
	tick := time.NewTicker(swarmLogCheck)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-events:
			if !ok {
				return
			}
			l.event(ev)
		case <-tick.C:
		}
		l.models()
	}
}

// event logs one advert change and applies it to the log's table.
func (l *swarmLog) event(ev p2p.AdvertEvent) {
	p := ev.Advert.Peer
	if ev.Kind == p2p.AdvertRemoved {
		serves, known := l.serves[p]
		delete(l.serves, p)
		l.table.Set(p, nil)
		if !known {
			return
		}
		switch ev.Reason {
		case p2p.ReasonWithdrawn:
			l.log.Info("peer left", "peer", p, "served", serves)
		case p2p.ReasonUnreachable:
			l.log.Warn("peer died: its connection closed and it does not answer", "peer", p, "served", serves)
		case p2p.ReasonExpired:
			l.log.Warn("peer went silent: its advert expired", "peer", p, "served", serves)
		default:
			l.log.Debug("peer dropped from the advert table", "peer", p, "reason", ev.Reason, "served", serves)
		}
		return
	}
	shards, err := route.DecodeAdvert(ev.Advert)
	if err != nil {
		return
	}
	l.table.Set(p, shards)
	serves := describeShards(shards)
	old, known := l.serves[p]
	l.serves[p] = serves
	switch {
	case !known:
		l.log.Info("peer joined", "peer", p, "serves", serves, "path", ev.Advert.Reach.String())
	case old != serves:
		l.log.Info("peer now serves", "peer", p, "serves", serves, "was", old)
	}
}

// models logs each model whose routability changed.
func (l *swarmLog) models() {
	if l.own != nil {
		l.table.Set(l.self, l.own())
	}
	fps := map[string]string{}
	for _, s := range l.table.Shards("") {
		fps[s.Fingerprint] = s.ModelName
	}
	for fp, name := range fps {
		nl, err := l.table.LayerCount(fp)
		if err != nil {
			continue
		}
		start, end, covered := l.table.Gap(fp, nl)
		was, logged := l.routable[fp]
		switch {
		case covered && !was:
			l.log.Info("model routable: every layer is served", "model", name, "fingerprint", fp[:min(len(fp), 16)], "layers", nl)
		case !covered && logged && was:
			l.log.Warn("model not routable: no peer serves some layers", "model", name, "missing", fmt.Sprintf("%d-%d", start, end), "layers", nl)
		}
		if covered || logged {
			l.routable[fp] = covered
		}
	}
	for fp, was := range l.routable {
		if _, ok := fps[fp]; !ok && was {
			l.log.Warn("model not routable: no peer serves any of its layers", "fingerprint", fp[:min(len(fp), 16)])
			delete(l.routable, fp)
		}
	}
}

// describeShards is what a peer serves, as "name A-B" per shard ("choosing
// its layers" when it serves none yet).
func describeShards(ss []route.Shard) string {
	if len(ss) == 0 {
		return "no layers (choosing, or a client)"
	}
	parts := make([]string, 0, len(ss))
	for _, s := range ss {
		name := s.ModelName
		if name == "" {
			name = s.Fingerprint[:min(len(s.Fingerprint), 12)]
		}
		parts = append(parts, fmt.Sprintf("%s %d-%d", name, s.Start, s.End))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}
