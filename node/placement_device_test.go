package node

import (
	"context"
	"strings"
	"testing"

	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/internal/testmodels"
	"github.com/neuron-tai/meshp2p/placement"
)

// A GPU node's default budget is its device's free memory (less 10%), not
// the host's RAM; --memory still wins; a CPU node keeps placement.Budget.
func TestPlacementBudgetFromDevice(t *testing.T) {
	gpu := engine.Device{Name: "vulkan0", Type: "gpu", FreeBytes: 10 << 30, TotalBytes: 12 << 30}
	_, hostSrc, err := placement.Budget()
	if err != nil {
		t.Skip(err)
	}
	for _, tc := range []struct {
		name    string
		cfg     PlacementConfig
		want    int64 // 0: the host's budget
		wantSrc string
	}{
		{"gpu", PlacementConfig{Device: gpu}, 9 << 30, "vulkan0's free memory"},
		{"memory flag wins", PlacementConfig{Device: gpu, Memory: 1 << 30}, 1 << 30, "--memory"},
		{"cpu", PlacementConfig{}, 0, hostSrc},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newPlacementController(nil, nil, nil, nil, nil, &tc.cfg, false)
			src, err := c.size(placement.Sizing{NLayer: 4, LayerBytes: make([]int64, 4)}, 256, "llama")
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(src, tc.wantSrc) || tc.want != 0 && c.budget != tc.want || tc.want == 0 && c.budget <= 0 {
				t.Fatalf("budget %d from %q, want %d from %q…", c.budget, src, tc.want, tc.wantSrc)
			}
		})
	}
}

// deviceNeed counts a shard's layers, cache and buffers, the output only
// on the tail, the logits on the head, and never the token embeddings
// (they stay on the CPU) nor the load's slack (host memory).
func TestDeviceNeedOfShards(t *testing.T) {
	path := testmodels.Path(t, "stories260K.gguf")
	ec := DefaultEngine()
	whole, err := ModelSizing(path, ec)
	if err != nil {
		t.Fatal(err)
	}
	res, err := gguf.Split(context.Background(), path, gguf.EvenSplit(whole.NLayer, 3), t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		need, err := deviceNeed(r.Path, ec)
		if err != nil {
			t.Fatal(err)
		}
		rg := placement.Range{Start: r.Range.Start, End: r.Range.End}
		onDevice := whole
		onDevice.LoadSlackDiv = 0 // the load's slack is host memory
		want := onDevice.Need(rg)
		if rg.Start == 0 {
			want -= whole.HeadBytes
		}
		if need != want {
			t.Fatalf("shard %d %v: deviceNeed %d, want the whole model's sizing of the range less embeddings: %d", i, rg, need, want)
		}
	}
}
