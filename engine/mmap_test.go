package engine

import (
	"context"
	"math"
	"testing"

	"github.com/neuron-tai/meshp2p/internal/testmodels"
)

// Reading the weights instead of mapping them (NoMmap, `start --mmap=false`
// for containers with a memory limit) changes nothing in the results: the
// logits of every step are bit-identical.
func TestLoadNoMmap(t *testing.T) {
	path := testmodels.Path(t, "stories260K.gguf")
	run := func(noMmap bool) *ChainResult {
		m, err := LoadModel(context.Background(), path, LoadOptions{NoMmap: noMmap})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		s, err := NewShard(context.Background(), m, Config{NCtx: 256, NBatch: 64, MaxSessions: 1, Threads: 2})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		prompt, err := m.Tokenize("Once upon a time", true, false)
		if err != nil {
			t.Fatal(err)
		}
		res, err := RunChain(context.Background(), []*Shard{s}, prompt, ChainOptions{Steps: 12, Logits: true})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	mapped, read := run(false), run(true)
	if len(mapped.Logits) != 13 || len(read.Logits) != len(mapped.Logits) {
		t.Fatalf("logit steps: mapped %d, read %d", len(mapped.Logits), len(read.Logits))
	}
	for i := range mapped.Logits {
		a, b := mapped.Logits[i], read.Logits[i]
		if len(a) == 0 || len(a) != len(b) {
			t.Fatalf("step %d: %d vs %d logits", i, len(a), len(b))
		}
		for j := range a {
			if math.Float32bits(a[j]) != math.Float32bits(b[j]) {
				t.Fatalf("step %d logit %d: mapped %v, read %v", i, j, a[j], b[j])
			}
		}
	}
	t.Logf("%d steps x %d logits identical; tokens %v", len(mapped.Logits), len(mapped.Logits[0]), read.Tokens)
}
