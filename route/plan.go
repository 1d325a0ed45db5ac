package route

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/multiformats/go-multiaddr"

	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// Errors callers branch on.
var (
	ErrUnknownModel = errors.New("route: unknown model")
	ErrNoRoute      = errors.New("route: no route")
	// ErrAmbiguousModel: a name or fingerprint prefix matches several
	// models (errors.Is ErrUnknownModel too: it names none of them).
	ErrAmbiguousModel = errors.New("route: ambiguous model")
	// ErrRouteFull: every layer is served, but for some layers every
	// peer serving them is full now (no free slot or KV room); a
	// NoRouteError with Full set. Waiting may help; re-routing will not.
	ErrRouteFull = errors.New("route: full")
	// ErrLayerCount: a request's layer count is outside 1..gguf.MaxLayers
	// (no model has that many layers; planners size their search by it).
	ErrLayerCount = errors.New("route: layer count out of range")
)

// NoRouteError names the layers no usable peer covers.
type NoRouteError struct {
	Fingerprint string
	NLayer      int
	// Missing is the first layer range [Start, End) nobody reachable serves
	// (after exclusions).
	MissingStart, MissingEnd int
	Excluded                 int
	// MaxHops is set when every layer is served but no route fits in it.
	MaxHops int
	// Full is set when a route would exist if the peers that are full
	// now had room (errors.Is ErrRouteFull).
	Full bool
}

func (e *NoRouteError) Error() string {
	ex := ""
	if e.Excluded > 0 {
		ex = fmt.Sprintf(" (%d failed peers excluded)", e.Excluded)
	}
	if e.MaxHops > 0 {
		return fmt.Sprintf("route: no route for model %.12s within %d hops%s", e.Fingerprint, e.MaxHops, ex)
	}
	if e.Full {
		ex += " (the peers serving them are full now)"
	}
	return fmt.Sprintf("route: no route for model %.12s: no peer serves layers %d-%d of %d%s", e.Fingerprint, e.MissingStart, e.MissingEnd, e.NLayer, ex)
}

// Unwrap makes a NoRouteError match ErrNoRoute, and ErrRouteFull when
// Full.
func (e *NoRouteError) Unwrap() []error {
	if e.Full {
		return []error{ErrNoRoute, ErrRouteFull}
	}
	return []error{ErrNoRoute}
}

// Hop is one step of a route.
type Hop struct {
	Peer       peer.ID
	Start, End int
	Addrs      []multiaddr.Multiaddr
	Reach      p2p.Path
	// KernelClass is the hop's advertised kernel class ("": unknown, as
	// in a tracker's ticket, or an older node).
	KernelClass string
	// MsPerLayer is the hop's advertised decode time per layer (0:
	// unknown, as in a tracker's ticket): the origin sizes its waits
	// during the prefill from it (session.SessionOpen's hop_ms_per_layer).
	MsPerLayer float64
}

// BatchInvariant reports whether every hop is known to compute a row the
// same however it is batched (a CPU kernel class, or an unknown one,
// which older nodes and tickets leave empty): what speculative windows
// need to equal plain decoding. GPU backends are not (docs/gpu.md).
func (r *Route) BatchInvariant() bool {
	for _, h := range r.Hops {
		if h.KernelClass != "" && !InvariantClass(h.KernelClass) {
			return false
		}
	}
	return true
}

// InvariantClass reports whether a kernel class computes a row the same
// however it is batched: the CPU's (and any that is not a GPU backend's);
// GPU backends' are not (docs/gpu.md), so two hops of one GPU class agree
// only to rounding.
func InvariantClass(class string) bool {
	backend, _, _ := strings.Cut(class, "/")
	switch strings.ToLower(backend) {
	case "vulkan", "cuda", "metal", "hip", "rocm", "sycl", "opencl", "cann", "musa":
		return false
	}
	return true
}

// Route is an ordered list of hops covering [0, NLayer).
type Route struct {
	Fingerprint string
	NLayer      int
	Epoch       uint64
	Hops        []Hop
	// Ticket is the tracker's signature over this route, when a tracker
	// planned it; the origin sends it with the session open.
	Ticket *meshp2pb.SignedRouteTicket
	// Audit is the tracker's audit assignment for this route (checked
	// against the ticket's commitment; nil: none, the origin draws).
	Audit *meshp2pb.AuditAssignment
	// Standby is the hot standby the ticket names (Request.Standby; nil:
	// none, or a route planned without a tracker: the origin picks).
	Standby *StandbyHop
}

// Request asks a planner for a route.
type Request struct {
	Fingerprint string
	NLayer      int
	Exclude     map[peer.ID]bool
	MaxHops     int // 0: no limit
	// NeedKV is the KV cells the session needs on every hop.
	NeedKV int
	// Epoch the route is for (1 for a new session, +1 per reroute).
	Epoch uint64
	// SessionID, when set (16 bytes), is the session the route is for: a
	// tracker binds its ticket to it, so hops admit no other session with
	// that ticket.
	SessionID []byte
	// Client is the peer the route is for (tracker side: the requesting
	// peer; the pending load one client's tickets add is capped).
	Client peer.ID
	// Warm are hops that hold KV this session can reuse (the route of an
	// earlier turn of the conversation, or the failed epoch's): a shard
	// of the same peer and range costs costWarm less (LocalPlanner), or
	// wins a tie between replicas (CostPlanner). A preference only; at
	// most MaxWarmHops are sent to a tracker.
	Warm []Hop
	// WarmStandby are replicas that kept the session's blocks as an
	// earlier session's standby: preferred as its standby
	// (PickStandby), not as route hops (the hops after one would miss
	// their blocks, keyed on the peers before them). At most
	// MaxWarmHops go to a tracker.
	WarmStandby []Hop
	// Standby asks for a hot standby: a tracker's CostPlanner picks one
	// (Route.Standby, signed into the ticket); a local plan ignores it
	// (the origin picks).
	Standby bool
	// Takeover is the failed epoch's standby (after a failure): it holds
	// the failed hop's KV, so the planners route its range through it
	// while it is usable.
	Takeover *Hop
}

// MaxWarmHops bounds a route request's warm hops (a tracker refuses more).
const MaxWarmHops = 64

// checkLayerCount bounds req.NLayer before a planner sizes anything by it.
func checkLayerCount(req Request) error {
	if req.NLayer <= 0 {
		return fmt.Errorf("%w: model %.12s has unknown layer count", ErrUnknownModel, req.Fingerprint)
	}
	if req.NLayer > gguf.MaxLayers {
		return fmt.Errorf("%w: %d layers, at most %d", ErrLayerCount, req.NLayer, gguf.MaxLayers)
	}
	return nil
}

// Planner picks routes. The local planner below uses only the capability
// table; a tracker-backed planner can stand in behind the same interface.
type Planner interface {
	Plan(ctx context.Context, req Request) (*Route, error)
}

// LocalPlanner plans over the capability table, tracker-less.
type LocalPlanner struct {
	Table *Table
	// Rand spreads sessions over equally good routes; nil uses a fresh
	// generator.
	Rand *rand.Rand
}

// Edge costs: the first version prefers fewer hops above all, then direct
// over relayed connections, then free capacity. Each term is documented
// with its reason; the tracker issue replaces these with measured costs.
const (
	costHop     = 1000.0 // each hop adds a network round of latency per token
	costRelayed = 400.0  // a relayed hop pays the relay's extra leg and shares its bandwidth
	costLoad    = 100.0  // scaled by the fraction of the hop's sessions in use
	costJitter  = 1.0    // random tie-break so equal routes share the load
	// costWarm is taken off a shard that holds the session's prefix
	// (Request.Warm): more than any load difference, since reusing a
	// cached prefix saves its whole prefill on that hop, but less than a
	// hop or a relayed leg, which every token pays.
	costWarm = 300.0

	// localCostScale turns the costs above into the integer costs of the
	// shared search (route/core.go): a millionth of a unit, far below the
	// jitter.
	localCostScale = 1e6
)

// Plan finds the cheapest chain of shards whose ranges join end to start
// and cover [0, NLayer) exactly: the shared shortest path over layer
// boundaries (route/core.go) with the edge costs above. Ranges may overlap
// across peers; a hop always runs its whole range.
func (p *LocalPlanner) Plan(ctx context.Context, req Request) (*Route, error) {
	if err := checkLayerCount(req); err != nil {
		return nil, err
	}
	rnd := p.Rand
	if rnd == nil {
		rnd = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	n := req.NLayer
	var cands []Shard
	byStart := make([][]edge, n)
	for _, s := range p.Table.Shards(req.Fingerprint) {
		s = takeoverShard(s, req)
		if !usable(s, req) {
			continue
		}
		cands = append(cands, s)
		c := edgeCost(s) + costJitter*rnd.Float64()
		if isWarm(s, req.Warm) {
			c -= costWarm
		}
		byStart[s.Start] = append(byStart[s.Start], edge{s: s, cost: int64(math.Round(c * localCostScale))})
	}
	pinTakeover(byStart, req.Takeover)
	path := shortest(byStart, req.MaxHops, math.MaxInt64)
	if path == nil {
		return nil, noRoute(req, cands, p.Table.Shards(req.Fingerprint))
	}
	out := make([]Hop, len(path))
	for i, e := range path {
		out[i] = Hop{Peer: e.s.Peer, Start: e.s.Start, End: e.s.End, Addrs: e.s.Addrs, Reach: e.s.Reach, KernelClass: e.s.KernelClass,
			MsPerLayer: float64(e.s.DecodeMsPerLayer)}
	}
	return &Route{Fingerprint: req.Fingerprint, NLayer: n, Epoch: req.Epoch, Hops: out}, nil
}

// isWarm reports whether s is one of the warm hops (same peer and range).
func isWarm(s Shard, warm []Hop) bool {
	for _, h := range warm {
		if h.Peer == s.Peer && h.Start == s.Start && h.End == s.End {
			return true
		}
	}
	return false
}

func edgeCost(s Shard) float64 {
	c := costHop
	if s.Reach == p2p.PathRelayed {
		c += costRelayed
	}
	if cp := s.Capacity; cp != nil && cp.GetMaxSessions() > 0 {
		used := float64(cp.GetMaxSessions()-cp.GetFreeSessions()) / float64(cp.GetMaxSessions())
		c += costLoad * used
	}
	return c
}

// noRoute reports the first layer range reachable boundaries cannot cross
// over the usable shards cands; all (every shard of the model, full ones
// included) tells whether capacity is what is missing.
func noRoute(req Request, cands, all []Shard) error {
	e := gap(req, cands)
	if e.MaxHops == 0 {
		var ignoringLoad []Shard
		for _, s := range all {
			if fits(s, req) {
				ignoringLoad = append(ignoringLoad, s)
			}
		}
		e.Full = gap(req, ignoringLoad).MissingStart == req.NLayer
	}
	return e
}

// gap is the NoRouteError for shards cands: the first range their
// boundaries cannot cross, or MaxHops when they cover every layer.
func gap(req Request, cands []Shard) *NoRouteError {
	n := req.NLayer
	reach := make([]bool, n+1)
	reach[0] = true
	for b := 0; b < n; b++ {
		if !reach[b] {
			continue
		}
		for _, s := range cands {
			if s.Start == b {
				reach[s.End] = true
			}
		}
	}
	if reach[n] {
		return &NoRouteError{Fingerprint: req.Fingerprint, NLayer: n, MissingStart: n, MissingEnd: n, Excluded: len(req.Exclude), MaxHops: req.MaxHops}
	}
	// The gap starts at the furthest reachable boundary and ends at the
	// nearest boundary after it from which some shard continues.
	far := 0
	for b := n; b >= 0; b-- {
		if reach[b] {
			far = b
			break
		}
	}
	end := n
	for _, s := range cands {
		if s.Start > far && s.Start < end {
			end = s.Start
		}
	}
	return &NoRouteError{Fingerprint: req.Fingerprint, NLayer: n, MissingStart: far, MissingEnd: end, Excluded: len(req.Exclude)}
}
