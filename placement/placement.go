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

// Coverage is the throughput (tokens/s) each layer gets from the view's
// servers, relayed ones weighted down; 0 is a gap.
func (v View) Coverage() []float64 {
	c := make([]float64, v.NLayer)
	def := v.medianMs()
	for _, s := range v.Servers {
		addServer(c, s, def)
	}
	return c
}

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

// Gaps counts the layers nobody serves.
func Gaps(c []float64) int {
	n := 0
	for _, x := range c {
		if x <= 0 {
			n++
		}
	}
	return n
}

// Weakest is the smallest layer throughput (0 with a gap).
func Weakest(c []float64) float64 {
	if len(c) == 0 {
		return 0
	}
	return slices.Min(c)
}

// better reports whether coverage a beats b: fewer gaps, then leximin
// (the sorted vectors compared from the weakest layer up, with a relative
// tolerance so float noise is a tie). 0: a tie.
func better(a, b []float64) int {
	if ga, gb := Gaps(a), Gaps(b); ga != gb {
		if ga < gb {
			return 1
		}
		return -1
	}
	sa, sb := slices.Clone(a), slices.Clone(b)
	slices.Sort(sa)
	slices.Sort(sb)
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

// Candidates lists the windows a node with this budget could serve: from
// every start, the longest window that fits, and every longest window
// ending at the last layer. Empty when not even one layer fits.
func Candidates(sz Sizing, budget int64) []Range {
	var out []Range
	add := func(r Range) {
		if r.Len() > 0 && !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	for s := 0; s < sz.NLayer; s++ {
		add(Range{s, s + sz.MaxWindow(s, budget)})
	}
	// Windows flush with the tail: the tail's extra bytes shorten them.
	for s := 0; s < sz.NLayer; s++ {
		if sz.Need(Range{s, sz.NLayer}) <= budget {
			add(Range{s, sz.NLayer})
			break
		}
	}
	return out
}

// Choice is a chosen window and how the swarm looks without and with this
// node on it.
type Choice struct {
	Range                  Range
	Gaps, GapsBefore       int
	Weakest, WeakestBefore float64
}

// Choose picks the window that most improves view for a node with ms
// decode cost per layer (0: the view's median): fewest gaps left, then the
// strongest weakest layer (leximin: the sorted per-layer throughputs
// compared from the weakest up), ties at random. view must not hold this
// node's own windows. ok is false when no window fits the budget.
func Choose(view View, sz Sizing, budget int64, ms float64, rng *rand.Rand) (Choice, bool) {
	return choose(view, Candidates(sz, budget), ms, nil, rng)
}

// choose is Choose over given candidates; with keep set, a candidate that
// would leave a layer with keep[l] > 0 uncovered is not taken.
func choose(view View, cands []Range, ms float64, keep []float64, rng *rand.Rand) (Choice, bool) {
	if ms <= 0 {
		ms = view.medianMs()
	}
	base := view.Coverage()
	var best []Range
	var bestCov []float64
next:
	for _, r := range cands {
		c := slices.Clone(base)
		addServer(c, Server{Range: r, MsPerLayer: ms}, ms)
		for l := range keep {
			if keep[l] > 0 && c[l] <= 0 {
				continue next
			}
		}
		if bestCov == nil {
			best, bestCov = []Range{r}, c
			continue
		}
		switch better(c, bestCov) {
		case 1:
			best, bestCov = []Range{r}, c
		case 0:
			best = append(best, r)
		}
	}
	if best == nil {
		return Choice{}, false
	}
	r := best[rng.IntN(len(best))]
	return Choice{Range: r, Gaps: Gaps(bestCov), GapsBefore: Gaps(base), Weakest: Weakest(bestCov), WeakestBefore: Weakest(base)}, true
}
