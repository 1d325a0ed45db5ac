package placement

import (
	"os"
	"testing"
	"time"
)

// TestModelSimulation: nodes serving several models through a day of
// shifting demand (DayOfDemand: a model newly requested at hour 6, one
// fading out at hour 12, a surge at hour 15) under ChooseModel. make test
// runs 100 nodes and 4 models; make placement-sim (MESHP2P_PLACEMENT_SIM
// =full) 1000 nodes and 10 models, the figures in docs/placement.md.
func TestModelSimulation(t *testing.T) {
	cfg := ModelSimConfig{Nodes: 100, NodeBudget: 8 << 30, RouteRate: 1,
		Duration: 24 * time.Hour, Tick: time.Minute, CheckEvery: 5 * time.Minute, LoadTime: 3 * time.Minute, Seed: 1}
	cfg.ModelBytes = []int64{8 << 30, 16 << 30, 40 << 30, 4 << 30}
	if os.Getenv("MESHP2P_PLACEMENT_SIM") == "full" {
		cfg.Nodes = 1000
		cfg.ModelBytes = []int64{8 << 30, 16 << 30, 40 << 30, 4 << 30, 8 << 30, 70 << 30, 16 << 30, 4 << 30, 24 << 30, 8 << 30}
	}
	// Demand at every model's daily peak would take 90% of the nodes
	// (the surge on model 1 goes beyond).
	var nodesPerPeak float64
	for m, b := range cfg.ModelBytes {
		nodesPerPeak += float64((b+cfg.NodeBudget-1)/cfg.NodeBudget) / float64(1+m%4)
	}
	cfg.Demand = DayOfDemand(len(cfg.ModelBytes), 0.9*float64(cfg.Nodes)/nodesPerPeak)
	rep := SimulateModels(cfg)
	t.Logf("%d nodes, %d models, a day: %v", cfg.Nodes, len(cfg.ModelBytes), rep)
	static := cfg
	static.Static = true
	base := SimulateModels(static)
	t.Logf("baseline, nobody moves: %v", base)
	if rep.Served <= base.Served {
		t.Fatalf("placement across models served %.1f%%, no worse than nobody moving (%.1f%%)", 100*rep.Served, 100*base.Served)
	}
	last := len(cfg.ModelBytes) - 1
	if d := rep.TimeToServe[last]; d < 0 || d > 30*time.Minute {
		t.Fatalf("the newly requested model got a route after %v (want within 30 min)", d)
	}
	if rep.LostLastRoute > 0 {
		t.Fatalf("a model with demand lost its last route in %d ticks", rep.LostLastRoute)
	}
	if rep.Served < 0.8 {
		t.Fatalf("served %.1f%% of requests (want 80%%+)", 100*rep.Served)
	}
	if rep.MovesPerNodeHour > 0.5 || rep.Flaps > cfg.Nodes/10 {
		t.Fatalf("%.2f moves per node per hour, %d flaps: flapping", rep.MovesPerNodeHour, rep.Flaps)
	}
}
