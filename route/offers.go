package route

import (
	"sort"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/demand"
	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// Offer is a model a peer holds the whole file of and would load when it
// is asked for and nobody serves it (a standby node's "can be warmed"
// claim, CapabilityAdvert.offers).
type Offer struct {
	Peer        peer.ID
	Fingerprint string
	ModelName   string
	NLayer      int
	Bytes       int64
	// Pinned: the peer holds the last route of a model still asked for
	// and will not switch to this one until that model is idle.
	Pinned    bool
	ExpiresAt time.Time // the advert's
}

// MaxOffers bounds the offers read from one advert (the rest are
// dropped): a peer claims at most this many models it could warm.
const MaxOffers = 16

// MaxModelName bounds an offered model's name.
const MaxModelName = 256

// decodeExtras reads what an advert says besides its shards: the models
// the peer offers to warm (bounded, each checked) and its demand report
// (nil without one). A malformed entry is dropped, the rest kept.
func decodeExtras(a p2p.Advert) ([]Offer, *demand.Report) {
	var ca meshp2pb.CapabilityAdvert
	if err := proto.Unmarshal(a.Body, &ca); err != nil {
		return nil, nil
	}
	var offers []Offer
	for _, o := range ca.GetOffers() {
		if len(offers) == MaxOffers {
			break
		}
		if !ValidFingerprint(o.GetModelFingerprint()) || len(o.GetModelName()) > MaxModelName || o.GetNLayer() == 0 || o.GetNLayer() > gguf.MaxLayers ||
			o.GetBytes() > 1<<50 {
			continue
		}
		offers = append(offers, Offer{Peer: a.Peer, Fingerprint: o.GetModelFingerprint(), ModelName: o.GetModelName(),
			NLayer: int(o.GetNLayer()), Bytes: int64(o.GetBytes()), Pinned: o.GetPinned(), ExpiresAt: a.ExpiresAt})
	}
	d := ca.GetDemand()
	if d == nil || len(d.GetModels()) == 0 {
		return offers, nil
	}
	if len(d.GetModels()) > demand.DefaultMaxModels {
		return offers, nil // over the bound: the whole report is dropped
	}
	rep := &demand.Report{Author: a.Peer.String(), At: time.UnixMilli(d.GetMeasuredAtMs()), Models: map[string]demand.Sample{}}
	for _, m := range d.GetModels() {
		if !ValidFingerprint(m.GetModelFingerprint()) {
			continue
		}
		rep.Models[m.GetModelFingerprint()] = demand.Sample{Requests: m.GetRequests(), Queued: m.GetQueued(),
			Refused: m.GetRefused(), TokensPerSec: m.GetTokensPerSec()}
	}
	return offers, rep
}

// noteExtras records an advert's offers and feeds its demand report to
// the table's demand map (which applies the per-author bounds; a report
// it refuses is dropped). A report is timed by this node's clock when it
// first arrives (a peer's skewed clock neither drops nor discounts its
// demand); the same report again (a re-published advert) is not added.
func (t *Table) noteExtras(a p2p.Advert) {
	offers, rep := decodeExtras(a)
	t.mu.Lock()
	if t.offers == nil {
		t.offers, t.measured = map[peer.ID][]Offer{}, map[peer.ID]time.Time{}
	}
	if len(offers) == 0 {
		delete(t.offers, a.Peer)
	} else {
		t.offers[a.Peer] = offers
	}
	fresh := rep != nil && !t.measured[a.Peer].Equal(rep.At)
	if fresh {
		t.measured[a.Peer] = rep.At
	}
	dm := t.demandMap()
	t.mu.Unlock()
	if fresh {
		now := time.Now()
		rep.At = now
		_ = dm.Add(now, *rep)
	}
}

// demandMap is the table's demand map, created on first use (t.mu held).
func (t *Table) demandMap() *demand.Map {
	if t.demand == nil {
		t.demand = demand.New(t.DemandConfig)
	}
	return t.demand
}

// dropOffers forgets a peer's offers (its advert was removed).
func (t *Table) dropOffers(p peer.ID) {
	t.mu.Lock()
	delete(t.offers, p)
	delete(t.measured, p)
	t.mu.Unlock()
}

// Offers lists the live offers of model fp (every model for ""), by
// model then peer; offers of convicted peers are left out.
func (t *Table) Offers(fp string) []Offer {
	now := time.Now()
	t.mu.RLock()
	var out []Offer
	for p, os := range t.offers {
		if t.convictedLocked(p) {
			continue
		}
		for _, o := range os {
			if (fp == "" || o.Fingerprint == fp) && (o.ExpiresAt.IsZero() || o.ExpiresAt.After(now)) {
				out = append(out, o)
			}
		}
	}
	t.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Fingerprint != out[j].Fingerprint {
			return out[i].Fingerprint < out[j].Fingerprint
		}
		return out[i].Peer < out[j].Peer
	})
	return out
}

// Demand is the swarm's demand per model at now, merged from the adverts'
// reports under package demand's bounds.
func (t *Table) Demand(now time.Time) map[string]demand.Sample {
	t.mu.Lock()
	dm := t.demandMap()
	t.mu.Unlock()
	return dm.Demand(now)
}

// AddDemand merges a report of this node's own (its advert does not come
// back to it through gossip) under the same bounds as the peers'.
func (t *Table) AddDemand(now time.Time, rep demand.Report) error {
	t.mu.Lock()
	dm := t.demandMap()
	t.mu.Unlock()
	return dm.Add(now, rep)
}

// DemandAuthors is how many peers' demand reports the table holds.
func (t *Table) DemandAuthors() int {
	t.mu.Lock()
	dm := t.demandMap()
	t.mu.Unlock()
	return dm.Authors()
}
