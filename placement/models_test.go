package placement

import (
	"math"
	"testing"
	"time"
)

func TestChooseModel(t *testing.T) {
	const gib = 1 << 30
	for _, tc := range []struct {
		name     string
		cur      string
		models   []ModelLoad
		standby  int
		want     string
		wantMove float64 // -1: do not check
	}{
		{"standby warms a requested model nobody serves", "", []ModelLoad{
			{Fingerprint: "A", Bytes: gib, Demand: 2, Nodes: 4, Routes: 2},
			{Fingerprint: "B", Bytes: gib, Demand: 1, Unmet: 1},
		}, 2, "B", 1.0 / 4}, // B lacks 1 node; 2 standby + A's 2 spare could give it
		{"the last route of a model with demand stays", "A", []ModelLoad{
			{Fingerprint: "A", Bytes: gib, Demand: 0.1, Nodes: 2, Routes: 1},
			{Fingerprint: "B", Bytes: gib, Demand: 5, Unmet: 5},
		}, 0, "A", -1},
		{"an idle model keeps its last route for IdleRelease", "A", []ModelLoad{
			{Fingerprint: "A", Bytes: gib, Nodes: 2, Routes: 1, IdleFor: 10 * time.Minute},
			{Fingerprint: "B", Bytes: gib, Demand: 5, Unmet: 5},
		}, 0, "A", -1},
		{"after IdleRelease it gives way to demand", "A", []ModelLoad{
			{Fingerprint: "A", Bytes: gib, Nodes: 2, Routes: 1, IdleFor: 40 * time.Minute},
			{Fingerprint: "B", Bytes: gib, Demand: 5, Unmet: 5},
		}, 0, "B", 1.0 / 2}, // B lacks one node; A's two could give it
		{"a spare replica moves to unmet demand, spread by the deficit", "A", []ModelLoad{
			{Fingerprint: "A", Bytes: gib, Demand: 1, Nodes: 8, Routes: 4},
			{Fingerprint: "B", Bytes: gib, Demand: 4, Unmet: 2, Nodes: 2, Routes: 1, NodesPerRoute: 2},
		}, 0, "B", 2.0 / 4}, // B wants 2 routes (4 nodes); A wants 4 of its 8
		{"nobody spare: the nodes whose model keeps a route without them share the move", "A", []ModelLoad{
			{Fingerprint: "A", Bytes: gib, Demand: 1, Nodes: 5, Routes: 5},
			{Fingerprint: "B", Bytes: gib, Demand: 1, Unmet: 1},
		}, 0, "B", 1.0 / 4}, // B lacks 1 node; 4 of A's 5 could go
		{"refusals alone do not grow a model that has routes", "A", []ModelLoad{
			{Fingerprint: "A", Bytes: gib, Demand: 1, Nodes: 5, Routes: 5},
			{Fingerprint: "B", Bytes: gib, Demand: 50, Unmet: 50, Nodes: 1, Routes: 1},
		}, 0, "A", -1},
		{"hysteresis: a slightly hungrier model is not worth a move", "A", []ModelLoad{
			{Fingerprint: "A", Bytes: gib, Demand: 4, Unmet: 1, Nodes: 6, Routes: 3, NodesPerRoute: 2},
			{Fingerprint: "B", Bytes: gib, Demand: 4, Unmet: 1.2, Nodes: 6, Routes: 3, NodesPerRoute: 2},
		}, 0, "A", -1},
		{"a much hungrier one is", "A", []ModelLoad{
			{Fingerprint: "A", Bytes: gib, Demand: 4, Unmet: 1, Nodes: 6, Routes: 3, NodesPerRoute: 2},
			{Fingerprint: "B", Bytes: gib, Demand: 4, Unmet: 2, Nodes: 6, Routes: 3, NodesPerRoute: 2},
		}, 0, "B", -1},
		{"per byte: the small model's unmet demand weighs more", "A", []ModelLoad{
			{Fingerprint: "A", Bytes: gib, Demand: 1, Nodes: 6, Routes: 3},
			{Fingerprint: "big", Bytes: 40 * gib, Demand: 4, Unmet: 2, Nodes: 40, Routes: 1},
			{Fingerprint: "small", Bytes: gib, Demand: 2, Unmet: 1, Nodes: 2, Routes: 1, NodesPerRoute: 2},
		}, 0, "small", -1},
		{"nothing lacks capacity: stay", "A", []ModelLoad{
			{Fingerprint: "A", Bytes: gib, Demand: 1, Nodes: 6, Routes: 3},
			{Fingerprint: "B", Bytes: gib, Demand: 1, Nodes: 2, Routes: 1},
		}, 3, "A", -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ChooseModel(tc.cur, tc.models, tc.standby, ModelRules{})
			if c.Target != tc.want || c.Why == "" {
				t.Fatalf("ChooseModel(%q) = %+v, want %q", tc.cur, c, tc.want)
			}
			if tc.wantMove >= 0 && math.Abs(c.Move-tc.wantMove) > 1e-9 {
				t.Fatalf("Move %v, want %v (%s)", c.Move, tc.wantMove, c.Why)
			}
			if c.Target != tc.cur && (c.Move <= 0 || c.Move > 1) {
				t.Fatalf("a move with probability %v", c.Move)
			}
			t.Logf("%s → %s (move %.2f): %s", tc.cur, c.Target, c.Move, c.Why)
		})
	}
}
