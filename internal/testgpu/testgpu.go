// Package testgpu locates the GPU backend libraries tests load (make gpu's
// output): $MESHP2P_BACKEND_DIR, else .cache/gpu/lib under the module root.
// Without them a GPU test skips with a clear message, unless
// MESHP2P_GPU_TESTS=require (make test sets it, after building the Vulkan
// library): then it fails, so CI cannot pass by skipping.
package testgpu

import (
	"os"
	"path/filepath"
	"testing"
)

// Dir returns the backend directory holding libggml-<backend>.so and its
// stamp, or skips (fails when required) when there is none.
func Dir(t testing.TB, backend string) string {
	t.Helper()
	d := os.Getenv("MESHP2P_BACKEND_DIR")
	if d == "" {
		d = filepath.Join(moduleRoot(), ".cache", "gpu", "lib")
	}
	lib := filepath.Join(d, "libggml-"+backend+".so")
	if _, err := os.Stat(lib); err != nil {
		Missing(t, "no "+lib+" (build it with `make gpu`)")
	}
	return d
}

// Missing skips the test with why, or fails it when GPU tests are required.
func Missing(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("MESHP2P_GPU_TESTS") == "require" {
		t.Fatalf("GPU test required (MESHP2P_GPU_TESTS=require): %s", why)
	}
	t.Skipf("GPU test skipped: %s", why)
}

func moduleRoot() string {
	wd, err := os.Getwd()
	if err != nil {
		return "."
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		if filepath.Dir(dir) == dir {
			return wd
		}
	}
}
