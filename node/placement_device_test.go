package node

import (
	"strings"
	"testing"

	"github.com/neuron-tai/meshp2p/engine"
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
			c := newPlacementController(nil, nil, nil, &tc.cfg, false, nil)
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
