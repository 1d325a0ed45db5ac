package perfbench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/neuron-tai/meshp2p/engine/gguf"
)

// Spec is the benchmark model of issue 16: a 154M-parameter f16 llama,
// 12 layers × 1024 (16 heads, no GQA, ff 2816), random weights, the small
// built-in vocabulary. Big enough that per-hop costs show against real
// matmul work, small enough for a 2-core machine.
func Spec() gguf.Spec {
	s := gguf.DefaultSpec("llama")
	s.Embd, s.Layers, s.Heads, s.KVHeads, s.FF, s.Type, s.Seed = 1024, 12, 16, 16, 2816, gguf.TypeF16, 1
	return s
}

// CacheDir is where the model is synthesized once (never in the
// repository): $MESHP2P_BENCH_DIR, else <user cache>/meshp2p-bench.
func CacheDir() (string, error) {
	if d := os.Getenv("MESHP2P_BENCH_DIR"); d != "" {
		return d, nil
	}
	d, err := os.UserCacheDir()
	if err != nil {
		d = os.TempDir()
	}
	return filepath.Join(d, "meshp2p-bench"), nil
}

// Files returns the whole benchmark model and its even k-way shard files,
// synthesizing and splitting them on first use.
func Files(ctx context.Context, k int) (whole string, shards []string, err error) {
	return FilesOf(ctx, Spec(), k)
}

// FilesOf is Files for the model of spec s.
func FilesOf(ctx context.Context, s gguf.Spec, k int) (whole string, shards []string, err error) {
	dir, err := CacheDir()
	if err != nil {
		return "", nil, err
	}
	key := fmt.Sprintf("%s-e%d-l%d-h%d-kv%d-ff%d-%v-seed%d", s.Arch, s.Embd, s.Layers, s.Heads, s.KVHeads, s.FF, s.Type, s.Seed)
	whole = filepath.Join(dir, key+".gguf")
	if f, err := gguf.Open(whole); err == nil {
		f.Close()
	} else {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return "", nil, err
		}
		tmp := whole + ".tmp"
		if err := gguf.Synth(ctx, s, tmp); err != nil {
			return "", nil, err
		}
		if err := os.Rename(tmp, whole); err != nil {
			return "", nil, err
		}
	}
	if k <= 1 {
		return whole, []string{whole}, nil
	}
	ranges := gguf.EvenSplit(s.Layers, k)
	splitDir := filepath.Join(dir, fmt.Sprintf("%s.split%d", key, k))
	missing := false
	for _, r := range ranges {
		p := filepath.Join(splitDir, gguf.ShardName(whole, r))
		if f, err := gguf.Open(p); err == nil {
			f.Close()
		} else {
			missing = true
		}
		shards = append(shards, p)
	}
	if missing {
		if _, err := gguf.Split(ctx, whole, ranges, splitDir, nil); err != nil {
			return "", nil, err
		}
	}
	return whole, shards, nil
}
