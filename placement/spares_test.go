package placement

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// budgetOf is a uniformSizing budget holding k layers anywhere (head and
// tail included).
func budgetOf(sz Sizing, k int) int64 { return sz.FixedBytes + int64(k)*(90+10) + 60 }

// TestChooseKeepsSpareCopies (issue 39 item 6): a first choice takes the
// window that leaves the fewest layers with one routable copy, and a
// lone node anchors its window to an end of the model.
func TestChooseKeepsSpareCopies(t *testing.T) {
	sz := uniformSizing(28)
	cases := []struct {
		name    string
		servers []Server
		layers  int
		want    []Range
	}{
		{"a lone node anchors to an end", nil, 14, []Range{{0, 14}, {14, 28}}},
		{"the gap closes first", []Server{{Peer: "a", Range: Range{0, 14}}}, 16, []Range{{14, 28}}},
		// The issue: a node with room for 13 layers closed a 3-layer gap
		// and left no spare; the room holds 12-28 here, which doubles
		// 12-25 (25-28 alone was the old choice when throughput decided).
		{"extends over the single copies", []Server{{Peer: "a", Range: Range{0, 12}}, {Peer: "b", Range: Range{12, 25}}}, 16, []Range{{12, 28}}},
		// Room for 20: a 20-layer window chains to nothing (no route can
		// use it); 0-14 or 14-28 is a spare of 14 layers.
		{"a routable spare, not a longer useless one", []Server{{Peer: "a", Range: Range{0, 14}}, {Peer: "b", Range: Range{14, 28}}}, 20, []Range{{0, 14}, {14, 28}}},
		// 14-28 has one copy, on a fast node: throughput alone would add a
		// third copy to the slow 0-14.
		{"doubles the single copy before throughput", []Server{{Peer: "a", Range: Range{0, 14}, MsPerLayer: 4}, {Peer: "c", Range: Range{0, 14}, MsPerLayer: 4},
			{Peer: "b", Range: Range{14, 28}, MsPerLayer: 0.5}}, 14, []Range{{14, 28}}},
		// Every layer has two copies: throughput decides again.
		{"then the weakest layer", []Server{{Peer: "a", Range: Range{0, 14}, MsPerLayer: 1}, {Peer: "c", Range: Range{0, 14}, MsPerLayer: 1},
			{Peer: "b", Range: Range{14, 28}, MsPerLayer: 3}, {Peer: "d", Range: Range{14, 28}, MsPerLayer: 3}}, 14, []Range{{14, 28}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(3, 3))
			for range 20 {
				ch, ok := Choose(View{NLayer: 28, Servers: c.servers}, sz, budgetOf(sz, c.layers), 1, nil, rng)
				if !ok {
					t.Fatal("no window fits")
				}
				if !slices.Contains(c.want, ch.Range) {
					t.Fatalf("chose %s, want one of %v", ch.Range, c.want)
				}
			}
		})
	}
}

// TestStartsLeaveSpareCopies: nodes joining one after another (each sees
// the windows of those before it) end with every layer in two windows on
// complete routes whenever one window per node allows it; before, a first
// node in the middle of the model split the rest into fragments (budgets
// of 14 layers ×4 on 28 layers: 15 layers with one copy on average).
func TestStartsLeaveSpareCopies(t *testing.T) {
	cases := []struct {
		nLayer  int
		budgets []int
		singles int // layers with under two routable copies, at most
	}{
		{28, []int{14, 14, 14, 14}, 0},
		{28, []int{16, 16, 16, 16}, 0},
		{28, []int{20, 20, 20, 20}, 0},
		{28, []int{14, 20, 16, 28}, 0},
		{12, []int{6, 6, 6, 6}, 0},
		{12, []int{6, 7, 6, 7, 6}, 0},
		{40, []int{10, 10, 10, 10, 10, 10, 10, 10}, 0},
		// Three nodes of 20: one window each chains 0-a, a-28 and one
		// more; the third doubles the longer side (20 layers), 8 keep one copy.
		{28, []int{20, 20, 20}, 8},
		// Three of 13 (the swarm): 39 layers of room, but a route
		// of three windows of at most 13 takes all three: no spare fits.
		{28, []int{13, 13, 13}, 28},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%d layers %v", c.nLayer, c.budgets), func(t *testing.T) {
			sz := uniformSizing(c.nLayer)
			for seed := range uint64(30) {
				rng := rand.New(rand.NewPCG(seed, 39))
				v := View{NLayer: c.nLayer}
				for i, b := range c.budgets {
					ch, ok := Choose(v, sz, budgetOf(sz, b), 1, nil, rng)
					if !ok {
						t.Fatal("no window fits")
					}
					v.Servers = append(v.Servers, Server{Peer: fmt.Sprint(i), Range: ch.Range, MsPerLayer: 1})
				}
				if v.Deficit() != 0 {
					t.Fatalf("seed %d: no route: %v", seed, v.Servers)
				}
				n := 0
				for _, x := range v.graph().copies(nil) {
					if x < 2 {
						n++
					}
				}
				if n > c.singles {
					t.Fatalf("seed %d: %d layers with under two routable copies (want ≤ %d): %v", seed, n, c.singles, v.Servers)
				}
			}
		})
	}
}

// TestRebalanceKeepsSpareCopies: a throughput move that would leave a
// layer with one routable copy is not made (a gap move still is).
func TestRebalanceKeepsSpareCopies(t *testing.T) {
	sz := uniformSizing(28)
	// 0-14 is slow (two copies), 14-28 fast (me and b): moving me to 0-14
	// would raise the weakest layer well past Margin, and leave 14-28 on
	// b alone.
	v := View{NLayer: 28, Servers: []Server{{Peer: "a", Range: Range{0, 14}, MsPerLayer: 4}, {Peer: "c", Range: Range{0, 14}, MsPerLayer: 4},
		{Peer: "b", Range: Range{14, 28}, MsPerLayer: 0.5}}}
	b := NewRebalancer(sz, budgetOf(sz, 14), rand.New(rand.NewPCG(4, 4)))
	for i := range 8 {
		if d := b.Check(v, "me", Range{14, 28}, 0.5); d.Move {
			t.Fatalf("check %d: moved %+v, leaving 14-28 one copy", i, d)
		}
	}
	// With a third copy of 14-28 the same move keeps two: it is made.
	v.Servers = append(v.Servers, Server{Peer: "d", Range: Range{14, 28}, MsPerLayer: 0.5})
	moved := false
	for range 8 {
		if d := b.Check(v, "me", Range{14, 28}, 0.5); d.Move {
			moved = d.To == Range{0, 14}
			break
		}
	}
	if !moved {
		t.Fatal("the throughput move that keeps two copies of 14-28 was not made")
	}
}
