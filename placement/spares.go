package placement

// Spare copies (issue 39 item 6). A route is a chain of windows, each
// starting where the previous one ends, so a second copy of a layer helps
// only in a window that lies on a complete route itself: one that a chain
// reaches from layer 0 and that a chain leads on from to the last layer.
// A window off every route serves nothing, whatever its length, and a
// node that takes one leaves the layers it could have doubled with one
// copy. At its first choice a node therefore counts, among windows whose
// weakest layer is within Margin of the best (the near tie that already
// favours longer windows), the layers left with fewer than two routable
// copies (fewer wins), and between otherwise equal windows takes one
// anchored to the chains (its start reached from layer 0, its end leading
// to the last layer), so that the next node's window can chain to it and
// later ones can double it: a lone first node takes 0-L or (n-L)-n rather
// than a window in the middle, which would split the rest into two
// fragments for whoever comes next.

// reach is, per layer boundary, whether a chain of the graph's windows
// (and extra, if not nil) runs to it from layer 0 (from) and whether one
// runs from it to the last layer (to).
func (g *graph) reach(extra *Range) (from, to []bool) {
	from, to = make([]bool, g.n+1), make([]bool, g.n+1)
	from[0], to[g.n] = true, true
	for b := 0; b < g.n; b++ {
		for _, e := range g.ends[b] {
			from[e] = from[e] || from[b]
		}
		if extra != nil && extra.Start == b {
			from[extra.End] = from[extra.End] || from[b]
		}
	}
	for b := g.n - 1; b >= 0; b-- {
		for _, e := range g.ends[b] {
			to[b] = to[b] || to[e]
		}
		if extra != nil && extra.Start == b {
			to[b] = to[b] || to[extra.End]
		}
	}
	return from, to
}

// copies is, per layer, the number of windows holding it that lie on a
// complete route, with extra added (nil: none).
func (g *graph) copies(extra *Range) []int {
	from, to := g.reach(extra)
	c := make([]int, g.n+1) // a difference array, then the counts
	add := func(a, e int) {
		if from[a] && to[e] {
			c[a]++
			c[e]--
		}
	}
	for a := 0; a < g.n; a++ {
		for _, e := range g.ends[a] {
			add(a, e)
		}
	}
	if extra != nil {
		add(extra.Start, extra.End)
	}
	for l := 1; l <= g.n; l++ {
		c[l] += c[l-1]
	}
	return c[:g.n]
}

// singles is the number of layers with fewer than two copies in windows
// on a complete route, with extra added.
func (g *graph) singles(extra Range) int {
	n := 0
	for _, c := range g.copies(&extra) {
		if c < 2 {
			n++
		}
	}
	return n
}

// b2i is 1 for true.
func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
