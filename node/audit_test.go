package node

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/internal/testmodels"
)

// Issue 37, row 6: a tracker replaying proofs for every layer range of a
// model kept a split copy of each range on disk. Windows split only for
// replays are removed when evicted or closed: at most maxAuditShards stay,
// none after Close, and a window cached before (a node's own) is kept.
func TestAuditWindowsOnDiskBounded(t *testing.T) {
	model := testmodels.Path(t, "stories260K.gguf")
	dir := t.TempDir()
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	fp, _, err := modelFingerprint(ctx, dir, model, log)
	if err != nil {
		t.Fatal(err)
	}
	// A window the node itself cached earlier.
	own, _, _, err := prepareShard(ctx, dir, model, gguf.Range{Start: 0, End: 2}, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	a := &AuditEngines{Models: []string{model}, DataDir: dir, Threads: 1, Logger: log}
	files := func() int {
		m, _ := filepath.Glob(filepath.Join(dir, "shards", fp[:16], "*.gguf"))
		return len(m)
	}
	for _, r := range [][2]int{{0, 2}, {1, 3}, {2, 4}, {3, 5}, {0, 5}, {1, 4}} {
		_, _, release, err := a.Engine(ctx, fp, r[0], r[1])
		if err != nil {
			t.Fatalf("window %v: %v", r, err)
		}
		release()
		if n := files(); n > maxAuditShards+1 {
			t.Fatalf("after window %v: %d split windows on disk, want at most %d loaded plus the node's own", r, n, maxAuditShards)
		}
	}
	a.Close()
	if n := files(); n != 1 {
		t.Fatalf("%d split windows on disk after Close, want only the node's own", n)
	}
	if _, err := os.Stat(own); err != nil {
		t.Fatalf("the node's own cached window was removed: %v", err)
	}
}
