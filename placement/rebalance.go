package placement

import (
	"fmt"
	"math/rand/v2"
)

// Reason says why a node moves.
type Reason string

const (
	// ReasonGap: the move shrinks the deficit (layers missing from the
	// best route), with no cooldown: at once when it closes the gap
	// (unless a node with a lower peer id can close it alone too: then
	// from the GapPatience-th check), from the GapPatience-th check with a
	// deficit when it only narrows it.
	ReasonGap Reason = "gap"
	// ReasonThroughput: the move raises the swarm's weakest layer by more
	// than Margin, seen on ConfirmChecks checks in a row, and the node's
	// last move is more than Cooldown checks ago.
	ReasonThroughput Reason = "throughput"
	// ReasonHeal: the model has no route, no single move closes the gap,
	// and the heal plan (Heal: several nodes move together) that every
	// node computes from the same view gives this node a new window, the
	// same on two checks in a row.
	ReasonHeal Reason = "heal"
)

// Decision is the outcome of one rebalance check.
type Decision struct {
	Move   bool
	To     Range
	Reason Reason
	// Why is a one-line explanation for the log (also when not moving).
	Why string
	// Recheck: check again soon (HealRecheck), not after the period:
	// the model has no route (a heal plan waits for its confirmation, a
	// planned window for its load).
	Recheck bool
	// Plan is the heal plan this check computed (nil: none needed or
	// none possible; Why says which).
	Plan *HealPlan
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
	heal      string  // the heal plan the last check computed ("": none)
	// late counts, per peer, the checks in a row whose heal plan gave it
	// a window it has not taken; stuck holds the peers that ran past
	// HealStuckChecks (checks left before they count as movable again).
	late, stuck map[string]int
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
	d := b.check(view, me, cur, ms)
	if b.gapChecks > 0 { // this check saw no route
		// Without a route, nothing waits for the period: plans confirm,
		// windows load and gaps close check by check.
		d.Recheck = true
	}
	return d
}

func (b *Rebalancer) check(view View, me string, cur Range, ms float64) Decision {
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
	var healErr error
	if before.Deficit > 0 && (!ok || ch.Deficit > 0) {
		// No single move closes the gap: plan several together, if the
		// live nodes can hold a route at all (else narrow it below).
		var d Decision
		if d, healErr = b.healCheck(view, me, cur); healErr == nil {
			return d
		}
	} else {
		b.heal = ""
	}
	if !ok || ch.Range == cur {
		if before.Deficit > 0 {
			why := fmt.Sprintf("no route: %d layers missing from the best one, and no move of this node (%s) closes more of it", before.Deficit, cur)
			if healErr != nil {
				why += "; " + healErr.Error()
			}
			return stay(why)
		}
		return stay("current window is the best")
	}
	// Planned windows count for where to go, but not for what may be left:
	// a window that is still loading may never arrive.
	if !safe(others.loaded(), cur, ch.Range, ms) {
		return stay(fmt.Sprintf("moving %s → %s waits for planned windows to load", cur, ch.Range))
	}
	db, wb := before.Deficit, Weakest(before.Coverage)
	if ch.Deficit == 0 && db > 0 && b.gapChecks < GapPatience {
		// Other nodes may close the gap alone too: each checks within
		// seconds of the crash, and two that check within an advert's
		// flight of each other both move (two replicas of a window both
		// leave it: a new gap, which both then closed again, in step).
		// As in heal plans, ties go by peer id: the lowest moves at its
		// first check; the others see its planned window at their next,
		// or move then.
		if p := b.closerFirst(others, me, cur, ms); p != "" {
			b.streak = 0
			return Decision{To: cur, Why: fmt.Sprintf("moving %s → %s would close the gap, and so would a move of %s, which goes first (lower peer id); waiting a check", cur, ch.Range, short(p))}
		}
	}
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

// closerFirst is the lowest peer id below me of another node in others
// that could close the gap alone as well ("": none): one serving a loaded
// window, placing itself (a budget), not moving already (no planned
// window), with a window its budget holds that completes a route (me on
// cur counted, planned windows too) and that leaves no loaded layer in
// no window.
func (b *Rebalancer) closerFirst(others View, me string, cur Range, ms float64) string {
	moving := map[string]bool{}
	for _, s := range others.Servers {
		if s.Planned {
			moving[s.Peer] = true
		}
	}
	first := ""
	for _, s := range others.Servers {
		if s.Peer >= me || (first != "" && s.Peer >= first) || moving[s.Peer] || s.Budget <= 0 {
			continue
		}
		rest := others.Without(s.Peer)
		rest.Servers = append(rest.Servers, Server{Peer: me, Range: cur, MsPerLayer: ms})
		if closesAlone(b.Sizing, s.Budget, rest, s.Range) {
			first = s.Peer
		}
	}
	return first
}

// closesAlone reports whether a node of budget serving cur, seeing rest,
// closes the gap with one move: to a window its budget holds that
// completes a route of rest's windows (a chain from layer 0 to its start,
// and one from its end to the last layer) and is safe (loaded windows
// only for what is left).
func closesAlone(sz Sizing, budget int64, rest View, cur Range) bool {
	g := rest.graph()
	from, to := make([]bool, g.n+1), make([]bool, g.n+1)
	from[0], to[g.n] = true, true
	for b := 0; b < g.n; b++ {
		for _, e := range g.ends[b] {
			from[e] = from[e] || from[b]
		}
	}
	for b := g.n - 1; b >= 0; b-- {
		for _, e := range g.ends[b] {
			to[b] = to[b] || to[e]
		}
	}
	loaded := rest.loaded()
	for a := range g.n {
		if !from[a] {
			continue
		}
		for e := a + 1; e <= g.n; e++ {
			r := Range{a, e}
			if sz.Need(r) > budget {
				break // longer windows need more
			}
			if to[e] && r != cur && sz.Legal(r) && safe(loaded, cur, r, 0) {
				return true
			}
		}
	}
	return false
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

// healCheck is a check of a node (me, serving cur) in a view with no
// route that no single move fixes: compute the heal plan, and move when
// it gives this node a new window and the previous check computed the
// same plan (views that differ for a moment must not move nodes apart).
func (b *Rebalancer) healCheck(view View, me string, cur Range) (Decision, error) {
	b.streak = 0
	// One member per peer: where it is going (a planned window) rather
	// than the window it is leaving.
	at := map[string]int{me: 0}
	members := []Member{{Peer: me, Range: cur, Budget: b.Budget}}
	for _, s := range view.Servers {
		i, ok := at[s.Peer]
		switch {
		case !ok:
			at[s.Peer] = len(members)
			members = append(members, Member{Peer: s.Peer, Range: s.Range, Budget: s.Budget})
		case s.Planned && s.Peer != me:
			members[i].Range = s.Range
		}
	}
	b.ageStuck()
	for i, m := range members {
		if b.stuck[m.Peer] > 0 && m.Peer != me {
			members[i].Budget = 0 // planned around: it did not take what it was given
		}
	}
	plan, err := Heal(b.Sizing, members)
	if err == nil {
		b.noteLate(plan, members, me)
	}
	if err != nil {
		b.heal = ""
		return Decision{}, err
	}
	key := plan.String()
	confirmed := key == b.heal
	b.heal = key
	to, moving := plan.Moves[me]
	switch {
	case !moving:
		return Decision{To: cur, Plan: &plan, Why: fmt.Sprintf("no route; heal plan %s leaves this node on %s", key, cur)}, nil
	case !confirmed:
		return Decision{To: cur, Plan: &plan, Why: fmt.Sprintf("no route; heal plan %s moves this node %s → %s once the next check agrees", key, cur, to)}, nil
	}
	b.heal, b.since = "", 0
	return Decision{Move: true, To: to, Reason: ReasonHeal, Plan: &plan, Why: fmt.Sprintf("no route; heal plan %s (confirmed) moves this node %s → %s", key, cur, to)}, nil
}

// noteLate counts, for every other peer the plan moves, one more check it
// has not taken its window; peers past HealStuckChecks are planned around
// (as fixed windows) for HealStuckFor checks. Every node sees the same
// peers not moving, so their plans change together.
func (b *Rebalancer) noteLate(plan HealPlan, members []Member, me string) {
	if b.late == nil {
		b.late, b.stuck = map[string]int{}, map[string]int{}
	}
	for _, m := range members {
		to, moving := plan.Moves[m.Peer]
		if m.Peer == me || !moving || m.Range == to {
			delete(b.late, m.Peer)
			continue
		}
		if b.late[m.Peer]++; b.late[m.Peer] >= HealStuckChecks {
			delete(b.late, m.Peer)
			b.stuck[m.Peer] = HealStuckFor
		}
	}
}

// ageStuck counts one check off every stuck peer's exclusion.
func (b *Rebalancer) ageStuck() {
	for p := range b.stuck {
		if b.stuck[p]--; b.stuck[p] <= 0 {
			delete(b.stuck, p)
		}
	}
}
