package engine

import (
	"context"
	"fmt"
	"testing"

	"github.com/neuron-tai/meshp2p/engine/gguf"
)

// loadShards splits path k ways into a temp dir and opens a shard for each.
func loadShards(t testing.TB, path string, k int, cfg Config) []*Shard {
	t.Helper()
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	n, err := f.NLayer()
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	res, err := gguf.Split(context.Background(), path, gguf.EvenSplit(n, k), t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var shards []*Shard
	for _, r := range res {
		m, err := LoadModel(context.Background(), r.Path, LoadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(m.Close)
		s, err := NewShard(context.Background(), m, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		shards = append(shards, s)
	}
	return shards
}

var parityCfg = Config{NCtx: 256, NBatch: 64, MaxSessions: 4, Threads: 2}

// checkParity runs whole vs 2 vs 3 shards and demands identical tokens and
// max logit difference 0 (flash attention off, the engine default).
func checkParity(t *testing.T, path string, prompt []int32, steps int) {
	t.Helper()
	ctx := context.Background()
	whole := loadShards(t, path, 1, parityCfg)
	ref, err := RunChain(ctx, whole, prompt, ChainOptions{Steps: steps, Logits: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []int{2, 3} {
		t.Run(fmt.Sprintf("split%d", k), func(t *testing.T) {
			got, err := RunChain(ctx, loadShards(t, path, k, parityCfg), prompt, ChainOptions{Steps: steps, Logits: true})
			if err != nil {
				t.Fatal(err)
			}
			for i := range ref.Tokens {
				if got.Tokens[i] != ref.Tokens[i] {
					t.Fatalf("step %d: token %d, whole model %d", i, got.Tokens[i], ref.Tokens[i])
				}
				if d := MaxAbsDiff(got.Logits[i], ref.Logits[i]); d != 0 {
					t.Fatalf("step %d: max |Δlogit| = %g, want 0", i, d)
				}
			}
		})
	}
}

func TestParityStories260K(t *testing.T) {
	path := sharedModel(t, "stories260K.gguf")
	m, err := LoadModel(context.Background(), path, LoadOptions{VocabOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	prompt, err := m.Tokenize("Once upon a time, there was", true, false)
	if err != nil {
		t.Fatal(err)
	}
	checkParity(t, path, prompt, 16)
}
