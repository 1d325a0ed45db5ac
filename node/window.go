package node

import (
	"context"
	"fmt"
	"time"

	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/session"
)

// The serving side of the node's layer window: serving a loaded shard
// (loader.go) on the hop, swapping it for another, and what the node
// reports about it. Where the window goes is the placementController's (placement.go),
// which reaches the node through windowHost.

var _ windowHost = (*Node)(nil)

// servedModel is the served model's fingerprint and layer count (set during
// Start, before anything runs concurrently).
func (n *Node) servedModel() (string, int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.fp, n.nLayer
}

// servedWindow is the window served now and its decode time per layer.
func (n *Node) servedWindow() (gguf.Range, float64, bool) {
	var measured float32
	if n.hop != nil {
		measured = n.hop.DecodeMsPerLayer()
	}
	sh, cal := n.servingNow()
	if sh == nil {
		return gguf.Range{}, 0, false
	}
	i := sh.Info()
	r := gguf.Range{Start: i.Start, End: i.End}
	if measured != 0 {
		return r, float64(measured), true
	}
	return r, float64(float32(float64(cal.Microseconds()) / 1000 / float64(max(1, r.Len())))), true
}

// swapWindow implements windowHost: the first window gets a new hop
// service; a later one is added to the hop beside the served window,
// which stops admitting. Either way the node serves the new window's
// tensors to fetchers (and its vocabulary, if it has one and the node
// served none).
func (n *Node) swapWindow(ctx context.Context, ls *loadedShard, commit func(from *gguf.Range)) (*loadedShard, error) {
	first := n.hop == nil
	switch {
	case first:
	case n.hop.Fingerprint() != n.fp:
		// A multi-model node's new model (models.go): its old model's
		// windows were drained (releaseWindow).
		if err := n.hop.Retarget(n.fp, n.cfg.hopEngine(ls.engine())); err != nil {
			return nil, err
		}
	default:
		if err := n.hop.AddEngine(ls.engine()); err != nil {
			return nil, err
		}
	}
	n.mu.Lock()
	var old *loadedShard
	var from *gguf.Range
	if n.shard != nil {
		old = &loadedShard{model: n.model, shard: n.shard, path: n.shardPath, calibration: n.calibration}
		from = &gguf.Range{Start: n.shard.Info().Start, End: n.shard.Info().End}
	}
	n.model, n.shard, n.shardPath, n.calibration = ls.model, ls.shard, ls.path, ls.calibration
	commit(from)
	n.mu.Unlock()
	if first {
		n.cfg.Hop.Fingerprint = n.fp
		n.hop = session.NewHopService(n.host, n.cfg.hopEngine(ls.engine()), n.cfg.Hop)
	} else if from != nil {
		n.hop.StopAdmitting(from.Start, from.End)
	}
	n.serveFetch(ctx, ls.path)
	if !first {
		n.serveVocabOf(ctx, ls)
	}
	return old, nil
}

// retireWindow implements windowHost.
func (n *Node) retireWindow(ctx context.Context, old *loadedShard, from gguf.Range) int {
	dctx, cancel := context.WithTimeout(ctx, DrainTimeout)
	ended := n.hop.Drain(dctx, from.Start, from.End)
	cancel()
	old.close()
	return ended
}

// releaseWindow implements windowHost.
func (n *Node) releaseWindow(ctx context.Context) (gguf.Range, string, int, bool) {
	n.mu.Lock()
	if n.shard == nil || n.hop == nil {
		n.mu.Unlock()
		return gguf.Range{}, "", 0, false
	}
	old := &loadedShard{model: n.model, shard: n.shard, path: n.shardPath, calibration: n.calibration}
	from := gguf.Range{Start: n.shard.Info().Start, End: n.shard.Info().End}
	n.model, n.shard, n.shardPath, n.calibration = nil, nil, "", 0
	n.mu.Unlock()
	if err := n.publish(); err != nil {
		n.log.Warn("advertise without the released window", "err", err)
	}
	return from, old.path, n.retireWindow(ctx, old, from), true
}

// capacity is the served shard's capacity (zero while none is served: a
// client, or a move that released its old window before loading the new).
func (n *Node) capacity() engine.Capacity {
	if sh := n.Shard(); sh != nil {
		return sh.Capacity()
	}
	return engine.Capacity{}
}

// windowMoved implements windowHost: node.json names the new window.
func (n *Node) windowMoved() {
	if _, err := n.WriteInfo(); err != nil {
		n.log.Warn("write node info", "err", err)
	}
}

// cutShard cuts (or finds cached) the shard for r from the whole model
// file: the placement controller's shardFor for a node with the file.
func (n *Node) cutShard(ctx context.Context, r gguf.Range) (string, error) {
	return n.loader.cut(ctx, n.cfg.ModelPath, n.fp, r)
}

// startPlaced makes a node with the whole model file choose its window,
// announce it, reconsider after a random pause, load it, and start
// serving and rebalancing.
func (n *Node) startPlaced(ctx, bg context.Context) error {
	cfg := n.cfg
	fp, nl, err := modelFingerprint(ctx, cfg.P2P.DataDir, cfg.ModelPath, n.log)
	if err != nil {
		return fmt.Errorf("placing layers: %w", err)
	}
	sz, in, err := modelSizing(cfg.ModelPath, cfg.Engine)
	if err != nil {
		return err
	}
	var pcfg *PlacementConfig
	if cfg.Placement != nil {
		c := *cfg.Placement
		c.Device = cfg.Device
		pcfg = &c
	}
	pc := newPlacementController(n, n.loader, p2pSwarm{n.p2p}, n.log, pcfg, len(cfg.P2P.Bootstrap) > 0, n.cutShard)
	src, err := pc.size(sz, in.NEmbd, in.Architecture)
	if err != nil {
		return err
	}
	pc.table = n.table
	n.mu.Lock()
	n.fp, n.nLayer, n.place = fp, nl, pc
	n.mu.Unlock()
	if len(cfg.Models) > 0 {
		if err := n.startCatalog(ctx, pc, src); err != nil {
			return err
		}
	}
	ls, err := pc.placeFirst(ctx)
	if err != nil {
		return err
	}
	if _, err := n.swapWindow(ctx, ls, pc.served); err != nil {
		ls.close()
		return err
	}
	n.serveModelVocab(ctx)
	if err := n.publish(); err != nil {
		return err
	}
	pc.startRebalancing()
	n.wg.Add(2)
	go func() { defer n.wg.Done(); n.advertLoop(bg) }()
	go func() { defer n.wg.Done(); pc.run(bg) }()
	return nil
}

// startCatalog reads the models of a multi-model node, checks each fits
// the budget, and makes the node start on the one demand asks for (else
// the first).
func (n *Node) startCatalog(ctx context.Context, pc *placementController, budgetFrom string) error {
	cat, err := n.loadCatalog(ctx)
	if err != nil {
		return err
	}
	for _, m := range cat {
		if err := checkFits(m, pc.budget, budgetFrom); err != nil {
			return err
		}
	}
	n.mu.Lock()
	n.catalog = cat
	n.mu.Unlock()
	pc.models = cat
	pc.settle(ctx)
	m := pc.firstModel(ctx)
	n.setModel(m)
	pc.resize(m)
	n.log.Info("serving several models, one at a time", "models", len(cat), "first", m.name)
	return nil
}

// modelServed serves the vocabulary of a multi-model node's new model.
func (n *Node) modelServed(ctx context.Context) { n.serveModelVocab(ctx) }

// serveModelVocab serves the vocabulary of a self-placing node, which
// holds the whole model file, whatever window it is on.
func (n *Node) serveModelVocab(ctx context.Context) {
	vp := n.loader.vocabFile(n.fp)
	if err := writeVocab(ctx, n.cfg.ModelPath, vp, n.fp, n.log); err != nil {
		n.log.Warn("vocabulary not served", "err", err)
		return
	}
	if err := n.vocab.Add(n.fp, vp); err == nil {
		n.mu.Lock()
		n.vocabPath = vp
		n.mu.Unlock()
	}
}

// serveVocabOf starts serving the vocabulary of a fetched node that had
// none (its first window was a middle one, which carries no tokenizer)
// once it loads a window that has it. A node that serves one keeps it
// whatever window it moves to.
func (n *Node) serveVocabOf(ctx context.Context, ls *loadedShard) {
	n.mu.Lock()
	have := n.vocabPath != ""
	n.mu.Unlock()
	if have || !ls.model.Info().HasVocab {
		return
	}
	vp := n.loader.vocabFile(n.fp)
	if err := writeVocab(ctx, ls.path, vp, n.fp, n.log); err != nil {
		n.log.Warn("vocabulary not served", "err", err)
		return
	}
	if err := n.vocab.Add(n.fp, vp); err != nil {
		n.log.Warn("vocabulary not served", "err", err)
		return
	}
	n.mu.Lock()
	n.vocabPath = vp
	n.mu.Unlock()
	n.log.Info("serving the vocabulary of the new window", "file", vp)
}

// serveFetch makes the node serve the model's manifest and its current
// window's tensors to fetchers (building the manifest from the whole file
// when it has none).
func (n *Node) serveFetch(ctx context.Context, shardPath string) {
	if n.manifest == nil {
		mb, err := ensureManifest(ctx, n.cfg.P2P.DataDir, n.cfg.ModelPath, n.fp)
		if err != nil {
			n.log.Warn("no manifest to serve to fetchers", "err", err)
		}
		n.manifest = mb
	}
	if err := n.fetchSrv.Add(n.fp, shardPath, n.manifest); err != nil {
		n.log.Warn("tensors not served to fetchers", "err", err)
	}
}

// Placement reports what automatic placement is doing (Auto false when
// the node was given --layers).
func (n *Node) Placement() PlacementStatus {
	n.mu.Lock()
	defer n.mu.Unlock()
	var st PlacementStatus
	if n.place != nil {
		st = n.place.status()
	}
	if n.shard != nil {
		st.Current = gguf.Range{Start: n.shard.Info().Start, End: n.shard.Info().End}
	}
	return st
}

// RebalanceInterval is the period of the placement checks (0 without
// placement).
func (n *Node) RebalanceInterval() time.Duration {
	if n.place == nil {
		return 0
	}
	return n.place.interval()
}
