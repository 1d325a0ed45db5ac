// Package placement holds the rules by which a node chooses the layer
// window it serves and when it moves it: pure Go, no cgo, no network. Its
// inputs are a Sizing (what a window costs in memory, from a model file or
// a manifest), a memory budget and a View of the swarm (who serves or plans
// which window, how fast, and whether this node reaches them only through
// a relay). docs/placement.md explains the rules and their constants.
package placement

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// Range is a half-open layer window [Start, End).
type Range struct{ Start, End int }

func (r Range) String() string { return fmt.Sprintf("%d-%d", r.Start, r.End) }

// Len is the number of layers in r.
func (r Range) Len() int { return r.End - r.Start }

// Server is one peer's window as the swarm's adverts show it.
type Server struct {
	Peer  string
	Range Range
	// MsPerLayer is the advertised decode cost of one row through one
	// layer (0: unknown; DefaultMsPerLayer or the view's median is used).
	MsPerLayer float64
	// Relayed: this node reaches the peer only through a relay; its
	// throughput counts RelayedWeight.
	Relayed bool
	// Planned: announced, not loaded yet (counts as if served, so that
	// nodes starting together spread).
	Planned bool
	// Budget is the memory the peer advertises for placement (0: it
	// serves fixed layers and never moves); heal plans use it.
	Budget int64
}

// View is the swarm for one model, as one node sees it.
type View struct {
	NLayer  int
	Servers []Server
}

// Constants of the rules (docs/placement.md says why).
const (
	// RelayedWeight is how much a peer reached only through a relay
	// counts: every activation crosses the relay twice.
	RelayedWeight = 0.5
	// DefaultMsPerLayer stands in for an unknown speed when no peer in the
	// view has one.
	DefaultMsPerLayer = 1.0
	// Margin is how much a throughput move must raise the swarm's weakest
	// layer (20%).
	Margin = 0.20
	// ConfirmChecks is how many checks in a row must see the same better
	// window before a throughput move.
	ConfirmChecks = 2
	// Cooldown is how many checks after its last move a node makes no
	// throughput move (gap fills are exempt).
	Cooldown = 2
	// GapPatience is the check (counting those that saw a deficit) from
	// which a node makes a move that only narrows a gap; one that closes
	// it is made at once.
	GapPatience = 2
	// HealStuckChecks: a peer a heal plan has moved for this many checks
	// in a row without it taking its window (it cannot get the layers, or
	// advertises more memory than it has) is planned around, as a fixed
	// window, for HealStuckFor checks (at the 5 s recheck: 30 s, then 2
	// min), so one node that cannot move does not hold a heal forever.
	HealStuckChecks = 6
	HealStuckFor    = 24
)

// throughput is the tokens per second a server adds to each layer of its
// window: one row through all its layers per token.
func throughput(ms float64, layers int) float64 {
	return 1000 / (ms * float64(max(1, layers)))
}

// medianMs is the median known speed in the view (DefaultMsPerLayer when
// none is known).
func (v View) medianMs() float64 {
	var ms []float64
	for _, s := range v.Servers {
		if s.MsPerLayer > 0 {
			ms = append(ms, s.MsPerLayer)
		}
	}
	if len(ms) == 0 {
		return DefaultMsPerLayer
	}
	slices.Sort(ms)
	return ms[len(ms)/2]
}

// Score is how well a swarm serves the model.
//
//   - Deficit is the fewest layers missing from the best route. A route is
//     a chain of windows, each starting where the previous ends (a shard
//     runs exactly its layers), so a layer every window covers may still
//     be unroutable; 0 when a chain runs from layer 0 to the last.
//   - Coverage is each layer's throughput (tokens/s) summed over the
//     windows holding it, relayed-only ones weighted down.
type Score struct {
	Deficit  int
	Coverage []float64
}

// Score scores the view.
func (v View) Score() Score {
	g := v.graph()
	return Score{Deficit: g.deficit(nil), Coverage: g.cov}
}

// Coverage is the view's per-layer throughput (Score.Coverage).
func (v View) Coverage() []float64 { return v.graph().cov }

// Deficit is the view's Score.Deficit.
func (v View) Deficit() int { return v.graph().deficit(nil) }

// graph is a view's windows as edges between layer boundaries, and its
// coverage.
type graph struct {
	n    int
	ends [][]int // ends[b]: where the windows starting at b end
	cov  []float64
	ms   float64 // the view's median speed (for unknown ones)
}

func (v View) graph() *graph {
	g := &graph{n: v.NLayer, ends: make([][]int, v.NLayer+1), cov: make([]float64, v.NLayer), ms: v.medianMs()}
	for _, s := range v.Servers {
		if s.Range.Start >= 0 && s.Range.End <= g.n && s.Range.Len() > 0 {
			g.ends[s.Range.Start] = append(g.ends[s.Range.Start], s.Range.End)
			addServer(g.cov, s, g.ms)
		}
	}
	return g
}

// deficit is the fewest layers missing from the best route, with one more
// window extra (nil: none): a shortest path over boundaries where a window
// costs 0 and a missing layer 1.
func (g *graph) deficit(extra *Range) int {
	dist := make([]int, g.n+1)
	for b := range dist {
		dist[b] = b
	}
	for b := 0; b < g.n; b++ {
		dist[b+1] = min(dist[b+1], dist[b]+1)
		for _, e := range g.ends[b] {
			dist[e] = min(dist[e], dist[b])
		}
		if extra != nil && extra.Start == b {
			dist[extra.End] = min(dist[extra.End], dist[b])
		}
	}
	return dist[g.n]
}

// with is the score of the graph plus a window r at ms per layer.
func (g *graph) with(r Range, ms float64) Score {
	c := slices.Clone(g.cov)
	addServer(c, Server{Range: r, MsPerLayer: ms}, g.ms)
	return Score{Deficit: g.deficit(&r), Coverage: c}
}

// Without is the view less one peer's windows.
func (v View) Without(peer string) View {
	out := View{NLayer: v.NLayer}
	for _, s := range v.Servers {
		if s.Peer != peer {
			out.Servers = append(out.Servers, s)
		}
	}
	return out
}

// Weakest is the smallest layer throughput (0 with a gap).
func Weakest(c []float64) float64 {
	if len(c) == 0 {
		return 0
	}
	return slices.Min(c)
}

// compareSorted compares scores: the smaller deficit wins, then leximin
// of the coverage (the sorted vectors compared from the weakest layer up,
// with a relative tolerance so float noise is a tie). 0: a tie.
func compareSorted(da int, sa []float64, db int, sb []float64) int {
	if da != db {
		if da < db {
			return 1
		}
		return -1
	}
	for i := range sa {
		if d := sa[i] - sb[i]; math.Abs(d) > 1e-9*math.Max(math.Abs(sa[i]), math.Abs(sb[i])) {
			if d > 0 {
				return 1
			}
			return -1
		}
	}
	return 0
}

// Candidates lists every window a node with this budget could serve (any
// start, any length that fits and the architecture allows). Empty when not even one layer fits.
func Candidates(sz Sizing, budget int64) []Range {
	var out []Range
	for s := 0; s < sz.NLayer; s++ {
		for e := s + 1; e <= sz.NLayer && sz.Need(Range{s, e}) <= budget; e++ {
			if sz.Legal(Range{s, e}) {
				out = append(out, Range{s, e})
			}
		}
	}
	return out
}

// Choice is a chosen window and how the swarm scores without and with
// this node on it.
type Choice struct {
	Range                  Range
	Deficit, DeficitBefore int
	Weakest, WeakestBefore float64
}

// Choose picks the window that most improves view for a node with ms
// decode cost per layer (0: the view's median): the smallest deficit, then
// the fewest layers left with under two copies on complete routes (spare
// copies, spares.go), then the strongest weakest layer (leximin; within
// Margin a tie the longer window wins), then the longest window (fewer
// hops per route), then one anchored to the chains, then prefer when it is
// among the best (a node keeps what it announced), else at random. view
// must not hold this node's own windows. ok is false when no window fits
// the budget.
func Choose(view View, sz Sizing, budget int64, ms float64, prefer *Range, rng *rand.Rand) (Choice, bool) {
	return choose(view, Candidates(sz, budget), ms, nil, prefer, rng)
}

// choose is Choose over given candidates; with keep set (the rebalancer:
// keep is the swarm's score with the node on prefer, its window now), a
// candidate that would leave a layer of keep.Coverage > 0 in no window,
// raise the deficit above keep.Deficit, or, at the same deficit, leave
// more layers with under two routable copies than prefer does, is not
// taken; the spare-copy rank and the near tie are the first choice's only.
func choose(view View, cands []Range, ms float64, keep *Score, prefer *Range, rng *rand.Rand) (Choice, bool) {
	g := view.graph()
	if ms <= 0 {
		ms = g.ms
	}
	base := Score{Deficit: g.deficit(nil), Coverage: g.cov}
	from, to := g.reach(nil)
	anchor := func(r Range) int { return b2i(from[r.Start]) + b2i(to[r.End]) }
	keepSingles := -1
	if keep != nil && prefer != nil {
		keepSingles = g.singles(*prefer)
	}
	var best []Range
	var bestSc Score
	var bestSorted []float64
	bestSingles := -1 // g.singles(best[0]) once computed
next:
	for _, r := range cands {
		d := g.deficit(&r)
		if (keep != nil && d > keep.Deficit) || (best != nil && d > bestSc.Deficit) {
			continue
		}
		sc := Score{Deficit: d, Coverage: slices.Clone(g.cov)}
		addServer(sc.Coverage, Server{Range: r, MsPerLayer: ms}, g.ms)
		if keep != nil {
			for l, x := range keep.Coverage {
				if x > 0 && sc.Coverage[l] <= 0 {
					continue next
				}
			}
			if d == keep.Deficit && keepSingles >= 0 && g.singles(r) > keepSingles {
				continue // a move for throughput never takes a spare copy away
			}
		}
		sorted := slices.Clone(sc.Coverage)
		slices.Sort(sorted)
		if best == nil {
			best, bestSc, bestSorted, bestSingles = []Range{r}, sc, sorted, -1
			continue
		}
		cmp := compareSorted(sc.Deficit, sorted, bestSc.Deficit, bestSorted)
		single := -1
		if keep == nil && sc.Deficit == bestSc.Deficit {
			if bestSingles < 0 {
				bestSingles = g.singles(best[0])
			}
			cmp, single = g.rankFirst(r, best[0], sorted, bestSorted, bestSingles, cmp)
		}
		if cmp == 0 {
			cmp = r.Len() - best[0].Len()
		}
		if cmp == 0 {
			// Anchored windows first (spares.go): the next node's window
			// can chain to them.
			cmp = anchor(r) - anchor(best[0])
		}
		switch {
		case cmp > 0:
			best, bestSc, bestSorted, bestSingles = []Range{r}, sc, sorted, single
		case cmp == 0:
			best = append(best, r)
		}
	}
	if best == nil {
		return Choice{}, false
	}
	r := best[rng.IntN(len(best))]
	if prefer != nil && slices.Contains(best, *prefer) {
		r = *prefer
	}
	return Choice{Range: r, Deficit: bestSc.Deficit, DeficitBefore: base.Deficit, Weakest: Weakest(bestSc.Coverage), WeakestBefore: Weakest(base.Coverage)}, true
}

// addServer adds s's throughput to each layer of its window.
func addServer(c []float64, s Server, defMs float64) {
	ms := s.MsPerLayer
	if ms <= 0 {
		ms = defMs
	}
	t := throughput(ms, s.Range.Len())
	if s.Relayed {
		t *= RelayedWeight
	}
	for l := max(0, s.Range.Start); l < min(len(c), s.Range.End); l++ {
		c[l] += t
	}
}

// rankFirst compares r with best, the best window so far, when a node
// chooses its first window and both leave the same deficit (cmp: their
// scores compared): the one that leaves fewer layers with under two
// routable copies wins (spares.go; bestSingles is best's count, single
// r's); then a weakest layer within Margin is a tie, and the longer window
// wins, so nodes that could hold five layers do not settle on one-layer
// fragments that leave no slack for a crash (issue 22).
func (g *graph) rankFirst(r, best Range, sorted, bestSorted []float64, bestSingles, cmp int) (_, single int) {
	single = g.singles(r)
	switch {
	case single != bestSingles:
		cmp = bestSingles - single
	case nearTie(sorted[0], bestSorted[0]) && r.Len() != best.Len():
		cmp = r.Len() - best.Len()
	}
	return cmp, single
}

// nearTie: two weakest-layer throughputs within Margin of each other.
func nearTie(a, b float64) bool {
	return math.Abs(a-b) <= Margin*math.Max(a, b)
}
