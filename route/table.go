package route

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/multiformats/go-multiaddr"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/demand"
	"github.com/neuron-tai/meshp2p/engine/gguf"
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
	// PlacementBudget is the memory a self-placing node advertises (0: it
	// serves fixed layers).
	PlacementBudget int64
	// KernelClass is the shard's engine kernel class (engine.KernelClass;
	// empty from older nodes): hops of one class compute bitwise the same
	// rows for the same input.
	KernelClass string
}

// Table is the origin's view of who serves what, fed by discovery.
type Table struct {
	// Reach, if set, reports how this node reaches a peer now (direct or
	// relayed); it overrides the value captured when the advert arrived.
	Reach func(peer.ID) p2p.Path

	mu     sync.RWMutex
	byPeer map[peer.ID][]Shard
	subs   []chan struct{}
	// trusted are the trackers whose published convictions this table
	// honours; convicted what each published (shards of those peers are
	// left out).
	trusted   map[peer.ID]bool
	convicted map[peer.ID]map[peer.ID]bool
	// offers are the models each peer offers to warm; demand merges the
	// peers' demand reports (offers.go).
	offers   map[peer.ID][]Offer
	measured map[peer.ID]time.Time // each peer's last demand report (its measured_at)
	demand   *demand.Map
	// departed are dead peers' last shards (departed.go).
	departed map[peer.ID]departure
	// DemandConfig bounds the demand map (zero: package demand's
	// defaults); set before the table is used.
	DemandConfig demand.Config
}

// MaxPublishedConvictions bounds the convictions one tracker advert
// carries (and a table reads from one).
const MaxPublishedConvictions = 256

// TrustConvictions makes the table drop the shards of peers the given
// trackers published as convicted (their adverts' `convicted`).
func (t *Table) TrustConvictions(trackers ...peer.ID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.trusted == nil {
		t.trusted, t.convicted = map[peer.ID]bool{}, map[peer.ID]map[peer.ID]bool{}
	}
	for _, p := range trackers {
		t.trusted[p] = true
	}
}

// Convicted reports whether a trusted tracker published p as convicted.
func (t *Table) Convicted(p peer.ID) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.convictedLocked(p)
}

func (t *Table) convictedLocked(p peer.ID) bool {
	for _, set := range t.convicted {
		if set[p] {
			return true
		}
	}
	return false
}

// noteConvictions reads a trusted tracker's published convictions from
// its advert.
func (t *Table) noteConvictions(a p2p.Advert) {
	t.mu.RLock()
	trusted := t.trusted[a.Peer]
	t.mu.RUnlock()
	if !trusted {
		return
	}
	var ca meshp2pb.CapabilityAdvert
	if err := proto.Unmarshal(a.Body, &ca); err != nil {
		return
	}
	set := map[peer.ID]bool{}
	for _, c := range ca.GetConvicted()[:min(len(ca.GetConvicted()), MaxPublishedConvictions)] {
		if id, err := peer.IDFromBytes(c.GetPeerId()); err == nil {
			set[id] = true
		}
	}
	t.mu.Lock()
	t.convicted[a.Peer] = set
	t.mu.Unlock()
}

// NewTable returns an empty table.
func NewTable() *Table { return &Table{byPeer: map[peer.ID][]Shard{}} }

// DecodeAdvert parses an advert body into shards. Every advertised number
// comes from a peer and is checked here, before any planner sizes anything
// by it; a shard that fails a check is dropped (the rest of the advert is
// kept) and counted in the error-free result's absence.
func DecodeAdvert(a p2p.Advert) ([]Shard, error) {
	var ca meshp2pb.CapabilityAdvert
	if err := proto.Unmarshal(a.Body, &ca); err != nil {
		return nil, fmt.Errorf("route: advert from %s: %w", a.Peer, err)
	}
	var out []Shard
	for _, s := range ca.GetShards() {
		if checkShard(s) != nil {
			continue // malformed or lying entry: ignore, keep the rest
		}
		out = append(out, Shard{
			Peer: a.Peer, Fingerprint: s.GetModelFingerprint(), ModelName: s.GetModelName(), Arch: s.GetArch(),
			NLayer: int(s.GetNLayer()), NEmbd: int(s.GetNEmbd()), Start: int(s.GetStart()), End: int(s.GetEnd()),
			HasVocab: s.GetHasVocab(), WireDTypes: s.GetWireDtypes(), Capacity: s.GetCapacity(),
			Addrs: a.Addrs, Reach: a.Reach, ExpiresAt: a.ExpiresAt, DecodeMsPerLayer: s.GetDecodeMsPerLayer(),
			PlacementBudget: int64(min(s.GetPlacementBudget(), math.MaxInt64)),
			KernelClass:     s.GetKernelClass(),
		})
	}
	return out, nil
}

// Bounds on advertised numbers (checkShard).
const (
	// MaxEmbd bounds n_embd (the largest public models use 16384).
	MaxEmbd = 1 << 16
	// MaxKernelClass bounds the kernel class string (engine.KernelClass).
	MaxKernelClass = 256
	// MaxAdvertSessions bounds max_sessions per shard.
	MaxAdvertSessions = 1 << 12
	// MaxAdvertMsPerLayer bounds the advertised decode cost (a minute per
	// layer is no shard anyone would route through).
	MaxAdvertMsPerLayer = 60_000
)

// ErrBadAdvert marks an advertised shard that fails a bound.
var ErrBadAdvert = errors.New("route: advertised shard out of bounds")

// MemberAdvert reports whether an advert lists at least one shard inside
// DecodeAdvert's bounds: what makes its author a member for an open
// relay's ACL (p2p.Config.MemberAdvert; a garbage advert makes no one a
// member).
func MemberAdvert(a p2p.Advert) bool {
	shards, err := DecodeAdvert(a)
	return err == nil && len(shards) > 0
}

// Choosing reports whether an advert is a node's that serves layers (its
// role) but lists none yet: a node placing itself, about to announce the
// window it chose (a client waiting for a route keeps waiting for it).
func Choosing(a p2p.Advert) bool {
	var ca meshp2pb.CapabilityAdvert
	if err := proto.Unmarshal(a.Body, &ca); err != nil {
		return false
	}
	return slices.Contains(ca.GetRoles(), meshp2pb.Role_ROLE_SHARD) && len(ca.GetShards()) == 0
}

// checkShard validates one advertised shard: layer counts within what a
// model can have (gguf.MaxLayers, llama.cpp's limit), a range inside them,
// a plausible width, capacity that does not exceed itself, and a finite,
// non-negative speed.
func checkShard(s *meshp2pb.ShardAdvert) error {
	bad := func(f string, args ...any) error {
		return fmt.Errorf("%w: "+f, append([]any{ErrBadAdvert}, args...)...)
	}
	c := s.GetCapacity()
	ms := float64(s.GetDecodeMsPerLayer())
	switch {
	case !ValidFingerprint(s.GetModelFingerprint()):
		return bad("fingerprint %q", s.GetModelFingerprint())
	case s.GetNLayer() == 0 || s.GetNLayer() > gguf.MaxLayers:
		return bad("n_layer %d not in 1..%d", s.GetNLayer(), gguf.MaxLayers)
	case s.GetEnd() <= s.GetStart() || s.GetEnd() > s.GetNLayer():
		return bad("range %d-%d of %d layers", s.GetStart(), s.GetEnd(), s.GetNLayer())
	case s.GetNEmbd() == 0 || s.GetNEmbd() > MaxEmbd:
		return bad("n_embd %d not in 1..%d", s.GetNEmbd(), MaxEmbd)
	case c.GetMaxSessions() > MaxAdvertSessions || c.GetFreeSessions() > c.GetMaxSessions():
		return bad("sessions %d free of %d", c.GetFreeSessions(), c.GetMaxSessions())
	case math.IsNaN(ms) || math.IsInf(ms, 0) || ms < 0 || ms > MaxAdvertMsPerLayer:
		return bad("decode speed %v ms/layer", ms)
	case len(s.GetKernelClass()) > MaxKernelClass:
		return bad("kernel class of %d bytes (at most %d)", len(s.GetKernelClass()), MaxKernelClass)
	}
	return nil
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
// (coalesced: one pending notification at most) until ctx ends, when the
// subscription is dropped.
func (t *Table) Changed(ctx context.Context) <-chan struct{} {
	c := make(chan struct{}, 1)
	t.mu.Lock()
	t.subs = append(t.subs, c)
	t.mu.Unlock()
	context.AfterFunc(ctx, func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		// A new slice: Set notifies from a copy of the slice header taken
		// under the lock, so the array it reads must never change.
		t.subs = slices.DeleteFunc(slices.Clone(t.subs), func(s chan struct{}) bool { return s == c })
	})
	return c
}

// Covers reports whether the shards of model fp with nl layers chain from
// layer 0 to nl, load aside (peers that are full now count).
func (t *Table) Covers(fp string, nl int) bool {
	reach := make([]bool, nl+1)
	if nl <= 0 {
		return false
	}
	reach[0] = true
	ss := t.Shards(fp) // ordered by start layer
	for _, s := range ss {
		if s.NLayer == nl && s.Start >= 0 && s.End <= nl && s.Start < s.End && reach[s.Start] {
			reach[s.End] = true
		}
	}
	return reach[nl]
}

// Gap is the first layer range [start, end) of model fp with nl layers
// that no shard chain from layer 0 reaches (load aside), as the planner
// names it; covered when there is none.
func (t *Table) Gap(fp string, nl int) (start, end int, covered bool) {
	var cands []Shard
	for _, s := range t.Shards(fp) {
		if s.NLayer == nl {
			cands = append(cands, s)
		}
	}
	e := gap(Request{Fingerprint: fp, NLayer: nl}, cands)
	if e.MissingStart >= e.MissingEnd {
		return nl, nl, true
	}
	return e.MissingStart, e.MissingEnd, false
}

// subscribers is how many Changed subscriptions are live (tests).
func (t *Table) subscribers() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.subs)
}

// Shards lists current offers for a model fingerprint (all models when fp
// is empty), ordered by start layer then peer. Expired offers are left out
// even if discovery's removal event was lost.
func (t *Table) Shards(fp string) []Shard {
	now := time.Now()
	t.mu.RLock()
	var out []Shard
	for p, ss := range t.byPeer {
		if t.convictedLocked(p) {
			continue // a trusted tracker verified a fraud proof against it
		}
		for _, s := range ss {
			if (fp == "" || s.Fingerprint == fp) && (s.ExpiresAt.IsZero() || s.ExpiresAt.After(now)) {
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

// MinPrefix is the shortest fingerprint prefix Resolve accepts.
const MinPrefix = 16

// Fingerprint finds the fingerprint of a model given by fingerprint,
// unique fingerprint prefix (at least MinPrefix hex characters) or model
// name. It looks at no layer count: what peers claim about that cannot
// make a model unresolvable.
//
// A name is a claim anyone can make, so it resolves by a trust rule: to
// the fingerprint that the most distinct peers advertise under that name,
// when it has strictly more than any other (a stranger advertising
// another model under a popular name neither takes nor blocks it);
// otherwise the name is ambiguous, and the error lists the candidates,
// each reachable by its fingerprint. A fingerprint or prefix is exact.
//
// Served models come first: an offer (a standby peer's claim that it
// could warm a model) costs an advert and nothing else, so offers count
// for a name only when no peer serves a model under it. Free keys offering
// another fingerprint under a served name can neither tie nor take it.
func (t *Table) Fingerprint(nameOrFP string) (string, error) {
	exact := map[string]bool{}
	named := map[string]map[peer.ID]bool{}
	offered := map[string]map[peer.ID]bool{}
	claim := func(byName map[string]map[peer.ID]bool, p peer.ID, fp, name string) {
		if fp == nameOrFP || (len(nameOrFP) >= MinPrefix && strings.HasPrefix(fp, nameOrFP)) {
			exact[fp] = true
		} else if name == nameOrFP {
			if byName[fp] == nil {
				byName[fp] = map[peer.ID]bool{}
			}
			byName[fp][p] = true
		}
	}
	for _, s := range t.Shards("") {
		claim(named, s.Peer, s.Fingerprint, s.ModelName)
	}
	for _, o := range t.Offers("") {
		claim(offered, o.Peer, o.Fingerprint, o.ModelName)
	}
	if len(named) == 0 {
		named = offered
	}
	switch len(exact) {
	case 0:
	case 1:
		for f := range exact {
			return f, nil
		}
	default:
		return "", fmt.Errorf("%w: %w: %q matches %d models; give the fingerprint", ErrUnknownModel, ErrAmbiguousModel, nameOrFP, len(exact))
	}
	if len(named) == 0 {
		return "", fmt.Errorf("%w: no peer serves or offers a model named %q", ErrUnknownModel, nameOrFP)
	}
	best, bestN, second := "", 0, 0
	var cands []string
	for f, peers := range named {
		cands = append(cands, fmt.Sprintf("%.16s… (%d peers)", f, len(peers)))
		switch n := len(peers); {
		case n > bestN:
			best, bestN, second = f, n, bestN
		case n > second:
			second = n
		}
	}
	if bestN > second {
		return best, nil
	}
	sort.Strings(cands)
	return "", fmt.Errorf("%w: %w: %q is advertised for %d models by as many peers each: %s; give the fingerprint",
		ErrUnknownModel, ErrAmbiguousModel, nameOrFP, len(named), strings.Join(cands, ", "))
}

// Resolve is Fingerprint and the layer count peers vote for (LayerCount).
// The vote is only a fallback for callers that cannot verify the count:
// the fingerprint binds it, and the verified value comes from the model's
// vocabulary file or manifest (gguf.CheckVocabLayers), never from adverts.
func (t *Table) Resolve(nameOrFP string) (fp string, nLayer int, err error) {
	fp, err = t.Fingerprint(nameOrFP)
	if err != nil {
		return "", 0, err
	}
	n, err := t.LayerCount(fp)
	return fp, n, err
}

// LayerCount is the layer count most peers advertise for fingerprint fp,
// each peer counted once per count it claims however many shards it lists
// (one advert cannot outweigh others). It is a vote, for callers that
// cannot verify the count (listing, the status command): the fingerprint
// binds it, and shards that disagree with the verified count are left out
// by the planners, which match NLayer exactly. A tie is refused.
func (t *Table) LayerCount(fp string) (int, error) {
	peers := map[int]map[peer.ID]bool{} // n_layer → peers claiming it
	for _, s := range t.Shards(fp) {
		if peers[s.NLayer] == nil {
			peers[s.NLayer] = map[peer.ID]bool{}
		}
		peers[s.NLayer][s.Peer] = true
	}
	votes := make(map[int]int, len(peers))
	for n, ps := range peers {
		votes[n] = len(ps)
	}
	best, bestN, tie := 0, 0, false
	for n, c := range votes {
		switch {
		case c > bestN:
			best, bestN, tie = n, c, false
		case c == bestN:
			tie = true
		}
	}
	switch {
	case bestN == 0:
		return 0, fmt.Errorf("%w: no peer advertises model %.16s", ErrUnknownModel, fp)
	case tie:
		return 0, fmt.Errorf("%w: peers disagree on the layer count of %.16s (%v); refusing", ErrUnknownModel, fp, votes)
	}
	return best, nil
}

// NameKey is the discovery key (DHT provider record) under which peers
// announce a model name; a model's fingerprint is its own key.
func NameKey(name string) string { return "name:" + name }

// Follow keeps t in step with d until ctx ends: it loads the current
// adverts, then applies every added, updated or removed advert. Events come
// through a drop-oldest channel, so every followResync it also rebuilds the
// table from d's full state (a lost removal would keep a dead peer, a lost
// addition would hide a live one).
func Follow(ctx context.Context, d *p2p.Discovery, t *Table) {
	events := d.Subscribe(ctx)
	t.resync(d.Adverts())
	tick := time.NewTicker(followResync)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			t.resync(d.Adverts())
		case ev, ok := <-events:
			if !ok {
				return
			}
			if ev.Kind == p2p.AdvertRemoved {
				if ev.Reason == p2p.ReasonUnreachable {
					t.markDeparted(ev.Advert.Peer, time.Now())
				}
				t.dropOffers(ev.Advert.Peer)
				t.Set(ev.Advert.Peer, nil)
				continue
			}
			t.Apply(ev.Advert)
		}
	}
}

// Apply records one advert as Follow does: its shards, its offers and
// demand report, and (from a trusted tracker) its convictions.
func (t *Table) Apply(a p2p.Advert) {
	t.noteConvictions(a)
	t.noteExtras(a)
	if ss, err := DecodeAdvert(a); err == nil {
		t.Set(a.Peer, ss)
	}
}

// followResync is how often Follow rebuilds the table from discovery.
const followResync = 10 * time.Second

// resync makes the table hold exactly the given adverts.
func (t *Table) resync(ads []p2p.Advert) {
	keep := make(map[peer.ID]bool, len(ads))
	for _, a := range ads {
		keep[a.Peer] = true
		t.Apply(a)
	}
	t.mu.RLock()
	var gone []peer.ID
	for p := range t.byPeer {
		if !keep[p] {
			gone = append(gone, p)
		}
	}
	for p := range t.offers {
		if !keep[p] && t.byPeer[p] == nil {
			gone = append(gone, p)
		}
	}
	for p := range t.measured {
		if !keep[p] && t.byPeer[p] == nil && t.offers[p] == nil {
			gone = append(gone, p)
		}
	}
	t.mu.RUnlock()
	for _, p := range gone {
		t.dropOffers(p)
		t.Set(p, nil)
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
