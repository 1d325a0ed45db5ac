// Package testmodels locates the shared GGUF test fixtures for tests: the
// directory in $MESHP2P_MODELS, else shared/models next to the repository
// (../shared/models from the module root), as on developer machines and CI.
// Model files are never committed to the project.
package testmodels

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/neuron-tai/meshp2p/engine/gguf"
)

// Dir returns the fixture directory and whether it exists.
func Dir() (string, bool) {
	if d := os.Getenv("MESHP2P_MODELS"); d != "" {
		_, err := os.Stat(d)
		return d, err == nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", false
	}
	// Walk up to the module root (the directory holding go.mod).
	for dir := wd; ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			d := filepath.Join(filepath.Dir(dir), "shared", "models")
			_, err := os.Stat(d)
			return d, err == nil
		}
		if filepath.Dir(dir) == dir {
			return "", false
		}
	}
}

// Path returns the absolute path of fixture name, or skips the test with a
// clear message when the fixtures are not there.
func Path(t testing.TB, name string) string {
	t.Helper()
	d, ok := Dir()
	p := filepath.Join(d, name)
	if ok {
		if _, err := os.Stat(p); err == nil {
			abs, err := filepath.Abs(p)
			if err == nil {
				return abs
			}
			return p
		}
	}
	t.Skipf("test model %s not found (set MESHP2P_MODELS or provide ../shared/models next to the repository)", name)
	return ""
}

// Synth writes a small random-weight llama model named name with the
// given layer count (n_embd 64) into the test's temporary directory.
func Synth(t testing.TB, name string, layers int) string {
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
