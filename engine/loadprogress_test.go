package engine

import (
	"context"
	"errors"
	"testing"

	"github.com/neuron-tai/meshp2p/internal/testmodels"
)

// A load reports its progress, ending at 1, and a load whose context ends
// is aborted at the next report with the context's error.
func TestLoadProgressAndCancel(t *testing.T) {
	path := testmodels.Path(t, "stories260K.gguf")
	var reports []float32
	m, err := LoadModel(context.Background(), path, LoadOptions{NoMmap: true, Progress: func(d float32) { reports = append(reports, d) }})
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
	if len(reports) < 2 || reports[len(reports)-1] != 1 {
		t.Fatalf("progress reports %v: want several, the last 1", reports)
	}
	for i := 1; i < len(reports); i++ {
		if reports[i] < reports[i-1] {
			t.Fatalf("progress went back: %v", reports)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	_, err = LoadModel(ctx, path, LoadOptions{NoMmap: true, Progress: func(float32) { calls++; cancel() }})
	if !errors.Is(err, context.Canceled) || calls != 1 {
		t.Fatalf("cancelled at the first report: err %v after %d reports", err, calls)
	}
}
