package node

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/node/shardengine"
	"github.com/neuron-tai/meshp2p/session"
)

// The serving side of the node's layer window: loading a shard, serving
// it on the hop, swapping it for another, and what the node reports about
// it. Where the window goes is the placementController's (placement.go),
// which reaches the node through windowHost.

var _ windowHost = (*Node)(nil)

// loadedShard is one loaded layer window.
type loadedShard struct {
	model       *engine.Model
	shard       *engine.Shard
	path        string
	calibration time.Duration
}

func (ls *loadedShard) close() {
	ls.shard.Close()
	ls.model.Close()
}

func (ls *loadedShard) engine() session.Engine {
	return shardengine.Engine{Model: ls.model, Shard: ls.shard}
}

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

// loadWindow loads the shard file at path and measures its decode speed.
func (n *Node) loadWindow(ctx context.Context, path string) (*loadedShard, error) {
	ls := &loadedShard{path: path}
	if err := n.checkDevice(path); err != nil {
		return nil, err
	}
	var err error
	if ls.model, err = engine.LoadModel(ctx, path, engine.LoadOptions{NoMmap: n.cfg.NoMmap, Device: n.cfg.Device}); err != nil {
		return nil, err
	}
	if ls.shard, err = engine.NewShard(ctx, ls.model, n.cfg.Engine); err != nil {
		ls.model.Close()
		return nil, err
	}
	if ls.calibration, err = ls.shard.MeasureDecode(ctx, calibrationRows); err != nil {
		ls.close()
		return nil, fmt.Errorf("measuring decode speed: %w", err)
	}
	i := ls.shard.Info()
	n.log.Info("shard ready", "range", gguf.Range{Start: i.Start, End: i.End}.String(), "decode_ms_per_token", float64(ls.calibration.Microseconds())/1000)
	return ls, nil
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
	return n.cutModelShard(ctx, n.cfg.ModelPath, n.fp, r)
}

// cutModelShard implements windowHost: window r of the whole model file
// at path, which must still be model fp.
func (n *Node) cutModelShard(ctx context.Context, path, want string, r gguf.Range) (string, error) {
	shard, fp, _, err := prepareShard(ctx, n.cfg.P2P.DataDir, path, r, n.cfg.SplitProgress, n.log)
	if err != nil {
		return "", err
	}
	if fp != want {
		return "", fmt.Errorf("model file %s changed: fingerprint %.16s, expected %.16s", path, fp, want)
	}
	return shard, nil
}

// checkDevice implements windowHost: a GPU's memory is not the page
// cache: a window that does not fit fails here, with the numbers, not in
// the backend.
func (n *Node) checkDevice(path string) error {
	dev := n.cfg.Device
	if dev.IsCPU() {
		return nil
	}
	need, err := deviceNeed(path, n.cfg.Engine)
	if err != nil {
		return err
	}
	if err := dev.CheckFits(uint64(need)); err != nil {
		return fmt.Errorf("shard %s on %s: %w", filepath.Base(path), dev.Name, err)
	}
	return nil
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
	pc := newPlacementController(n, p2pSwarm{n.p2p}, n.log, pcfg, len(cfg.P2P.Bootstrap) > 0, n.cutShard)
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
	vp := n.vocabFile()
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

// vocabFile is where the node keeps its model's vocabulary.
func (n *Node) vocabFile() string { return n.vocabFileOf(n.fp) }

// vocabFileOf is where the node keeps model fp's vocabulary.
func (n *Node) vocabFileOf(fp string) string {
	return filepath.Join(n.cfg.P2P.DataDir, "shards", fp[:16], "vocab.gguf")
}

// writeVocab writes (once; a cached one is checked against the model, and
// rewritten when it does not belong to it: a truncated write or a file
// swapped in the data dir would otherwise be handed out) the vocabulary
// of the model at path to vp.
func writeVocab(ctx context.Context, path, vp, fp string, log *slog.Logger) error {
	if err := os.MkdirAll(filepath.Dir(vp), 0o755); err != nil {
		return err
	}
	if _, err := os.Stat(vp); err == nil {
		cerr := gguf.CheckVocab(ctx, vp, fp)
		if cerr == nil {
			return nil
		}
		log.Warn("cached vocabulary does not match the model; rewriting it", "file", vp, "err", cerr)
		_ = os.Remove(vp)
	}
	if err := gguf.WriteVocab(ctx, path, vp); err != nil {
		return fmt.Errorf("write vocabulary: %w", err)
	}
	return nil
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
	vp := n.vocabFile()
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

// deviceNeed is what the shard file at path takes on a GPU: its layers'
// weights and KV cache, the compute buffers and, on a tail (its range is the
// end of the model), the output matrix and logits. Token embeddings stay on
// the CPU (llama.cpp keeps the input layer there), and a shard file is
// not a whole model: Sizing.Need over the file alone would count a head's
// embeddings twice (as a tied output) and a tail's head part.
func deviceNeed(path string, ec engine.Config) (int64, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sz, _, err := fileSizing(f, ec)
	if err != nil {
		return 0, err
	}
	need := sz.FixedBytes
	for _, b := range sz.LayerBytes {
		need += b + sz.KVBytesPerLayer + sz.KVScratchBytesPerLayer
	}
	// A shard file says its range; a whole model is its own tail.
	if si, err := gguf.ReadShardInfo(f.Metadata); err != nil || si.Range.End == si.ParentNLayer {
		need += sz.TailBytes + sz.TailFixedBytes
	}
	return need, nil
}
