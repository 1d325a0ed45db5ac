package gguf

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// The sliding-window architectures' rules (arch.go): gpt-oss slides on
// every even layer, gemma3 on 5 of every 6 and llama4 chunks 3 of every 4
// (with experts every interleave_moe_layer_step-th), keyed on the layer
// index, so a shard starts at a multiple of the period; it holds a
// full-attention layer (llama.cpp aborts otherwise); gemma3's 27B query
// scale is keyed on 62 layers.
func TestSlidingWindowCuts(t *testing.T) {
	gemma := func(embd, heads, key, window int) Metadata {
		return Metadata{{KeyArchitecture, "gemma3"}, {"gemma3.embedding_length", uint32(embd)},
			{"gemma3.attention.head_count", uint32(heads)}, {"gemma3.attention.key_length", uint32(key)},
			{"gemma3.attention.sliding_window", uint32(window)}}
	}
	oss := Metadata{{KeyArchitecture, "gpt-oss"}}
	g1B, gFull := gemma(1152, 4, 256, 512), gemma(1152, 4, 256, 0)
	g27B, gSameScale := gemma(5376, 32, 128, 1024), gemma(4096, 32, 128, 1024)
	// Llama 4 Maverick (experts every 2nd layer), chunked or not.
	l4 := Metadata{{KeyArchitecture, "llama4"}, {"llama4.interleave_moe_layer_step", uint32(2)}}
	l4Full := Metadata{{KeyArchitecture, "llama4"}, {"llama4.interleave_moe_layer_step", uint32(2)}, {"llama4.attention.sliding_window", uint32(0)}}
	for _, tc := range []struct {
		md    Metadata
		r     Range
		n     int
		legal bool
	}{
		{oss, Range{0, 2}, 24, true}, {oss, Range{2, 24}, 24, true}, {oss, Range{22, 24}, 24, true}, {oss, Range{0, 24}, 24, true},
		{oss, Range{1, 24}, 24, false}, {oss, Range{0, 1}, 24, false}, {oss, Range{23, 24}, 24, false}, {oss, Range{4, 5}, 24, false},
		{g1B, Range{0, 6}, 26, true}, {g1B, Range{6, 26}, 26, true}, {g1B, Range{18, 26}, 26, true},
		{g1B, Range{3, 26}, 26, false}, {g1B, Range{0, 5}, 26, false}, {g1B, Range{24, 26}, 26, false},
		{gFull, Range{3, 26}, 26, true}, {gFull, Range{0, 1}, 26, true},
		{g27B, Range{0, 30}, 62, false}, {g27B, Range{0, 62}, 62, true}, {g27B, Range{0, 62}, 70, false}, {g27B, Range{0, 60}, 70, true},
		{gSameScale, Range{0, 30}, 62, true},
		{l4, Range{0, 4}, 48, true}, {l4, Range{4, 48}, 48, true}, {l4, Range{44, 48}, 48, true},
		{l4, Range{2, 48}, 48, false}, {l4, Range{0, 3}, 48, false}, {l4, Range{46, 48}, 48, false},
		{l4Full, Range{2, 48}, 48, true}, {l4Full, Range{0, 1}, 48, true}, {l4Full, Range{1, 48}, 48, false},
	} {
		err := CheckCut(tc.md, tc.r, tc.n)
		if (err == nil) != tc.legal || (err != nil && !errors.Is(err, ErrIllegalCut)) {
			arch, _ := tc.md.String(KeyArchitecture)
			t.Errorf("%s %v of %d layers: %v, legal %v", arch, tc.r, tc.n, err, tc.legal)
		}
	}
	for _, tc := range []struct {
		md   Metadata
		n    int
		want string
	}{
		{oss, 36, "shards start at a multiple of 2 layers; shards hold at least 2 layers"},
		{g1B, 26, "shards start at a multiple of 6 layers; shards hold at least 6 layers"},
		{gFull, 26, ""},
		{g27B, 62, "whole model only"},
		{g27B, 70, "shards start at a multiple of 6 layers; shards hold at least 6 layers; no shard of 62 layers"},
		{gSameScale, 62, "shards start at a multiple of 6 layers; shards hold at least 6 layers"},
		{l4, 48, "shards start at a multiple of 4 layers; shards hold at least 4 layers"},
		{l4Full, 48, "shards start at a multiple of 2 layers"},
	} {
		if got := LegalCuts(tc.md, tc.n); got != tc.want {
			t.Errorf("LegalCuts(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
}

// LegalSplit is EvenSplit when that is legal, else the legal split
// nearest to it; none at all is an ErrIllegalCut.
func TestLegalSplit(t *testing.T) {
	g1B := Metadata{{KeyArchitecture, "gemma3"}, {"gemma3.attention.sliding_window", uint32(512)}}
	g27B := Metadata{{KeyArchitecture, "gemma3"}, {"gemma3.embedding_length", uint32(5376)},
		{"gemma3.attention.head_count", uint32(32)}, {"gemma3.attention.key_length", uint32(128)}}
	for _, tc := range []struct {
		md   Metadata
		n, k int
		want string
	}{
		{Metadata{{KeyArchitecture, "llama"}}, 5, 3, "[0-2 2-4 4-5]"},
		{Metadata{{KeyArchitecture, "gpt-oss"}}, 24, 3, "[0-8 8-16 16-24]"},
		{Metadata{{KeyArchitecture, "gpt-oss"}}, 7, 3, "[0-2 2-4 4-7]"},
		{g1B, 26, 2, "[0-12 12-26]"},
		{g1B, 26, 3, "[0-6 6-18 18-26]"},
		{g1B, 26, 4, "[0-6 6-12 12-18 18-26]"},
		{Metadata{{KeyArchitecture, "deepseek2"}}, 53, 2, "[0-28 28-53]"}, // 27 + 26 is lite twice
	} {
		got, err := LegalSplit(tc.md, tc.n, tc.k)
		if err != nil || fmt.Sprint(got) != tc.want {
			t.Errorf("LegalSplit(%d, %d) = %v, %v; want %s", tc.n, tc.k, got, err, tc.want)
			continue
		}
		if err := ValidateCover(got, tc.n); err != nil {
			t.Error(err)
		}
	}
	for _, tc := range []struct {
		md   Metadata
		n, k int
	}{{g1B, 26, 5}, {g27B, 62, 2}, {Metadata{{KeyArchitecture, "gpt-oss"}}, 5, 3}, {Metadata{{KeyArchitecture, "deepseek2"}}, 27, 2}} {
		if got, err := LegalSplit(tc.md, tc.n, tc.k); !errors.Is(err, ErrIllegalCut) {
			t.Errorf("LegalSplit(%d, %d) = %v, %v; want ErrIllegalCut", tc.n, tc.k, got, err)
		}
	}
}

// A file whose layers all slide is refused before llama.cpp would abort
// on it; split, truncate and load keep to the rules.
func TestSlidingWindowFiles(t *testing.T) {
	ctx := context.Background()
	src := synthFile(t, tinySpec("gemma3")) // 18 layers
	// Layers 0-4 alone: all sliding.
	out := filepath.Join(t.TempDir(), "five.gguf")
	rewriteWith(t, src, out, func(md *Metadata) { md.Set("gemma3.block_count", uint32(5)) }, func(_ *File, ts []WriteTensor) []WriteTensor {
		var keep []WriteTensor
		for _, w := range ts {
			if idx, _, isLayer, _ := splitLayerName(w.Name); !isLayer || idx < 5 {
				keep = append(keep, w)
			}
		}
		return keep
	})
	if err := ValidateForLoad(mustOpen(t, out)); !errors.Is(err, ErrNotLoadable) || !strings.Contains(err.Error(), "full-attention") {
		t.Errorf("gemma3 of 5 sliding layers: %v, want ErrNotLoadable naming the full-attention layer", err)
	}
	if _, err := Split(ctx, src, []Range{{0, 7}, {7, 18}}, t.TempDir(), nil); !errors.Is(err, ErrIllegalCut) || !strings.Contains(err.Error(), "multiple of 6") {
		t.Errorf("gemma3 split at 7: %v, want ErrIllegalCut naming the period", err)
	}
	if _, err := Truncate(ctx, src, 4, filepath.Join(t.TempDir(), "d.gguf")); !errors.Is(err, ErrIllegalCut) {
		t.Errorf("gemma3 first 4 layers: %v, want ErrIllegalCut", err)
	}
	res, err := Truncate(ctx, src, 6, filepath.Join(t.TempDir(), "d6.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	if err := ValidateForLoad(mustOpen(t, res.Path)); err != nil {
		t.Errorf("gemma3 first 6 layers: %v", err)
	}
	oss := synthFile(t, tinySpec("gpt-oss"))
	for _, rs := range [][]Range{{{0, 3}, {3, 6}}, {{0, 1}, {1, 6}}} {
		if _, err := Split(ctx, oss, rs, t.TempDir(), nil); !errors.Is(err, ErrIllegalCut) {
			t.Errorf("gpt-oss split %v: %v, want ErrIllegalCut", rs, err)
		}
	}
	if _, err := Truncate(ctx, oss, 1, filepath.Join(t.TempDir(), "d1.gguf")); !errors.Is(err, ErrIllegalCut) {
		t.Errorf("gpt-oss first layer: %v, want ErrIllegalCut", err)
	}
	res2 := splitAndCheck(t, oss, []Range{{0, 4}, {4, 6}})
	f := mustOpen(t, res2[1].Path)
	if _, ok := f.Tensor(output); !ok {
		t.Error("gpt-oss tail shard without output.weight (required)")
	}
	for _, a := range []string{"gpt-oss", "gemma3", "llama4"} {
		if ok, why := Certification(a); !ok || !strings.HasPrefix(why, "certified") {
			t.Errorf("Certification(%s) = %v, %q", a, ok, why)
		}
	}
}
