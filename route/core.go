package route

// The planner core both planners share: which offered shards may carry a
// session (usable) and the shortest path over layer boundaries (shortest).
// They differ only in the edge costs they put in: LocalPlanner's fixed
// costs (plan.go) and the tracker's measured cost model (cost.go).
//
// Boundaries 0..n_layer are vertices; each usable shard [start, end) is an
// edge start → end. Edges only go forward, so one relaxation pass in
// boundary order is a shortest path (a hop may start inside another
// replica's range: every boundary is a vertex).

// usable is the one capacity filter: the shard belongs to the requested
// model and lies inside it, its peer is not excluded, it has a free
// session slot and room for the session's KV cells.
func usable(s Shard, req Request) bool {
	if !fits(s, req) {
		return false
	}
	c := s.Capacity
	if c == nil {
		return true
	}
	if c.GetFreeSessions() == 0 {
		return false
	}
	need := req.NeedKV
	return need <= 0 || (c.GetFreeKvTokens() >= uint64(need) && (c.GetNCtx() == 0 || c.GetNCtx() >= uint32(need)))
}

// fits reports whether the shard belongs to the requested model, lies
// inside it and its peer is not excluded (usable, load aside).
func fits(s Shard, req Request) bool {
	return !req.Exclude[s.Peer] && s.NLayer == req.NLayer && s.Start >= 0 && s.End <= req.NLayer && s.End > s.Start
}

// edge is one candidate hop in the search.
type edge struct {
	s     Shard
	cost  int64   // minimised along the route
	rec   uint64  // tie-break: the smaller sum wins (recency; 0 when unused)
	stage int64   // edges above the search's limit are left out
	hc    HopCost // the cost model's estimate (tracker only)
}

// shortest finds the route from boundary 0 to len(byStart) minimising
// (cost, rec, hops) over edges with stage <= limit and at most maxHops
// hops (0: no limit); nil when none.
func shortest(byStart [][]edge, maxHops int, limit int64) []edge {
	n := len(byStart)
	type label struct {
		cost int64
		rec  uint64
		hops int
		prev *edge
		set  bool
	}
	lab := make([]label, n+1)
	lab[0].set = true
	for b := 0; b < n; b++ {
		if !lab[b].set {
			continue
		}
		for i := range byStart[b] {
			e := &byStart[b][i]
			if e.stage > limit || (maxHops > 0 && lab[b].hops+1 > maxHops) {
				continue
			}
			c, r := lab[b].cost+e.cost, lab[b].rec+e.rec
			l := &lab[e.s.End]
			if !l.set || c < l.cost || (c == l.cost && (r < l.rec || (r == l.rec && lab[b].hops+1 < l.hops))) {
				*l = label{cost: c, rec: r, hops: lab[b].hops + 1, prev: e, set: true}
			}
		}
	}
	if !lab[n].set {
		return nil
	}
	var out []edge
	for b := n; b > 0; {
		e := lab[b].prev
		out = append(out, *e)
		b = e.s.Start
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

// reachable reports whether some route uses only edges with stage <= limit.
func reachable(byStart [][]edge, limit int64) bool {
	n := len(byStart)
	ok := make([]bool, n+1)
	ok[0] = true
	for b := 0; b < n; b++ {
		if !ok[b] {
			continue
		}
		for _, e := range byStart[b] {
			if e.stage <= limit {
				ok[e.s.End] = true
			}
		}
	}
	return ok[n]
}
