package placement

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Healing. After crashes a swarm may have no route although its live nodes'
// budgets can hold one, and no single node can close the gap without
// opening another (the rebalancer's single moves never uncover a layer).
// Heal plans the windows of several nodes together.
//
// Every node computes the plan itself, from the same inputs: the live
// members of the swarm (from the signed adverts: window, and the budget a
// self-placing node advertises) and the model's sizing. The plan is a pure
// function of that set (order does not matter; ties are broken by peer
// id), so nodes that see the same swarm move without talking to each
// other, and none claims a window another is assigned. Views differ for a
// moment (an advert or a death not yet seen): a node moves only when it
// computed the same plan on two checks in a row (node/placement.go), and a
// plan made from a stale view is corrected by the next check, as a
// duplicate window is only a replica. A lease or claim protocol would need
// its own messages, timeouts and failure cases for the same result.
//
// While the model has no route nothing is served, so moving several nodes
// costs no service; the plan still moves as few as it can (each move loads
// a window).

// Member is a live node as the heal plan sees it.
type Member struct {
	Peer  string
	Range Range // current (or planned) window; Len 0: none
	// Budget is the memory a self-placing node advertises (0: it serves
	// fixed layers and never moves).
	Budget int64
}

// HealPlan is a set of windows for which a route exists.
type HealPlan struct {
	// Moves maps the peers that change windows to their new window.
	Moves map[string]Range
	// Route is the chain of windows the plan builds, from layer 0.
	Route []Range
}

// Heal plans windows for members (this node among them) so that a route
// exists with the fewest nodes moving, or says why none can. It returns
// an empty plan when a route exists already.
func Heal(sz Sizing, members []Member) (HealPlan, error) {
	ms := slices.Clone(members)
	slices.SortFunc(ms, func(a, b Member) int { return cmp.Compare(a.Peer, b.Peer) })
	n := sz.NLayer
	if n <= 0 {
		return HealPlan{}, fmt.Errorf("placement: model has no layers")
	}
	if p, ok := keepChain(sz, ms); ok {
		return p, nil
	}
	if p, ok := fillChain(sz, ms); ok {
		return p, nil
	}
	if p, ok := retile(sz, ms); ok {
		return p, nil
	}
	var movable int
	var total int
	for _, m := range ms {
		if m.Budget > 0 {
			movable++
			total += sz.MaxWindow(n/2, m.Budget)
		}
	}
	return HealPlan{}, fmt.Errorf("no heal plan: the %d live self-placing nodes (of %d seen) cannot hold a route of %d layers together (about %d layers fit their budgets), nor with the fixed windows", movable, len(ms), n, total)
}

// keepChain is the empty plan when the members' windows already chain.
func keepChain(sz Sizing, ms []Member) (HealPlan, bool) {
	v := View{NLayer: sz.NLayer}
	for _, m := range ms {
		if m.Range.Len() > 0 {
			v.Servers = append(v.Servers, Server{Peer: m.Peer, Range: m.Range})
		}
	}
	return HealPlan{Moves: map[string]Range{}}, v.Deficit() == 0
}

// fillChain keeps the windows that can stay and fills the rest of a
// chain with new windows for members whose windows the chain does not
// use: a shortest path over layer boundaries where a kept window costs
// nothing and a new window one move (then fewer hops), counting the
// movable members whose windows the chain keeps, so that enough are left
// to move; the new windows are then matched to members (largest need
// first, each to the member with the smallest budget that holds it).
func fillChain(sz Sizing, ms []Member) (HealPlan, bool) {
	n := sz.NLayer
	movable := 0
	for _, m := range ms {
		if m.Budget > 0 {
			movable++
		}
	}
	best := chainPaths(sz, ms, movable)
	for _, k := range chainEnds(best[n], movable) {
		chain, fresh, used := chainTo(best, n, k)
		if moves, ok := assign(sz, ms, used, fresh); ok {
			return HealPlan{Moves: moves, Route: chain}, true
		}
	}
	return HealPlan{}, false
}

// chainStep is the best way found to a boundary: its moves and hops, the
// boundary and count of kept movable members it came from, and whose
// window its last hop is.
type chainStep struct {
	moves, hops int
	from, fromK int
	owner       int // index into ms of a kept window; -1: new
	ok          bool
}

// better reports whether a is a better way than b: b none yet, or fewer
// moves, then fewer hops.
func (a chainStep) better(b chainStep) bool {
	if !b.ok {
		return true
	}
	if a.moves != b.moves {
		return a.moves < b.moves
	}
	return a.hops < b.hops
}

// chainPaths is fillChain's shortest-path table: best[b][k] is the best
// way to reach boundary b keeping the windows of k movable members (of
// movable).
func chainPaths(sz Sizing, ms []Member, movable int) [][]chainStep {
	n := sz.NLayer
	best := make([][]chainStep, n+1)
	for b := range best {
		best[b] = make([]chainStep, movable+1)
	}
	best[0][0] = chainStep{ok: true, owner: -1}
	relax := func(e, k int, c chainStep) {
		if k <= movable && c.better(best[e][k]) {
			best[e][k] = c
		}
	}
	maxLen := make([]int, n) // longest new window a movable member holds from b
	for b := range n {
		for _, m := range ms {
			if m.Budget > 0 {
				maxLen[b] = max(maxLen[b], sz.MaxWindow(b, m.Budget))
			}
		}
	}
	for b := 0; b < n; b++ {
		for k, cur := range best[b] {
			if !cur.ok {
				continue
			}
			for i, m := range ms {
				if m.Range.Start == b && m.Range.Len() > 0 && m.Range.End <= n {
					nk := k
					if m.Budget > 0 {
						nk++
					}
					relax(m.Range.End, nk, chainStep{moves: cur.moves, hops: cur.hops + 1, from: b, fromK: k, owner: i, ok: true})
				}
			}
			for e := b + 1; e <= min(n, b+maxLen[b]); e++ {
				if sz.Legal(Range{b, e}) {
					relax(e, k, chainStep{moves: cur.moves + 1, hops: cur.hops + 1, from: b, fromK: k, owner: -1, ok: true})
				}
			}
		}
	}
	return best
}

// chainEnds are the kept counts k of the ways to the last boundary (ends)
// that leave enough movable members for their new windows, best first.
func chainEnds(ends []chainStep, movable int) []int {
	var ks []int
	for k, s := range ends {
		if s.ok && s.moves <= movable-k {
			ks = append(ks, k)
		}
	}
	slices.SortStableFunc(ks, func(a, b int) int {
		sa, sb := ends[a], ends[b]
		return cmp.Or(cmp.Compare(sa.moves, sb.moves), cmp.Compare(sa.hops, sb.hops))
	})
	return ks
}

// chainTo walks best back from boundary n with k kept members: the
// chain's windows in order, its new ones, and the members whose windows
// it keeps.
func chainTo(best [][]chainStep, n, k int) (chain, fresh []Range, used map[int]bool) {
	used = map[int]bool{}
	for e, kk := n, k; e > 0; {
		s := best[e][kk]
		r := Range{s.from, e}
		chain = append(chain, r)
		if s.owner >= 0 {
			used[s.owner] = true
		} else {
			fresh = append(fresh, r)
		}
		e, kk = s.from, s.fromK
	}
	slices.Reverse(chain)
	return chain, fresh, used
}

// assign matches new windows to members not in used (largest need first,
// each to the movable member with the smallest budget that holds it).
func assign(sz Sizing, ms []Member, used map[int]bool, fresh []Range) (map[string]Range, bool) {
	slices.SortStableFunc(fresh, func(a, b Range) int { return cmp.Compare(sz.Need(b), sz.Need(a)) })
	moves := map[string]Range{}
	for _, r := range fresh {
		pick := -1
		for i, m := range ms {
			if used[i] || m.Budget <= 0 || sz.Need(r) > m.Budget {
				continue
			}
			if pick < 0 || m.Budget < ms[pick].Budget {
				pick = i
			}
		}
		if pick < 0 {
			return nil, false
		}
		used[pick] = true
		if ms[pick].Range != r {
			moves[ms[pick].Peer] = r
		}
	}
	return moves, true
}

// retile lays the movable members end to end from layer 0, the largest
// budgets first, each taking the longest window it holds: the plan when
// no chain keeps enough windows.
func retile(sz Sizing, ms []Member) (HealPlan, bool) {
	order := slices.Clone(ms)
	slices.SortStableFunc(order, func(a, b Member) int { return cmp.Compare(b.Budget, a.Budget) })
	moves := map[string]Range{}
	var chain []Range
	at := 0
	for _, m := range order {
		if at >= sz.NLayer {
			break
		}
		if m.Budget <= 0 {
			continue
		}
		l := sz.MaxWindow(at, m.Budget)
		if l <= 0 {
			continue
		}
		r := Range{at, min(sz.NLayer, at+l)}
		chain = append(chain, r)
		if m.Range != r {
			moves[m.Peer] = r
		}
		at = r.End
	}
	if at < sz.NLayer {
		return HealPlan{}, false
	}
	return HealPlan{Moves: moves, Route: chain}, true
}

// String lists the plan's moves in peer order ("none" when empty), and
// the route it builds.
func (p HealPlan) String() string {
	peers := slices.Sorted(maps.Keys(p.Moves))
	var b strings.Builder
	for i, id := range peers {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s→%s", short(id), p.Moves[id])
	}
	if len(peers) == 0 {
		b.WriteString("none")
	}
	b.WriteString(" (route")
	for _, r := range p.Route {
		fmt.Fprintf(&b, " %s", r)
	}
	b.WriteString(")")
	return b.String()
}

// short is the tail of a peer id (log lines).
func short(id string) string {
	if len(id) > 8 {
		return "…" + id[len(id)-6:]
	}
	return id
}
