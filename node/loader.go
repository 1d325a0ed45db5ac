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

// windowLoader turns model files into loaded layer windows: it cuts (or
// finds cached) a window's shard file, checks the device holds it, loads
// and calibrates it, and says where a model's vocabulary file lives. It
// holds no serving state: the data dir, the engine and the device only.
type windowLoader struct {
	dataDir  string
	engine   engine.Config
	noMmap   bool
	device   engine.Device
	progress func(done, total int64) // shard splitting (Config.SplitProgress)
	share    *threadShare            // nil: engine.Threads as configured
	log      *slog.Logger
}

func newWindowLoader(cfg Config) *windowLoader {
	l := &windowLoader{dataDir: cfg.P2P.DataDir, engine: cfg.Engine, noMmap: cfg.NoMmap, device: cfg.Device,
		progress: cfg.SplitProgress, log: cfg.Logger}
	if cfg.ThreadShare != nil && cfg.Engine.Threads == 0 && cfg.Device.IsCPU() {
		l.share = newThreadShare(cfg.ThreadShare, cfg.Logger)
	}
	return l
}

// loadedShard is one loaded layer window.
type loadedShard struct {
	model       *engine.Model
	shard       *engine.Shard
	path        string
	calibration time.Duration
	share       *threadShare // the share that sizes its threads (nil: none)
}

func (ls *loadedShard) close() {
	ls.share.remove(ls.shard)
	ls.shard.Close()
	ls.model.Close()
}

func (ls *loadedShard) engine() session.Engine {
	return shardengine.Engine{Model: ls.model, Shard: ls.shard}
}

// window is the layer range ls holds.
func (ls *loadedShard) window() gguf.Range {
	i := ls.shard.Info()
	return gguf.Range{Start: i.Start, End: i.End}
}

// load loads the shard file at path and measures its decode speed.
func (l *windowLoader) load(ctx context.Context, path string) (*loadedShard, error) {
	ls := &loadedShard{path: path}
	if err := l.checkDevice(path); err != nil {
		return nil, err
	}
	var err error
	began := time.Now()
	var size int64
	if st, serr := os.Stat(path); serr == nil {
		size = st.Size()
	}
	l.log.Info("loading shard", "file", filepath.Base(path), "bytes", size, "mmap", !l.noMmap, "device", l.device.Name)
	if ls.model, err = engine.LoadModel(ctx, path, engine.LoadOptions{NoMmap: l.noMmap, Device: l.device, Progress: loadProgress(l.log, began)}); err != nil {
		return nil, err
	}
	ec := l.engine
	var gate *windowGate
	if l.share != nil {
		gate = l.share.configure(ctx, &ec)
	}
	if ls.shard, err = engine.NewShard(ctx, ls.model, ec); err != nil {
		ls.model.Close()
		return nil, err
	}
	ls.share = l.share
	l.share.add(ls.shard)
	l.log.Info("shard loaded; measuring its decode speed", "took", time.Since(began).Round(time.Millisecond), "rows", calibrationRows)
	if ls.calibration, err = ls.shard.MeasureDecode(ctx, calibrationRows); err == nil {
		ls.calibration, err = gate.choose(ctx, ls.shard, ls.calibration, l.log)
	}
	if err != nil {
		ls.close()
		return nil, fmt.Errorf("measuring decode speed: %w", err)
	}
	l.log.Info("shard ready", "range", ls.window().String(), "decode_ms_per_token", float64(ls.calibration.Microseconds())/1000,
		"threads", ls.shard.Threads(), "threads_by", l.share.mode())
	return ls, nil
}

// loadProgress logs a long load's progress: each quarter done, with the
// time left, once a second has passed (a mapped file loads in less).
func loadProgress(log *slog.Logger, began time.Time) func(float32) {
	next := float32(0.25)
	return func(done float32) {
		if done < next || done >= 1 {
			return
		}
		for next <= done {
			next += 0.25
		}
		el := time.Since(began)
		if el < time.Second {
			return
		}
		left := time.Duration(float64(el) * float64(1-done) / float64(done))
		log.Info("loading shard", "done", fmt.Sprintf("%.0f%%", 100*done), "left", left.Round(time.Second))
	}
}

// cut cuts (or finds cached) window r of the whole model file at path,
// which must still be model want.
func (l *windowLoader) cut(ctx context.Context, path, want string, r gguf.Range) (string, error) {
	shard, fp, _, err := prepareShard(ctx, l.dataDir, path, r, l.progress, l.log)
	if err != nil {
		return "", err
	}
	if fp != want {
		return "", fmt.Errorf("model file %s changed: fingerprint %.16s, expected %.16s", path, fp, want)
	}
	return shard, nil
}

// checkDevice refuses a shard file the device cannot hold: a GPU's memory
// is not the page cache, so a window that does not fit fails here, with
// the numbers, not in the backend (and before anything is released for it).
func (l *windowLoader) checkDevice(path string) error {
	dev := l.device
	if dev.IsCPU() {
		return nil
	}
	need, err := deviceNeed(path, l.engine)
	if err != nil {
		return err
	}
	if err := dev.CheckFits(uint64(need)); err != nil {
		return fmt.Errorf("shard %s on %s: %w", filepath.Base(path), dev.Name, err)
	}
	return nil
}

// vocabFile is where the node keeps model fp's vocabulary.
func (l *windowLoader) vocabFile(fp string) string {
	return filepath.Join(l.dataDir, "shards", fp[:16], "vocab.gguf")
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

// deviceNeed is what the shard file at path takes on a GPU: its layers'
// weights and KV cache, the compute buffers and, on a tail (its range is the
// end of the model), the output matrix and logits; a head's logits too (it
// computes them for every row). Not the load's slack (host memory). Token embeddings stay on
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
	// A shard file says its range; a whole model is its own tail. A head
	// computes logits for every row (placement.Sizing.HeadFixedBytes).
	si, err := gguf.ReadShardInfo(f.Metadata)
	switch {
	case err != nil || si.Range.End == si.ParentNLayer:
		need += sz.TailBytes + sz.TailFixedBytes
	case si.Range.Start == 0:
		need += sz.HeadFixedBytes
	}
	return need, nil
}

// loadFixed loads the window of a node given its layers (or a pre-cut
// shard, or the window it fetched) and says whose it is (fixedShard).
func (l *windowLoader) loadFixed(ctx context.Context, modelPath string, layers *gguf.Range, name string) (*loadedShard, ownModel, error) {
	if err := os.MkdirAll(l.dataDir, 0o700); err != nil {
		return nil, ownModel{}, err
	}
	path, m, err := l.fixedShard(ctx, modelPath, layers)
	if err != nil {
		return nil, ownModel{}, err
	}
	m.name = modelName(name, modelPath)
	ls, err := l.load(ctx, path)
	return ls, m, err
}

// fixedShard is the shard a node given its layers serves: modelPath
// itself when it is a pre-cut shard (its proof checked), else the layers
// window (nil: all) split from the whole model into the data dir
// (cached). It also reads or builds the model's manifest, which peers
// fetching only their layers verify against.
func (l *windowLoader) fixedShard(ctx context.Context, modelPath string, layers *gguf.Range) (string, ownModel, error) {
	f, err := gguf.Open(modelPath)
	if err != nil {
		return "", ownModel{}, err
	}
	nl, err := f.NLayer()
	_, shardErr := gguf.ReadShardInfo(f.Metadata)
	f.Close()
	if err != nil {
		return "", ownModel{}, err
	}
	if shardErr == nil {
		// A pre-cut shard (meshp2p shard split): serve it as it is, after
		// checking its proof, so a machine needs only its own layers.
		si, err := gguf.VerifyShard(ctx, modelPath)
		if err != nil {
			return "", ownModel{}, fmt.Errorf("%s: %w", modelPath, err)
		}
		if layers != nil && *layers != si.Range {
			return "", ownModel{}, fmt.Errorf("%s holds layers %s, not --layers %s", modelPath, si.Range, *layers)
		}
		m := ownModel{fp: si.ParentFingerprint, nLayer: si.ParentNLayer}
		l.log.Info("serving a pre-cut shard", "path", modelPath, "range", si.Range.String(), "model", m.fp)
		if mf, err := gguf.ReadManifestFile(manifestPath(l.dataDir, m.fp), m.fp); err == nil {
			m.manifest = mf.Marshal()
		}
		return modelPath, m, nil
	}
	r := gguf.Range{Start: 0, End: nl}
	if layers != nil {
		r = *layers
	}
	path, fp, nl, err := prepareShard(ctx, l.dataDir, modelPath, r, l.progress, l.log)
	if err != nil {
		return "", ownModel{}, err
	}
	m := ownModel{fp: fp, nLayer: nl, file: modelPath}
	if m.manifest, err = ensureManifest(ctx, l.dataDir, modelPath, fp); err != nil {
		return "", ownModel{}, fmt.Errorf("manifest: %w", err)
	}
	return path, m, nil
}
