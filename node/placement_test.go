package node

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/internal/testmodels"
	"github.com/neuron-tai/meshp2p/placement"
	"github.com/neuron-tai/meshp2p/session"
	"github.com/neuron-tai/meshp2p/status"
)

// testRebalance is the one value the placement tests shorten (by name).
const testRebalance = 2 * time.Second

// placed starts a node without layers: it chooses them within budget.
func (tn *testNet) placed(model string, budget int64, seed uint64) *Node {
	tn.t.Helper()
	cfg := tn.config(tn.t.TempDir())
	cfg.ModelPath = model
	cfg.Placement = &PlacementConfig{Memory: budget, Interval: testRebalance, Seed: seed}
	n, err := Start(context.Background(), cfg)
	if err != nil {
		tn.t.Fatalf("start self-placing node: %v", err)
	}
	tn.t.Cleanup(func() { n.Close() })
	if tn.boot == nil {
		tn.boot = []peer.AddrInfo{n.P2P().AddrInfo()}
	}
	return n
}

// budgetFor is the most any window of k layers of the model needs: a
// node with it holds k layers wherever it goes, and not k+1 in the middle.
func budgetFor(sz placement.Sizing, k int) int64 {
	var b int64
	for s := 0; s+k <= sz.NLayer; s++ {
		b = max(b, sz.Need(placement.Range{Start: s, End: s + k}))
	}
	return b
}

// replicas counts, per layer, the loaded windows of the given nodes.
func replicas(nl int, nodes []*Node) []int {
	c := make([]int, nl)
	for _, n := range nodes {
		in := n.Info()
		for l := in.Start; l < in.End; l++ {
			c[l]++
		}
	}
	return c
}

func windows(nodes []*Node) []string {
	var out []string
	for _, n := range nodes {
		in := n.Info()
		out = append(out, fmt.Sprintf("%d-%d", in.Start, in.End))
	}
	return out
}

// waitCover waits until every layer has at least k replicas among nodes
// and the client's table shows a loaded window for each node; returns how
// long it took.
func waitCover(t *testing.T, c *Node, fp string, nodes []*Node, k int, within time.Duration) time.Duration {
	t.Helper()
	t0 := time.Now()
	for {
		rep := replicas(nodes[0].set.now().nLayer, nodes)
		ok := true
		for _, r := range rep {
			ok = ok && r >= k
		}
		if ok && advertised(c, fp, nodes) {
			return time.Since(t0)
		}
		if time.Since(t0) > within {
			t.Fatalf("after %v: replicas per layer %v (windows %v), want ≥ %d", within, rep, windows(nodes), k)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// advertised: the client's table has each node's current window, loaded.
func advertised(c *Node, fp string, nodes []*Node) bool {
	for _, n := range nodes {
		in, found := n.Info(), false
		for _, s := range c.Table().Shards(fp) {
			found = found || (s.Peer == n.P2P().ID() && s.Start == in.Start && s.End == in.End && s.Capacity.GetMaxSessions() > 0)
		}
		if !found {
			return false
		}
	}
	return true
}

// fixableVictim picks a node that alone serves some layer and whose loss
// the others can repair by the placement rules (budgets permitting).
func fixableVictim(t *testing.T, sz placement.Sizing, budget int64, nodes []*Node) (*Node, []*Node) {
	t.Helper()
	for i, v := range nodes {
		var rest []*Node
		rest = append(rest, nodes[:i]...)
		rest = append(rest, nodes[i+1:]...)
		if !hasGap(replicas(sz.NLayer, rest)) {
			continue
		}
		view := placement.View{NLayer: sz.NLayer}
		for _, n := range rest {
			in := n.Info()
			view.Servers = append(view.Servers, placement.Server{Peer: n.P2P().ID().String(), Range: placement.Range{Start: in.Start, End: in.End}, MsPerLayer: 1})
		}
		for _, n := range rest {
			in := n.Info()
			d := placement.NewRebalancer(sz, budget, rand.New(rand.NewPCG(1, 1))).Check(view, n.P2P().ID().String(), placement.Range{Start: in.Start, End: in.End}, 1)
			if d.Move && d.Reason == placement.ReasonGap {
				return v, rest
			}
		}
	}
	t.Fatalf("no node's loss is both a gap and repairable: windows %v", windows(nodes))
	return nil, nil
}

func hasGap(rep []int) bool {
	for _, r := range rep {
		if r == 0 {
			return true
		}
	}
	return false
}

func generateEqualsLocal(t *testing.T, c *Node, model, fp string, nl int, prompt []int32, n int) session.Result {
	t.Helper()
	o := c.Origin(nil)
	res, err := o.Generate(context.Background(), session.GenerateRequest{Fingerprint: fp, NLayer: nl, Prompt: prompt, MaxTokens: n})
	if err != nil {
		t.Fatal(err)
	}
	if want := localTokens(t, model, prompt, n); !equalTokens(res.Tokens, want) {
		t.Fatalf("swarm %v\nlocal %v", res.Tokens, want)
	}
	return *res
}

// TestAutoPlacementLoopback: 4 nodes started without layers, with budgets
// that hold 4 layers of a 12-layer model, cover it and answer exactly like
// the whole model; killing one that alone served some layers makes the
// others close the gap, and generation works again; 3 more nodes (6
// layers each) put a second replica on every layer.
func TestAutoPlacementLoopback(t *testing.T) {
	model := synthModel(t, "auto12", 12)
	tn := newTestNet(t)
	sz, err := ModelSizing(model, tn.config("").Engine)
	if err != nil {
		t.Fatal(err)
	}
	b4 := budgetFor(sz, 4)
	t.Logf("one middle layer %d B, head +%d B, tail +%d B, fixed %d B; budget for 4 layers %d B",
		sz.LayerBytes[5]+sz.KVBytesPerLayer, sz.HeadBytes, sz.TailBytes+sz.TailFixedBytes, sz.FixedBytes, b4)
	if sz.MaxWindow(4, b4) >= 6 {
		t.Fatalf("budget %d holds %d middle layers; want about 4", b4, sz.MaxWindow(4, b4))
	}
	t0 := time.Now()
	nodes := []*Node{tn.placed(model, b4, 1)}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range 3 { // the others start together: announce, pause, re-choose
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := tn.placed(model, b4, uint64(i+2))
			mu.Lock()
			nodes = append(nodes, n)
			mu.Unlock()
		}()
	}
	wg.Wait()
	c := tn.client()
	fp, nl := waitModel(t, c, "auto12")
	took := waitCover(t, c, fp, nodes, 1, 60*time.Second)
	t.Logf("4 nodes cover the model %v after the first started (%v after all were up): %v", time.Since(t0), took, windows(nodes))
	for _, n := range nodes {
		if st := n.Placement(); !st.Auto || st.Budget != b4 {
			t.Fatalf("placement status %+v", st)
		}
	}
	prompt := thinClientPrompt(t, c, fp, "Once upon a time")
	generateEqualsLocal(t, c, model, fp, nl, prompt, 24)

	// Kill one abruptly (no advert withdrawal): the others see it is gone
	// by a failed dial and close the gap within two rebalance periods.
	victim, rest := fixableVictim(t, sz, b4, nodes)
	t.Logf("killing %s (%d-%d); replicas without it %v", victim.P2P().ID(), victim.Info().Start, victim.Info().End, replicas(nl, rest))
	_ = victim.P2P().Host().Close()
	tn.boot = nil // nodes started from now on bootstrap from survivors
	for _, n := range rest {
		tn.boot = append(tn.boot, n.P2P().AddrInfo())
	}
	healed := waitCover(t, c, fp, rest, 1, 2*time.Duration(float64(testRebalance)*(1+RebalanceJitter))+15*time.Second)
	t.Logf("gap closed %v after the kill (rebalance interval %v): %v", healed, testRebalance, windows(rest))
	res := generateEqualsLocal(t, c, model, fp, nl, prompt, 24)
	for _, h := range res.Route.Hops {
		if h.Peer == victim.P2P().ID() && res.Reroutes == 0 {
			t.Fatal("the route used the killed node")
		}
	}

	// Three more nodes, each with room for 6 layers, go where the swarm
	// is weakest: every layer gets a second replica.
	b6 := budgetFor(sz, 6)
	ta := time.Now()
	all := append([]*Node(nil), rest...)
	for i := range 3 {
		all = append(all, tn.placed(model, b6, uint64(10+i)))
	}
	spread := waitCover(t, c, fp, all, 2, 60*time.Second)
	t.Logf("7 nodes: every layer has ≥ 2 replicas %v after the first new node started (%v after the last): %v, replicas %v",
		time.Since(ta), spread, windows(all), replicas(nl, all))
	generateEqualsLocal(t, c, model, fp, nl, prompt, 24)
}

// TestMoveDuringGeneration: a node on the route moves to another window
// while a generation runs through it: the session finishes on the old
// window with the whole model's tokens and no re-route, then the old
// window is released and the node serves (and advertises) the new one.
func TestMoveDuringGeneration(t *testing.T) {
	model := synthModel(t, "move12", 12)
	tn := newTestNet(t)
	a := tn.shard(model, gguf.Range{Start: 0, End: 6})
	b := tn.shard(model, gguf.Range{Start: 6, End: 12})
	c := tn.client()
	fp, nl := waitModel(t, c, "move12")
	waitShards(t, c.Table(), fp, 2)
	prompt := thinClientPrompt(t, c, fp, "Once upon a time")
	const maxTok = 400
	want := localTokens(t, model, prompt, maxTok)
	moved := make(chan error, 1)
	stop := make(chan struct{})
	// overlap: the old window was draining while the session still ran
	// on it (so the move really happened during the generation).
	var overlap, docDraining atomic.Bool
	go func() {
		for {
			if st := b.Placement(); st.Moving != nil && b.Hop().Sessions() > 0 {
				overlap.Store(true)
				// The status document (GET /api/status) shows the move too.
				sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				p := b.Status(sctx, "node").Self.Placement
				if p != nil && p.Draining != nil && *p.Draining == (status.Window{Start: st.Moving.Start, End: st.Moving.End}) {
					docDraining.Store(true)
				}
				cancel()
				return
			}
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Microsecond):
			}
		}
	}()
	go func() {
		for b.Hop().Sessions() == 0 || b.Hop().DecodeSteps() < 5 {
			select {
			case <-stop:
				moved <- fmt.Errorf("no session reached the node")
				return
			case <-time.After(time.Millisecond):
			}
		}
		moved <- b.place.move(context.Background(), gguf.Range{Start: 3, End: 9}, false)
	}()
	res, err := c.Origin(nil).Generate(context.Background(), session.GenerateRequest{Fingerprint: fp, NLayer: nl, Prompt: prompt, MaxTokens: maxTok})
	if err == nil {
		// Closing the session is what ends the drain; wait for the move
		// before stopping the watcher.
		select {
		case err := <-moved:
			moved <- err
		case <-time.After(60 * time.Second):
		}
	}
	close(stop)
	if err != nil {
		t.Fatal(err)
	}
	if res.Reroutes != 0 || !equalTokens(res.Tokens, want) {
		t.Fatalf("reroutes %d\nswarm %v\nlocal %v", res.Reroutes, res.Tokens, want)
	}
	select {
	case err := <-moved:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the move did not finish after the session ended")
	}
	if !overlap.Load() {
		t.Fatal("the move did not overlap the session: nothing was drained")
	}
	if !docDraining.Load() {
		t.Fatal("during the move the status document did not show the draining window")
	}
	if in := b.Info(); in.Start != 3 || in.End != 9 {
		t.Fatalf("after the move the node serves %d-%d", in.Start, in.End)
	}
	if r := b.Hop().Ranges(); len(r) != 1 || r[0] != (session.ServedRange{Start: 3, End: 9, Admitting: true}) {
		t.Fatalf("hop ranges %+v", r)
	}
	if st := b.Placement(); st.Moves != 1 || st.Moving != nil || st.Loading != nil {
		t.Fatalf("placement status %+v", st)
	}
	deadline := time.Now().Add(20 * time.Second)
	for !advertised(c, fp, []*Node{a, b}) {
		if time.Now().After(deadline) {
			t.Fatal("the client never saw the new window")
		}
		time.Sleep(20 * time.Millisecond)
	}
	assertReleased(t, tn, a, b)
}

// The sizing takes weights at the file's tensor types (F16 halves every
// layer matrix against F32), the KV cache from --ctx and the model's KV
// heads, and matches the bytes the GGUF header declares per layer.
func TestModelSizingUsesTensorTypes(t *testing.T) {
	dir := t.TempDir()
	sizes := map[gguf.TensorType]placement.Sizing{}
	for _, typ := range []gguf.TensorType{gguf.TypeF32, gguf.TypeF16} {
		spec := gguf.DefaultSpec("llama")
		spec.Layers, spec.Type = 4, typ
		path := fmt.Sprintf("%s/m%d.gguf", dir, typ)
		if err := gguf.Synth(context.Background(), spec, path); err != nil {
			t.Fatal(err)
		}
		sz, err := ModelSizing(path, engine.Config{NCtx: 1024, NBatch: 32})
		if err != nil {
			t.Fatal(err)
		}
		info, err := gguf.Inspect(context.Background(), path, false)
		if err != nil {
			t.Fatal(err)
		}
		for l, b := range info.LayerBytes {
			if sz.LayerBytes[l] != b {
				t.Fatalf("%v layer %d: sizing %d B, header %d B", typ, l, sz.LayerBytes[l], b)
			}
		}
		// KV: 1024 cells × (K + V) × head dim 32 × 2 KV heads × 2 bytes.
		if want := int64(1024 * 2 * 32 * 2 * 2); sz.KVBytesPerLayer != want {
			t.Fatalf("KV per layer %d, want %d", sz.KVBytesPerLayer, want)
		}
		sizes[typ] = sz
	}
	f32, f16 := sizes[gguf.TypeF32].LayerBytes[0], sizes[gguf.TypeF16].LayerBytes[0]
	if f16 >= f32*6/10 || f16 <= f32*4/10 {
		t.Fatalf("F16 layer %d B vs F32 %d B: want about half", f16, f32)
	}
}

// TestMemoryEstimateAgainstRSS: the memory estimate of each shard of a
// 3-way split (head, middle, tail) is within 10% of the resident memory
// the shard reaches in a fresh process driven to what the estimate counts
// (runShardPeak: a full batch with every row an output, a full context, a
// compaction of it). A llama with a real 32000-token vocabulary (the
// vocabulary terms count) and widths that keep the test short, and a
// deepseek2 (latent attention: the cache is one head of kv_lora_rank +
// rope dims; dense lead layers and experts of another size).
func TestMemoryEstimateAgainstRSS(t *testing.T) {
	llama := gguf.DefaultSpec("llama")
	llama.Layers, llama.Embd, llama.Heads, llama.KVHeads, llama.FF, llama.Type = 6, 1024, 16, 4, 2816, gguf.TypeF16
	llama.VocabFrom = testmodels.Path(t, "ggml-vocab-llama-spm.gguf")
	ds := gguf.DefaultSpec("deepseek2")
	ds.Layers, ds.Embd, ds.Heads, ds.FF, ds.ExpertFF, ds.Experts, ds.DenseLead, ds.Type = 6, 1024, 8, 2816, 704, 8, 2, gguf.TypeF16
	ds.QLoraRank, ds.KVLoraRank, ds.RopeDim, ds.NopeDim, ds.VDim = 256, 256, 64, 128, 128
	ds.VocabFrom = llama.VocabFrom
	for _, spec := range []gguf.Spec{llama, ds} {
		t.Run(spec.Arch, func(t *testing.T) {
			path := t.TempDir() + "/rss.gguf"
			if err := gguf.Synth(context.Background(), spec, path); err != nil {
				t.Fatal(err)
			}
			ec := engine.Config{NCtx: 512, NBatch: 128, MaxSessions: 4, Threads: 2, PrefixCacheCells: 256}
			est, peak := checkShardsRSS(t, path, []gguf.Range{{Start: 0, End: 2}, {Start: 2, End: 4}, {Start: 4, End: 6}}, ec)
			for i := range est {
				if d := float64(est[i]-peak[i]) / float64(peak[i]); math.Abs(d) > 0.10 {
					t.Errorf("shard %d: estimate %d B, resident memory reached %d B (%+.1f%%)", i, est[i], peak[i], 100*d)
				}
			}
		})
	}
}

// routableCopies counts, per layer, the loaded windows of nodes that lie
// on a complete route (a chain of windows from layer 0 to the last):
// a copy of a layer in a window no route can use is no spare.
func routableCopies(nl int, nodes []*Node) []int {
	from, to := make([]bool, nl+1), make([]bool, nl+1)
	from[0], to[nl] = true, true
	var ws []gguf.Range
	for _, n := range nodes {
		in := n.Info()
		ws = append(ws, gguf.Range{Start: in.Start, End: in.End})
	}
	for b := 0; b < nl; b++ {
		for _, w := range ws {
			if w.Start == b {
				from[w.End] = from[w.End] || from[b]
			}
		}
	}
	for b := nl - 1; b >= 0; b-- {
		for _, w := range ws {
			if w.Start == b {
				to[b] = to[b] || to[w.End]
			}
		}
	}
	c := make([]int, nl)
	for _, w := range ws {
		if from[w.Start] && to[w.End] {
			for l := w.Start; l < w.End; l++ {
				c[l]++
			}
		}
	}
	return c
}

// TestSelfPlacementSpareCopies (issue 39 item 6): four nodes with room
// for 10 layers of a 20-layer model, started one after another, end with
// every layer in two windows on complete routes (a spare for any one
// node's loss), and the swarm answers like the whole model. Before, the
// first node took a window anywhere (4-14, say) and split the rest into
// fragments: 0-4 and 14-20 for the next two, and no spare for 10 layers.
func TestSelfPlacementSpareCopies(t *testing.T) {
	// Layers wide enough that the ends' extras (embeddings, output,
	// logits) cost less than a layer: the same room holds 10 layers at an
	// end and not 11 in the middle.
	spec := gguf.DefaultSpec("llama")
	spec.Layers, spec.Embd, spec.FF, spec.Name = 20, 256, 768, "spare20"
	model := t.TempDir() + "/spare20.gguf"
	if err := gguf.Synth(context.Background(), spec, model); err != nil {
		t.Fatal(err)
	}
	tn := newTestNet(t)
	sz, err := ModelSizing(model, tn.config("").Engine)
	if err != nil {
		t.Fatal(err)
	}
	// Room for 10 layers anywhere and 11 nowhere: the most memory that
	// holds no window of 11 layers, which must hold the windows of 10 at
	// both ends (they cost the most: embeddings, output, logits).
	b10 := sz.Need(placement.Range{Start: 0, End: 11})
	for s := 0; s+11 <= sz.NLayer; s++ {
		b10 = min(b10, sz.Need(placement.Range{Start: s, End: s + 11})-1)
	}
	if b10 < budgetFor(sz, 10) {
		t.Fatalf("no budget holds 10 layers at the ends and 11 nowhere: %d < %d", b10, budgetFor(sz, 10))
	}
	var c *Node
	var nodes []*Node
	for i := range 4 { // one after another: each serves before the next starts
		nodes = append(nodes, tn.placed(model, b10, uint64(5+i)))
		if c == nil {
			c = tn.client()
		}
		waitCover(t, c, nodes[0].Fingerprint(), nodes, 0, 30*time.Second)
	}
	fp, nl := nodes[0].Fingerprint(), sz.NLayer
	deadline := time.Now().Add(60 * time.Second)
	for {
		rc := routableCopies(nl, nodes)
		ok := advertised(c, fp, nodes)
		for _, x := range rc {
			ok = ok && x >= 2
		}
		if ok {
			t.Logf("windows %v, routable copies per layer %v", windows(nodes), rc)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("windows %v: routable copies per layer %v, want ≥ 2 everywhere", windows(nodes), rc)
		}
		time.Sleep(100 * time.Millisecond)
	}
	prompt := thinClientPrompt(t, c, fp, "Once upon a time")
	generateEqualsLocal(t, c, model, fp, nl, prompt, 16)
}
