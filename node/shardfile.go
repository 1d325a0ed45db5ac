package node

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/neuron-tai/meshp2p/engine/gguf"
)

// fpCache remembers a model file's fingerprint keyed by path, size and
// modification time, so restarting a node does not re-hash gigabytes.
type fpCache struct {
	Path    string `json:"path"`
	Size    int64  `json:"size"`
	ModTime int64  `json:"mod_time_ns"`
	FP      string `json:"fingerprint"`
	NLayer  int    `json:"n_layer"`
}

// modelFingerprint returns the fingerprint and layer count of a whole model.
// A model the engine refuses (an architecture without rules, or one refused
// with a reason) is refused from its header, before its fingerprint and cut
// read and copy the whole file.
func modelFingerprint(ctx context.Context, dataDir, path string, log *slog.Logger) (string, int, error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", 0, err
	}
	abs, _ := filepath.Abs(path)
	cacheFile := filepath.Join(dataDir, "fingerprints.json")
	var cache []fpCache
	if b, err := os.ReadFile(cacheFile); err == nil {
		_ = json.Unmarshal(b, &cache)
	}
	for _, c := range cache {
		if c.Path == abs && c.Size == st.Size() && c.ModTime == st.ModTime().UnixNano() {
			return c.FP, c.NLayer, nil
		}
	}
	f, err := gguf.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	if _, ok := f.Metadata.Get(gguf.KeyParentFingerprint); ok {
		return "", 0, fmt.Errorf("%s is a shard file; give the whole model to --model", path)
	}
	// Refused before anything reads or copies the whole file (a model
	// that fails is never cached, so a cache hit above was checked).
	if err := gguf.ValidateForLoad(f); err != nil {
		return "", 0, fmt.Errorf("%s: %w", path, err)
	}
	n, err := f.NLayer()
	if err != nil {
		return "", 0, err
	}
	t0 := time.Now()
	log.Info("fingerprinting model (once; cached)", "path", path, "bytes", st.Size())
	// The same pass gives the manifest peers fetching their layers verify
	// against (kept next to the shards); a header too large for a manifest
	// only means this node serves none.
	var fp string
	if f.HeaderSize > gguf.MaxManifestHeader {
		if fp, err = gguf.Fingerprint(ctx, f); err != nil {
			return "", 0, err
		}
	} else {
		m, err := gguf.BuildManifest(ctx, path, nil)
		if err != nil {
			return "", 0, err
		}
		fp = m.Fingerprint()
		if err := writeAtomic(manifestPath(dataDir, fp), m.Marshal()); err != nil {
			return "", 0, err
		}
	}
	log.Info("fingerprint", "fingerprint", fp, "took", time.Since(t0).Round(time.Millisecond))
	cache = append(cache, fpCache{Path: abs, Size: st.Size(), ModTime: st.ModTime().UnixNano(), FP: fp, NLayer: n})
	if b, err := json.MarshalIndent(cache, "", "  "); err == nil {
		_ = os.WriteFile(cacheFile, b, 0o644)
	}
	return fp, n, nil
}

// prepareShard returns the path of the shard file for layers r of the model
// at path, splitting it into dataDir/shards on first use. A cached shard is
// re-verified (its proof against the fingerprint) before use.
// shardCachePath is where prepareShard keeps window r of model path
// (fingerprint fp) in dataDir.
func shardCachePath(dataDir, fp, path string, r gguf.Range) string {
	return filepath.Join(dataDir, "shards", fp[:16], gguf.ShardName(path, r))
}

func prepareShard(ctx context.Context, dataDir, path string, r gguf.Range, progress func(done, total int64), log *slog.Logger) (shardPath, fp string, nLayer int, err error) {
	fp, nLayer, err = modelFingerprint(ctx, dataDir, path, log)
	if err != nil {
		return "", "", 0, err
	}
	if err := gguf.ValidateRanges([]gguf.Range{r}, nLayer); err != nil {
		return "", "", 0, fmt.Errorf("--layers %s: %w", r, err)
	}
	out := shardCachePath(dataDir, fp, path, r)
	dir := filepath.Dir(out)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", 0, err
	}
	if _, err := os.Stat(out); err == nil {
		if _, err := gguf.CheckShard(ctx, out, fp, r); err == nil {
			log.Info("using cached shard", "path", out)
			return out, fp, nLayer, nil
		}
		log.Warn("cached shard failed verification; splitting again", "path", out)
		_ = os.Remove(out)
	}
	log.Info("splitting model into shard (first start only)", "range", r.String(), "out", out)
	res, err := gguf.Split(ctx, path, []gguf.Range{r}, dir, progress)
	if err != nil {
		return "", "", 0, err
	}
	if res[0].Fingerprint != fp {
		return "", "", 0, fmt.Errorf("model changed while splitting (fingerprint %s, expected %s)", res[0].Fingerprint, fp)
	}
	return res[0].Path, fp, nLayer, nil
}
