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
	root, ok := moduleRoot()
	if !ok {
		return "", false
	}
	d := filepath.Join(filepath.Dir(root), "shared", "models")
	_, err := os.Stat(d)
	return d, err == nil
}

// moduleRoot walks up from the working directory to the one holding
// go.mod.
func moduleRoot() (string, bool) {
	wd, err := os.Getwd()
	if err != nil {
		return "", false
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, true
		}
		if filepath.Dir(dir) == dir {
			return "", false
		}
	}
}

// Path returns the absolute path of fixture name, or skips the test with a
// clear message when the fixtures are not there. A fixture the repository
// itself ships (models/: the demo's stories260K.gguf) is found there when
// the fixture directory lacks it, so a fresh clone without ../shared still
// runs the tests that need only it.
func Path(t testing.TB, name string) string {
	t.Helper()
	var candidates []string
	if d, ok := Dir(); ok {
		candidates = append(candidates, filepath.Join(d, name))
	}
	if root, ok := moduleRoot(); ok {
		candidates = append(candidates, filepath.Join(root, "models", name))
	}
	for _, p := range candidates {
		if _, err := os.Stat(p); err == nil {
			if abs, err := filepath.Abs(p); err == nil {
				return abs
			}
			return p
		}
	}
	t.Skipf("test model %s not found (set MESHP2P_MODELS or provide ../shared/models next to the repository)", name)
	return ""
}
