package node

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/neuron-tai/meshp2p/engine/gguf"
)

// A model of an architecture the engine refuses (qwen3next, refused with
// its measured reason) is refused before its fingerprint and cut: nothing
// is written to the data directory, and the error says why.
func TestRefusedModelCutsNothing(t *testing.T) {
	ctx := context.Background()
	spec := gguf.DefaultSpec("qwen3next")
	spec.Layers = 8
	model := filepath.Join(t.TempDir(), "q3n.gguf")
	if err := gguf.Synth(ctx, spec, model); err != nil {
		t.Fatal(err)
	}
	dataDir := t.TempDir()
	_, _, _, err := prepareShard(ctx, dataDir, model, gguf.Range{Start: 0, End: 4}, nil, slog.New(slog.DiscardHandler))
	if !errors.Is(err, gguf.ErrRefusedArch) || !errors.Is(err, gguf.ErrNotLoadable) {
		t.Fatalf("prepareShard: %v, want gguf.ErrRefusedArch", err)
	}
	_ = filepath.WalkDir(dataDir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && p != dataDir {
			t.Errorf("%s written for a refused model", p)
		}
		return nil
	})
}
