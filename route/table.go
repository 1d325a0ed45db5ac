// Package route turns the swarm's capability adverts into routes (ordered
// hops covering a model's layers) and runs generations along them from the
// origin, re-routing when a hop fails.
package route

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/multiformats/go-multiaddr"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// Shard is one peer's offer of a layer range of one model.
type Shard struct {
	Peer        peer.ID
	Fingerprint string
	ModelName   string
	Arch        string
	NLayer      int
	NEmbd       int
	Start, End  int
	HasVocab    bool
	WireDTypes  []meshp2pb.DType
	Capacity    *meshp2pb.ShardCapacity
	Addrs       []multiaddr.Multiaddr
	Reach       p2p.Path
	ExpiresAt   time.Time
	// DecodeMsPerLayer is the advertised measured cost (0: unknown).
	DecodeMsPerLayer float32
}

// Table is the origin's view of who serves what, fed by discovery.
type Table struct {
	// Reach, if set, reports how this node reaches a peer now (direct or
	// relayed); it overrides the value captured when the advert arrived.
	Reach func(peer.ID) p2p.Path

	mu     sync.RWMutex
	byPeer map[peer.ID][]Shard
	subs   []chan struct{}
}

// NewTable returns an empty table.
func NewTable() *Table { return &Table{byPeer: map[peer.ID][]Shard{}} }

// DecodeAdvert parses an advert body into shards.
func DecodeAdvert(a p2p.Advert) ([]Shard, error) {
	var ca meshp2pb.CapabilityAdvert
	if err := proto.Unmarshal(a.Body, &ca); err != nil {
		return nil, fmt.Errorf("route: advert from %s: %w", a.Peer, err)
	}
	var out []Shard
	for _, s := range ca.GetShards() {
		if s.GetEnd() <= s.GetStart() || s.GetEnd() > s.GetNLayer() || !ValidFingerprint(s.GetModelFingerprint()) {
			continue // malformed entry: ignore, keep the rest
		}
		out = append(out, Shard{
			Peer: a.Peer, Fingerprint: s.GetModelFingerprint(), ModelName: s.GetModelName(), Arch: s.GetArch(),
			NLayer: int(s.GetNLayer()), NEmbd: int(s.GetNEmbd()), Start: int(s.GetStart()), End: int(s.GetEnd()),
			HasVocab: s.GetHasVocab(), WireDTypes: s.GetWireDtypes(), Capacity: s.GetCapacity(),
			Addrs: a.Addrs, Reach: a.Reach, ExpiresAt: a.ExpiresAt, DecodeMsPerLayer: s.GetDecodeMsPerLayer(),
		})
	}
	return out, nil
}

// Set replaces a peer's shards (nil removes the peer).
func (t *Table) Set(p peer.ID, shards []Shard) {
	t.mu.Lock()
	if len(shards) == 0 {
		delete(t.byPeer, p)
	} else {
		t.byPeer[p] = shards
	}
	subs := t.subs
	t.mu.Unlock()
	for _, c := range subs {
		select {
		case c <- struct{}{}:
		default: // a pending notification already covers this change
		}
	}
}

// Changed returns a channel that receives after every table change
// (coalesced: one pending notification at most).
func (t *Table) Changed() <-chan struct{} {
	c := make(chan struct{}, 1)
	t.mu.Lock()
	t.subs = append(t.subs, c)
	t.mu.Unlock()
	return c
}

// Shards lists current offers (discovery removes expired and withdrawn
// adverts) for a model fingerprint (all models when fp is
// empty), ordered by start layer then peer.
func (t *Table) Shards(fp string) []Shard {
	t.mu.RLock()
	var out []Shard
	for _, ss := range t.byPeer {
		for _, s := range ss {
			if fp == "" || s.Fingerprint == fp {
				out = append(out, s)
			}
		}
	}
	t.mu.RUnlock()
	if t.Reach != nil {
		for i := range out {
			if r := t.Reach(out[i].Peer); r != p2p.PathNone {
				out[i].Reach = r
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Start != out[j].Start {
			return out[i].Start < out[j].Start
		}
		return out[i].Peer < out[j].Peer
	})
	return out
}

// Resolve finds the fingerprint of a model given by fingerprint, unique
// fingerprint prefix or model name.
func (t *Table) Resolve(nameOrFP string) (fp string, nLayer int, err error) {
	seen := map[string]int{}
	for _, s := range t.Shards("") {
		if s.Fingerprint == nameOrFP || s.ModelName == nameOrFP || (len(nameOrFP) >= 8 && len(s.Fingerprint) > len(nameOrFP) && s.Fingerprint[:len(nameOrFP)] == nameOrFP) {
			seen[s.Fingerprint] = s.NLayer
		}
	}
	switch len(seen) {
	case 0:
		return "", 0, fmt.Errorf("%w: no peer serves a model named %q", ErrUnknownModel, nameOrFP)
	case 1:
		for f, n := range seen {
			return f, n, nil
		}
	}
	return "", 0, fmt.Errorf("%w: %q matches %d models; give the fingerprint", ErrUnknownModel, nameOrFP, len(seen))
}

// Follow keeps t in step with d until ctx ends: it loads the current
// adverts, then applies every added, updated or removed advert.
func Follow(ctx context.Context, d *p2p.Discovery, t *Table) {
	events := d.Subscribe(ctx)
	for _, a := range d.Adverts() {
		if ss, err := DecodeAdvert(a); err == nil {
			t.Set(a.Peer, ss)
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-events:
			if !ok {
				return
			}
			if ev.Kind == p2p.AdvertRemoved {
				t.Set(ev.Advert.Peer, nil)
				continue
			}
			if ss, err := DecodeAdvert(ev.Advert); err == nil {
				t.Set(ev.Advert.Peer, ss)
			}
		}
	}
}

// ValidFingerprint reports whether fp looks like a model fingerprint: 64
// lowercase hex characters (a sha256). Adverts come from peers; nothing
// else may reach file names or prefixes built from it.
func ValidFingerprint(fp string) bool {
	if len(fp) != 64 {
		return false
	}
	for _, c := range fp {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
