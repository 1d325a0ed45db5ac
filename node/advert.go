package node

import (
	"cmp"
	"context"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/demand"
	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
)

// advertiser publishes the node's capability advert: what the served set
// serves and placement plans (served.describe) and the demand this node's
// origins measured. Building the advert and setting it are one step under
// mu, so two publishes at once (the loops, placement, the served set's
// changes) cannot leave the older body in place, nor keys of one model
// with the body of another. Lock order: mu before served.mu.
type advertiser struct {
	local   localAdvert
	self    peer.ID
	network string
	set     *served
	log     *slog.Logger
	// place is the node's placement controller (nil on a client); set in
	// Start before the first publish and the loops, read-only after.
	place *placementController
	// sessions receives when a session was admitted or ended on this
	// node's hop (observers.sessions): the loop re-checks capacity then,
	// at most every AdvertSessionGap, not only on its tick.
	sessions <-chan struct{}
	every    time.Duration // the check's period (0: AdvertCheckInterval)

	mu     sync.Mutex
	demand *meshp2pb.DemandReport // the last demand report (demandLoop)
	body   []byte                 // the last advert body set (ownShards)
}

// localAdvert is where an advert goes (p2p.Discovery).
type localAdvert interface {
	SetLocalAdvert(keys []string, body []byte) error
}

// publish sets the local advert.
func (a *advertiser) publish() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	ca := &meshp2pb.CapabilityAdvert{
		PeerId: []byte(a.self), Network: a.network, Roles: []meshp2pb.Role{meshp2pb.Role_ROLE_SHARD},
		Version: engine.Version, Demand: a.demand,
	}
	keys := a.set.describe(ca, a.place)
	body, err := proto.Marshal(ca)
	if err != nil {
		return err
	}
	a.body = body
	return a.local.SetLocalAdvert(keys, body)
}

// ownShards are the shards the node's last advert lists.
func (a *advertiser) ownShards() []route.Shard {
	a.mu.Lock()
	body := a.body
	a.mu.Unlock()
	if body == nil {
		return nil
	}
	ss, _ := route.DecodeAdvert(p2p.Advert{Peer: a.self, Body: body})
	return ss
}

// loop re-publishes when free capacity or measured speed changes (checked
// every AdvertCheckInterval, and when a session is admitted or ends, at
// most every AdvertSessionGap), until ctx ends. Sessions are checked at
// once because planners skip peers whose advert shows no room: on the
// tick alone, a slot freed just after one stayed invisible for up to
// AdvertCheckInterval (an origin waiting for room waited that long), and
// a node that filled up kept drawing opens it had to refuse.
func (a *advertiser) loop(ctx context.Context) {
	t := time.NewTicker(cmp.Or(a.every, AdvertCheckInterval))
	defer t.Stop()
	gap := time.NewTimer(0) // fires when a release may re-check again
	defer gap.Stop()
	var open, pending bool    // the gap has passed; a release waits for it
	hop := a.set.hopService() // made with the first window, before the loop
	last, lastSpeed, lastExtras := a.set.capacity(), hop.DecodeMsPerLayer(), a.set.extraCapacities()
	check := func() {
		c, sp, ex := a.set.capacity(), hop.DecodeMsPerLayer(), a.set.extraCapacities()
		// Re-publish on capacity changes (extra models' too), or when
		// the measured speed moved by more than a quarter (the
		// tracker's cost model).
		if c != last || !slices.Equal(ex, lastExtras) || math.Abs(float64(sp-lastSpeed)) > AdvertSpeedChange*float64(max(lastSpeed, 1e-6)) {
			last, lastSpeed, lastExtras = c, sp, ex
			if err := a.publish(); err != nil {
				a.log.Warn("re-publish advert", "err", err)
			}
		}
	}
	now := func() {
		open, pending = false, false
		gap.Reset(AdvertSessionGap)
		check()
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			check()
		case <-a.sessions:
			if open {
				now()
			} else {
				pending = true
			}
		case <-gap.C:
			open = true
			if pending {
				now()
			}
		}
	}
}

// demandLoop turns the meter into a report every iv (0:
// DefaultDemandInterval), merges it into table and re-publishes the
// advert with it (and once more without, when demand stops).
func (a *advertiser) demandLoop(ctx context.Context, meter *demand.Meter, table *route.Table, iv time.Duration) {
	if iv <= 0 {
		iv = DefaultDemandInterval
	}
	t := time.NewTicker(iv)
	defer t.Stop()
	had := false
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			rep, ok := meter.Take(now, a.self.String())
			if !ok && !had {
				continue
			}
			had = ok
			var dr *meshp2pb.DemandReport
			if ok {
				if err := table.AddDemand(now, rep); err != nil {
					a.log.Debug("own demand report not merged", "err", err)
				}
				dr = demandReport(now, rep)
			}
			a.mu.Lock()
			a.demand = dr
			a.mu.Unlock()
			if err := a.publish(); err != nil {
				a.log.Warn("re-publish advert with demand", "err", err)
			}
		}
	}
}

// demandReport is rep as the advert carries it: the most requested models
// first, at most MaxAdvertDemand (the advert's body is bounded, 16 KiB,
// and carries shards and offers too).
func demandReport(now time.Time, rep demand.Report) *meshp2pb.DemandReport {
	dr := &meshp2pb.DemandReport{MeasuredAtMs: now.UnixMilli()}
	for fp, s := range rep.Models {
		dr.Models = append(dr.Models, &meshp2pb.ModelDemand{ModelFingerprint: fp, Requests: s.Requests, Queued: s.Queued,
			Refused: s.Refused, TokensPerSec: s.TokensPerSec})
	}
	slices.SortFunc(dr.Models, func(a, b *meshp2pb.ModelDemand) int {
		if c := cmp.Compare(b.Requests, a.Requests); c != 0 {
			return c
		}
		return cmp.Compare(a.ModelFingerprint, b.ModelFingerprint)
	})
	dr.Models = dr.Models[:min(len(dr.Models), MaxAdvertDemand)]
	return dr
}

// MaxAdvertDemand bounds the models of the demand report in a node's
// advert (the most requested).
const MaxAdvertDemand = 32

// NameKey is the discovery key under which a model name is announced.
func NameKey(name string) string { return route.NameKey(name) }
