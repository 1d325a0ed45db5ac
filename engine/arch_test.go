package engine

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/neuron-tai/meshp2p/engine/gguf"
)

// realGeometries are the certified architectures' real models: their
// published layer counts and structure (dense lead layers, routed and
// shared experts, expert groups) at small widths (docs/architectures.md).
var realGeometries = []struct {
	name string
	spec func() gguf.Spec
	cuts []gguf.Range // legal cut points a 3-node split takes
}{
	// DeepSeek-V3 / R1 (config.json: 61 layers, first_k_dense_replace 3,
	// 256 routed experts, 8 per token, 1 shared, n_group 8, topk_group 4).
	{"DeepSeek-V3", func() gguf.Spec {
		s := tinyDeepseek2()
		s.Layers, s.DenseLead, s.Experts, s.ExpertsUsed, s.SharedExperts, s.ExpertGroups, s.ExpertGroupsUsed = 61, 3, 256, 8, 1, 8, 4
		return s
	}, []gguf.Range{{Start: 0, End: 20}, {Start: 20, End: 40}, {Start: 40, End: 61}}},
	// Kimi-K2 (61 layers, first_k_dense_replace 1, 384 experts, 8 per
	// token, 1 shared, no groups).
	{"Kimi-K2", func() gguf.Spec {
		s := tinyDeepseek2()
		s.Layers, s.DenseLead, s.Experts, s.ExpertsUsed, s.SharedExperts = 61, 1, 384, 8, 1
		return s
	}, []gguf.Range{{Start: 0, End: 25}, {Start: 25, End: 50}, {Start: 50, End: 61}}},
}

// tinyDeepseek2 is deepseek2 at the smallest widths that keep its shape.
func tinyDeepseek2() gguf.Spec {
	s := gguf.DefaultSpec("deepseek2")
	s.Embd, s.Heads, s.FF, s.ExpertFF, s.Type, s.Seed = 32, 2, 64, 8, gguf.TypeF16, 9
	s.QLoraRank, s.KVLoraRank, s.RopeDim, s.NopeDim, s.VDim = 16, 16, 8, 8, 8
	return s
}

// The real models' structure loads, is refused at its illegal cut points
// and, split at legal ones, computes exactly what the whole model does.
func TestRealGeometries(t *testing.T) {
	ctx := context.Background()
	prompt := []int32{1, 300, 311, 262, 290, 340}
	for _, g := range realGeometries {
		t.Run(g.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "m.gguf")
			if err := gguf.Synth(ctx, g.spec(), path); err != nil {
				t.Fatal(err)
			}
			f, err := gguf.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			md := f.Metadata
			f.Close()
			if got := gguf.LegalCuts(md, 61); got != "any range except shards of 26 or 27 layers" {
				t.Errorf("legal cuts %q", got)
			}
			if _, err := gguf.Split(ctx, path, []gguf.Range{{Start: 0, End: 26}, {Start: 26, End: 61}}, t.TempDir(), nil); err == nil {
				t.Error("split into 26 + 35 layers: no error")
			}
			whole := loadShards(t, path, 1, parityCfg)
			ref, err := RunChain(ctx, whole, prompt, ChainOptions{Steps: 4, Logits: true})
			if err != nil {
				t.Fatal(err)
			}
			res, err := gguf.Split(ctx, path, g.cuts, t.TempDir(), nil)
			if err != nil {
				t.Fatal(err)
			}
			var chain []*Shard
			for _, r := range res {
				m, err := LoadModel(ctx, r.Path, LoadOptions{})
				if err != nil {
					t.Fatalf("%v: %v", r.Range, err)
				}
				t.Cleanup(m.Close)
				s, err := NewShard(ctx, m, parityCfg)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { s.Close() })
				chain = append(chain, s)
			}
			got, err := RunChain(ctx, chain, prompt, ChainOptions{Steps: 4, Logits: true})
			if err != nil {
				t.Fatal(err)
			}
			for i := range ref.Tokens {
				if got.Tokens[i] != ref.Tokens[i] || MaxAbsDiff(got.Logits[i], ref.Logits[i]) != 0 {
					t.Fatalf("step %d: token %d (whole %d), max |Δlogit| %g", i, got.Tokens[i], ref.Tokens[i], MaxAbsDiff(got.Logits[i], ref.Logits[i]))
				}
			}
			t.Logf("%s structure: whole vs %v: tokens identical, max |Δlogit| 0", g.name, g.cuts)
		})
	}
}
