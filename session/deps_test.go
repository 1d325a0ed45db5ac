package session

import (
	"go/build"
	"strings"
	"testing"
)

// The protocol, the tracker, routing and observability never run a model: they must not
// link llama.cpp (the engine package), or they would need cgo to build and
// test.
func TestNoEngineDependency(t *testing.T) {
	const mod = "github.com/neuron-tai/meshp2p/"
	seen := map[string]string{} // package → the package that imports it
	var walk func(path, from string)
	walk = func(path, from string) {
		if _, ok := seen[path]; ok || !strings.HasPrefix(path, mod) {
			return
		}
		seen[path] = from
		p, err := build.Default.Import(path, ".", 0)
		if err != nil {
			t.Fatalf("import %s: %v", path, err)
		}
		for _, imp := range p.Imports {
			walk(imp, path)
		}
	}
	for _, root := range []string{"session", "tracker", "route", "proto/frame", "metrics", "status", "dashboard"} {
		walk(mod+root, "")
	}
	for p, from := range seen {
		if p == mod+"engine" {
			t.Errorf("%s imports the engine (llama.cpp)", from)
		}
	}
}
