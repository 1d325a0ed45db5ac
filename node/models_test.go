package node

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/placement"
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
	needA, needB := wholeNeed(t, tn, a), wholeNeed(t, tn, b)
	budget := max(needA, needB) + min(needA, needB)/2 // one whole model, not two: a switch, no extra
	start := func(seed uint64) *Node {
		cfg := tn.config(t.TempDir())
		cfg.ModelPath, cfg.Models = a, []string{b}
		cfg.Placement = &PlacementConfig{Memory: budget, Interval: testRebalance, Seed: seed}
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
	fpA, nlA := n1.set.now().fp, n1.set.now().nLayer
	if fp := n2.Fingerprint(); fp != fpA {
		t.Fatalf("the second node started on %.16s, want the first model given (%.16s)", fp, fpA)
	}
	var fpB string
	nlB := 0
	for _, m := range n1.set.catalog {
		if m.fp != fpA {
			fpB, nlB = m.fp, m.nLayer
		}
	}
	c := demandClient(t, tn)
	waitModel(t, c, "switch-a")
	for deadline := time.Now().Add(30 * time.Second); len(c.Table().Offers(fpB)) < 2; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("offers of B seen by the client: %+v", c.Table().Offers(fpB))
		}
	}
	askFor(t, c, fpA, fpB)
	t0 := time.Now()
	var onB, onA *Node
	for deadline := time.Now().Add(60 * time.Second); onB == nil; time.Sleep(100 * time.Millisecond) {
		for _, n := range []*Node{n1, n2} {
			if fp := n.Fingerprint(); fp == fpB && n.Shard() != nil {
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
	if fp := onA.Fingerprint(); fp != fpA {
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
	// The switch released A at onB: no registry there serves it any more.
	if s := servedOf(t, c, onB, fpA, nlA, firstTensor(t, a), true); s.vocab || s.manifest || s.tensor || s.session || s.advert {
		t.Fatalf("the node that switched to B still serves A: %+v", s)
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

// wholeNeed is what serving every layer of model takes (placement.Sizing).
func wholeNeed(t *testing.T, tn *testNet, model string) int64 {
	t.Helper()
	sz, err := ModelSizing(model, tn.config("").Engine)
	if err != nil {
		t.Fatal(err)
	}
	return sz.Need(placement.Range{Start: 0, End: sz.NLayer})
}

// TestModelExtra: a node whose budget holds both its models whole serves
// the second beside the first when it is asked for (no switch, no drain):
// one hop, both models, each generating what the whole model does; its
// node info and placement status say so, and it no longer offers it.
func TestModelExtra(t *testing.T) {
	a, b := synthModel(t, "extra-a", 4), synthModel(t, "extra-b", 3)
	tn := newTestNet(t)
	cfg := tn.config(t.TempDir())
	cfg.ModelPath, cfg.Models = a, []string{b}
	cfg.Placement = &PlacementConfig{Memory: wholeNeed(t, tn, a) + wholeNeed(t, tn, b) + 1<<20, Interval: testRebalance, Seed: 1}
	n, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	tn.boot = []peer.AddrInfo{n.P2P().AddrInfo()}
	fpA, nlA := n.set.now().fp, n.set.now().nLayer
	fpB, nlB := n.set.catalog[1].fp, n.set.catalog[1].nLayer
	c := demandClient(t, tn)
	waitModel(t, c, "extra-a")
	askFor(t, c, fpA, fpB)
	for deadline := time.Now().Add(60 * time.Second); len(n.Info().AlsoServes) == 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("B not served beside A: %q", n.Placement().ModelWhy)
		}
	}
	if fp := n.Fingerprint(); fp != fpA || !slices.Equal(n.Info().AlsoServes, []string{"extra-b"}) {
		t.Fatalf("after B was asked for: own %.16s, also %v", fp, n.Info().AlsoServes)
	}
	t.Logf("served beside: %s", n.Placement().ModelWhy)
	for !c.Table().Covers(fpB, nlB) {
		time.Sleep(50 * time.Millisecond)
	}
	prompt := []int32{1, 5, 9, 13}
	generateEqualsLocal(t, c, b, fpB, nlB, prompt, 12)
	generateEqualsLocal(t, c, a, fpA, nlA, prompt, 12)
	if os := c.Table().Offers(fpB); len(os) != 0 {
		t.Fatalf("B still offered while served: %+v", os)
	}
	doc := n.Status(context.Background(), "node")
	shards := 0
	for _, m := range doc.Models {
		for _, s := range m.Shards {
			if s.Self {
				shards++
			}
		}
	}
	if shards != 2 {
		t.Fatalf("the node's status shows %d shards of its own, want 2 (A and B)", shards)
	}
}

// demandClient starts a client peer whose origins' demand is gossiped
// every second (DemandInterval, the one value shortened, by name).
func demandClient(t *testing.T, tn *testNet) *Node {
	t.Helper()
	cfg := tn.config(t.TempDir())
	cfg.P2P = clientPreset(cfg.P2P)
	cfg.DemandInterval = time.Second
	c, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// askFor counts demand at c's meter until the test ends: model served
// asked for and answered, model wanted asked for and refused (no route).
func askFor(t *testing.T, c *Node, served, wanted string) {
	ctx, stop := context.WithCancel(context.Background())
	t.Cleanup(stop)
	go func() {
		for ctx.Err() == nil {
			c.DemandMeter().Request(served)
			c.DemandMeter().Request(wanted)
			c.DemandMeter().Refused(wanted)
			time.Sleep(200 * time.Millisecond)
		}
	}()
}
