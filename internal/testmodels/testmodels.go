// Package testmodels locates the shared GGUF test fixtures for tests: the
// directory in $MESHP2P_MODELS, else shared/models next to the repository
// (../shared/models from the module root), as on developer machines and CI.
// Model files are never committed to the project.
package testmodels

import (
	"os"
	"path/filepath"
	"testing"
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
