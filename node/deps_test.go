package node

import (
	"os/exec"
	"strings"
	"testing"
)

// node is the serving side: it never imports the API (OpenAI error objects
// are built only in api) nor the client (the origin side).
func TestServingSideDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	mod := "github.com/neuron-tai/meshp2p/"
	deps := strings.Fields(string(out))
	for _, d := range deps {
		if d == mod+"api" || d == mod+"client" {
			t.Errorf("node depends on %s", d)
		}
	}
	if !strings.Contains(string(out), mod+"session") {
		t.Fatalf("go list output looks wrong:\n%s", out)
	}
}
