package node

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/route"
)

// TestModelSwitch runs the multi-model node in process (run it with
// -race after changing the node's locking): two nodes started with models
// A and B both serve A, the first given, and offer B. A client's origins ask for both (its meter,
// gossiped every DemandInterval, the one value shortened here by name):
// one node switches to B (drain, cut, load, hop retargeted), the other
// keeps A's last route, and both models then generate exactly what the
// whole model does.
func TestModelSwitch(t *testing.T) {
	a, b := synthModel(t, "switch-a", 4), synthModel(t, "switch-b", 3)
	tn := newTestNet(t)
	start := func(seed uint64) *Node {
		cfg := tn.config(t.TempDir())
		cfg.ModelPath, cfg.Models = a, []string{b}
		cfg.Placement = &PlacementConfig{Memory: 1 << 30, Interval: testRebalance, Seed: seed}
		n, err := Start(context.Background(), cfg)
		if err != nil {
			t.Fatalf("start a multi-model node: %v", err)
		}
		t.Cleanup(func() { n.Close() })
		if tn.boot == nil {
			tn.boot = []peer.AddrInfo{n.P2P().AddrInfo()}
		}
		return n
	}
	n1, n2 := start(1), start(2)
	fpA, nlA := n1.servedModel()
	if fp, _ := n2.servedModel(); fp != fpA {
		t.Fatalf("the second node started on %.16s, want the first model given (%.16s)", fp, fpA)
	}
	var fpB string
	nlB := 0
	for _, m := range n1.catalog {
		if m.fp != fpA {
			fpB, nlB = m.fp, m.nLayer
		}
	}
	ccfg := tn.config(t.TempDir())
	ccfg.P2P = clientPreset(ccfg.P2P)
	ccfg.DemandInterval = time.Second
	c, err := Start(context.Background(), ccfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	waitModel(t, c, "switch-a")
	for deadline := time.Now().Add(30 * time.Second); len(c.Table().Offers(fpB)) < 2; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("offers of B seen by the client: %+v", c.Table().Offers(fpB))
		}
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go func() {
		for ctx.Err() == nil {
			c.DemandMeter().Request(fpA)
			c.DemandMeter().Request(fpB)
			c.DemandMeter().Refused(fpB)
			time.Sleep(200 * time.Millisecond)
		}
	}()
	t0 := time.Now()
	var onB, onA *Node
	for deadline := time.Now().Add(60 * time.Second); onB == nil; time.Sleep(100 * time.Millisecond) {
		for _, n := range []*Node{n1, n2} {
			if fp, _ := n.servedModel(); fp == fpB && n.Shard() != nil {
				onB = n
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no node switched to B: %q / %q", n1.Placement().ModelWhy, n2.Placement().ModelWhy)
		}
	}
	onA = n1
	if onB == n1 {
		onA = n2
	}
	if fp, _ := onA.servedModel(); fp != fpA {
		t.Fatal("both nodes left A, which is still asked for")
	}
	t.Logf("a node switched to B %v after the demand started: %s", time.Since(t0).Round(time.Millisecond), onB.Placement().ModelWhy)
	waitModel(t, c, "switch-b")
	for !c.Table().Covers(fpB, nlB) {
		time.Sleep(50 * time.Millisecond)
	}
	prompt := []int32{1, 5, 9, 13}
	generateEqualsLocal(t, c, b, fpB, nlB, prompt, 12)
	generateEqualsLocal(t, c, a, fpA, nlA, prompt, 12)
	if st := onB.Placement(); st.Moves == 0 || st.ModelWhy == "" {
		t.Fatalf("placement status after the switch: %+v", st)
	}
	// The status document carries the gossiped demand.
	doc := c.Status(context.Background(), "client")
	seen := map[string]string{}
	for _, m := range doc.Demand {
		if m.Requests > 0 {
			seen[m.Fingerprint] = m.State
		}
	}
	if seen[fpA] != "served" || seen[fpB] != "served" {
		t.Fatalf("demand in the client's status: %+v", doc.Demand)
	}
}

// What a node with several models cannot do is refused before it starts.
func TestCheckModels(t *testing.T) {
	a, b := synthModel(t, "cm-a", 2), synthModel(t, "cm-b", 2)
	place := &PlacementConfig{Memory: 1 << 30}
	many := make([]string, route.MaxOffers+1)
	for i := range many {
		many[i] = b
	}
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"one model", Config{ModelPath: a}, ""},
		{"two, placed", Config{ModelPath: a, Models: []string{b}, Placement: place}, ""},
		{"no placement", Config{ModelPath: a, Models: []string{b}}, "automatic placement"},
		{"fixed layers", Config{ModelPath: a, Models: []string{b}, Placement: place, Layers: &gguf.Range{Start: 0, End: 1}}, "automatic placement"},
		{"too many", Config{ModelPath: a, Models: many, Placement: place}, "at most"},
		{"a draft", Config{ModelPath: a, Models: []string{b}, Placement: place, DraftPath: a}, "draft"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.checkModels()
			if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}
