package p2p

import (
	"os/exec"
	"strings"
	"testing"
)

// internal/ holds test harnesses that import nearly everything, plus the
// CLI's failure file: a library package importing from it is an arrow
// running back up the floors (issue 38 found 12, all through
// internal/peerlimit, now p2p/peerlimit). Only the CLI (cmd/) and
// internal/ itself may import internal packages.
func TestNoLibraryImportsInternal(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "github.com/neuron-tai/meshp2p/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	const mod = "github.com/neuron-tai/meshp2p/"
	var bad []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(f[0], mod+"internal/") || strings.HasPrefix(f[0], mod+"cmd/") {
			continue
		}
		for _, imp := range f[1:] {
			if strings.HasPrefix(imp, mod+"internal/") {
				bad = append(bad, f[0]+" → "+imp)
			}
		}
	}
	if len(bad) > 0 {
		t.Fatalf("library packages importing internal/ (move the imported package next to its users):\n%s", strings.Join(bad, "\n"))
	}
}
