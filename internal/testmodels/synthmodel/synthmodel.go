// Package synthmodel writes small random-weight models for tests (its own
// package: engine/gguf's tests import testmodels, which must not import
// gguf).
package synthmodel

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/neuron-tai/meshp2p/engine/gguf"
)

// Llama writes a small random-weight llama model named name with the given
// layer count (n_embd 64) into the test's temporary directory.
func Llama(t testing.TB, name string, layers int) string {
	t.Helper()
	spec := gguf.DefaultSpec("llama")
	spec.Layers, spec.Embd, spec.FF, spec.Name = layers, 64, 128, name
	spec.Seed = uint64(len(name))
	path := filepath.Join(t.TempDir(), name+".gguf")
	if err := gguf.Synth(context.Background(), spec, path); err != nil {
		t.Fatal(err)
	}
	return path
}
