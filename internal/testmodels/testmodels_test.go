package testmodels

import (
	"path/filepath"
	"testing"
)

// A clone without ../shared/models (a new user's) still finds the model
// the repository ships, and skips, saying why, for the others.
func TestPathWithoutSharedModels(t *testing.T) {
	t.Setenv("MESHP2P_MODELS", filepath.Join(t.TempDir(), "absent"))
	if p := Path(t, "stories260K.gguf"); filepath.Base(filepath.Dir(p)) != "models" || !filepath.IsAbs(p) {
		t.Fatalf("stories260K.gguf: %q, want the repository's models/ copy", p)
	}
	var skipped bool
	t.Run("absent fixture", func(t *testing.T) {
		defer func() { skipped = t.Skipped() }()
		Path(t, "no-such-model.gguf")
		t.Error("Path returned for a model nowhere to be found")
	})
	if !skipped {
		t.Fatal("a missing fixture did not skip its test")
	}
}
