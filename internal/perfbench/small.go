package perfbench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/neuron-tai/meshp2p/engine/gguf"
)

// SmallModel is the committed models/stories260K.gguf (5 layers × 64):
// its per-token compute (tens of µs per hop) is small against a link
// delay of milliseconds, so a ring of it is bound by latency, not by the
// CPU. It is found by walking up from the working directory to go.mod.
func SmallModel() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			p := filepath.Join(dir, "models", "stories260K.gguf")
			if _, err := os.Stat(p); err != nil {
				return "", fmt.Errorf("small bench model: %w", err)
			}
			return p, nil
		}
		if filepath.Dir(dir) == dir {
			return "", fmt.Errorf("small bench model: no go.mod above %s", wd)
		}
	}
}

// SmallFiles splits the small model k ways into the bench cache (once)
// and returns the shard files in route order.
func SmallFiles(ctx context.Context, k int) ([]string, error) {
	src, err := SmallModel()
	if err != nil {
		return nil, err
	}
	dir, err := CacheDir()
	if err != nil {
		return nil, err
	}
	f, err := gguf.Open(src)
	if err != nil {
		return nil, err
	}
	n, ok := f.Metadata.Uint("llama.block_count")
	f.Close()
	if !ok {
		return nil, fmt.Errorf("small bench model %s: no llama.block_count", src)
	}
	ranges := gguf.EvenSplit(int(n), k)
	splitDir := filepath.Join(dir, fmt.Sprintf("stories260K.split%d", k))
	var shards []string
	missing := false
	for _, r := range ranges {
		p := filepath.Join(splitDir, gguf.ShardName(src, r))
		if g, err := gguf.Open(p); err == nil {
			g.Close()
		} else {
			missing = true
		}
		shards = append(shards, p)
	}
	if missing {
		if _, err := gguf.Split(ctx, src, ranges, splitDir, nil); err != nil {
			return nil, err
		}
	}
	return shards, nil
}
