package placement

import (
	"fmt"
	"math/rand/v2"
)

// Reason says why a node moves.
type Reason string

const (
	// ReasonGap: the move shrinks the deficit (layers missing from the
	// best route), with no cooldown: at once when it closes the gap, from
	// the GapPatience-th check with a deficit when it only narrows it.
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
	Sizing    Sizing
	Budget    int64
	rng       *rand.Rand
	streak    int
	gapChecks int     // checks in a row that saw a deficit
	since     int     // checks since the last move (the start counts as one)
	cands     []Range // Candidates(Sizing, Budget), computed once
}

// NewRebalancer starts the state of a node that just chose its window.
func NewRebalancer(sz Sizing, budget int64, rng *rand.Rand) *Rebalancer {
	return &Rebalancer{Sizing: sz, Budget: budget, rng: rng}
}

// Check runs one rebalance check for node me serving cur at ms per layer
// (0: unknown) in view (which may hold me; its entries are ignored).
// Never proposes a window that leaves a layer in no window that is in one
// now, or that lengthens the deficit.
func (b *Rebalancer) Check(view View, me string, cur Range, ms float64) Decision {
	b.since++
	others := view.Without(me)
	if ms <= 0 {
		ms = others.medianMs()
	}
	before := others.graph().with(cur, ms)
	if before.Deficit > 0 {
		b.gapChecks++
	} else {
		b.gapChecks = 0
	}
	if b.cands == nil {
		b.cands = Candidates(b.Sizing, b.Budget)
	}
	ch, ok := choose(others, b.cands, ms, &before, &cur, b.rng)
	stay := func(why string) Decision { b.streak = 0; return Decision{To: cur, Why: why} }
	if !ok || ch.Range == cur {
		return stay("current window is the best")
	}
	// Planned windows count for where to go, but not for what may be left:
	// a window that is still loading may never arrive.
	if !safe(others.loaded(), cur, ch.Range, ms) {
		return stay(fmt.Sprintf("moving %s → %s waits for planned windows to load", cur, ch.Range))
	}
	db, wb := before.Deficit, Weakest(before.Coverage)
	switch {
	case ch.Deficit < db && ch.Deficit > 0 && b.gapChecks < GapPatience:
		// A partial fix can block a complete one (a shorter window here
		// leaves another node nowhere to go): leave the first check to
		// nodes that can close the gap, then take what helps.
		b.streak = 0
		return Decision{To: cur, Why: fmt.Sprintf("moving %s → %s would leave %d layers missing; waiting a check for a node that closes the gap", cur, ch.Range, ch.Deficit)}
	case ch.Deficit < db:
		b.streak, b.since = 0, 0
		return Decision{Move: true, To: ch.Range, Reason: ReasonGap,
			Why: fmt.Sprintf("layers missing from the best route: %d, %d after moving %s → %s", db, ch.Deficit, cur, ch.Range)}
	case ch.Deficit > db || ch.Weakest <= wb*(1+Margin):
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

// loaded is the view without planned windows.
func (v View) loaded() View {
	out := View{NLayer: v.NLayer}
	for _, s := range v.Servers {
		if !s.Planned {
			out.Servers = append(out.Servers, s)
		}
	}
	return out
}

// safe reports whether moving from cur to to leaves every layer of v plus
// cur still in a window, with no longer deficit.
func safe(v View, cur, to Range, ms float64) bool {
	g := v.graph()
	before, after := g.with(cur, ms), g.with(to, ms)
	if after.Deficit > before.Deficit {
		return false
	}
	for l, x := range before.Coverage {
		if x > 0 && after.Coverage[l] <= 0 {
			return false
		}
	}
	return true
}
