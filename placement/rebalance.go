package placement

import (
	"fmt"
	"math/rand/v2"
	"slices"
)

// Reason says why a node moves.
type Reason string

const (
	// ReasonGap: the move serves layers nobody serves (at once, no
	// cooldown).
	ReasonGap Reason = "gap"
	// ReasonThroughput: the move raises the swarm's weakest layer by more
	// than Margin, seen on ConfirmChecks checks in a row, and the node's
	// last move is more than Cooldown checks ago.
	ReasonThroughput Reason = "throughput"
)

// Decision is the outcome of one rebalance check.
type Decision struct {
	Move   bool
	To     Range
	Reason Reason
	// Why is a one-line explanation for the log (also when not moving).
	Why string
}

// Rebalancer is one node's rebalancing state: the hysteresis (a streak of
// checks that saw a better window, and checks since the last move). Not
// safe for concurrent use; one goroutine runs the checks.
type Rebalancer struct {
	Sizing Sizing
	Budget int64
	rng    *rand.Rand
	streak int
	since  int // checks since the last move (the start counts as one)
}

// NewRebalancer starts the state of a node that just chose its window.
func NewRebalancer(sz Sizing, budget int64, rng *rand.Rand) *Rebalancer {
	return &Rebalancer{Sizing: sz, Budget: budget, rng: rng}
}

// Check runs one rebalance check for node me serving cur at ms per layer
// (0: unknown) in view (which may hold me; its entries are ignored).
// Never proposes a window that leaves a layer uncovered that is covered
// now.
func (b *Rebalancer) Check(view View, me string, cur Range, ms float64) Decision {
	b.since++
	others := view.Without(me)
	if ms <= 0 {
		ms = others.medianMs()
	}
	before := others.Coverage()
	addServer(before, Server{Range: cur, MsPerLayer: ms}, ms)
	ch, ok := choose(others, Candidates(b.Sizing, b.Budget), ms, before, b.rng)
	stay := func(why string) Decision { b.streak = 0; return Decision{To: cur, Why: why} }
	if !ok || ch.Range == cur {
		return stay("current window is the best")
	}
	gb, wb := Gaps(before), Weakest(before)
	switch {
	case ch.Gaps < gb:
		b.streak, b.since = 0, 0
		return Decision{Move: true, To: ch.Range, Reason: ReasonGap,
			Why: fmt.Sprintf("layers nobody serves: %d, %d after moving %s → %s", gb, ch.Gaps, cur, ch.Range)}
	case ch.Gaps > gb || ch.Weakest <= wb*(1+Margin):
		return stay(fmt.Sprintf("no window beats %s by %.0f%%", cur, Margin*100))
	}
	b.streak++
	why := fmt.Sprintf("weakest layer %.3g → %.3g tokens/s moving %s → %s", wb, ch.Weakest, cur, ch.Range)
	if b.streak < ConfirmChecks || b.since <= Cooldown {
		return Decision{To: cur, Why: why + fmt.Sprintf(" (check %d of %d; %d checks since the last move)", b.streak, ConfirmChecks, b.since)}
	}
	b.streak, b.since = 0, 0
	return Decision{Move: true, To: ch.Range, Reason: ReasonThroughput, Why: why}
}

// Uncovered lists the layers of the view nobody serves.
func (v View) Uncovered() []int {
	var out []int
	for l, x := range v.Coverage() {
		if x <= 0 {
			out = append(out, l)
		}
	}
	return slices.Clip(out)
}
