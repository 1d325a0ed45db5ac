package gguf

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// The sliding-window rules (arch.go): gpt-oss slides on every even layer,
// keyed on the layer index, so a shard starts at an even layer; it holds a
// full-attention layer (llama.cpp aborts otherwise).
func TestSlidingWindowCuts(t *testing.T) {
	oss := Metadata{{KeyArchitecture, "gpt-oss"}}
	for _, tc := range []struct {
		md    Metadata
		r     Range
		n     int
		legal bool
	}{
		{oss, Range{0, 2}, 24, true}, {oss, Range{2, 24}, 24, true}, {oss, Range{22, 24}, 24, true}, {oss, Range{0, 24}, 24, true},
		{oss, Range{1, 24}, 24, false}, {oss, Range{0, 1}, 24, false}, {oss, Range{23, 24}, 24, false}, {oss, Range{4, 5}, 24, false},
	} {
		err := CheckCut(tc.md, tc.r, tc.n)
		if (err == nil) != tc.legal || (err != nil && !errors.Is(err, ErrIllegalCut)) {
			arch, _ := tc.md.String(KeyArchitecture)
			t.Errorf("%s %v of %d layers: %v, legal %v", arch, tc.r, tc.n, err, tc.legal)
		}
	}
	if got, want := LegalCuts(oss, 36), "shards start at a multiple of 2 layers; shards hold at least 2 layers"; got != want {
		t.Errorf("LegalCuts(36) = %q, want %q", got, want)
	}
}

// LegalSplit is EvenSplit when that is legal, else the legal split
// nearest to it; none at all is an ErrIllegalCut.
func TestLegalSplit(t *testing.T) {
	for _, tc := range []struct {
		md   Metadata
		n, k int
		want string
	}{
		{Metadata{{KeyArchitecture, "llama"}}, 5, 3, "[0-2 2-4 4-5]"},
		{Metadata{{KeyArchitecture, "gpt-oss"}}, 24, 3, "[0-8 8-16 16-24]"},
		{Metadata{{KeyArchitecture, "gpt-oss"}}, 7, 3, "[0-2 2-4 4-7]"},
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
	}{{Metadata{{KeyArchitecture, "gpt-oss"}}, 5, 3}, {Metadata{{KeyArchitecture, "deepseek2"}}, 27, 2}} {
		if got, err := LegalSplit(tc.md, tc.n, tc.k); !errors.Is(err, ErrIllegalCut) {
			t.Errorf("LegalSplit(%d, %d) = %v, %v; want ErrIllegalCut", tc.n, tc.k, got, err)
		}
	}
}

// A file whose layers all slide is refused before llama.cpp would abort
// on it; split, truncate and load keep to the rules.
func TestSlidingWindowFiles(t *testing.T) {
	ctx := context.Background()
	oss := synthFile(t, tinySpec("gpt-oss")) // 6 layers
	// Layer 0 alone: sliding only.
	out := t.TempDir() + "/one.gguf"
	rewriteWith(t, oss, out, func(md *Metadata) { md.Set("gpt-oss.block_count", uint32(1)) }, func(_ *File, ts []WriteTensor) []WriteTensor {
		var keep []WriteTensor
		for _, w := range ts {
			if idx, _, isLayer, _ := splitLayerName(w.Name); !isLayer || idx < 1 {
				keep = append(keep, w)
			}
		}
		return keep
	})
	if err := ValidateForLoad(mustOpen(t, out)); !errors.Is(err, ErrNotLoadable) || !strings.Contains(err.Error(), "full-attention") {
		t.Errorf("gpt-oss of 1 sliding layer: %v, want ErrNotLoadable naming the full-attention layer", err)
	}
	for _, rs := range [][]Range{{{0, 3}, {3, 6}}, {{0, 1}, {1, 6}}} {
		if _, err := Split(ctx, oss, rs, t.TempDir(), nil); !errors.Is(err, ErrIllegalCut) {
			t.Errorf("gpt-oss split %v: %v, want ErrIllegalCut", rs, err)
		}
	}
	if _, err := Truncate(ctx, oss, 1, t.TempDir()+"/d.gguf"); !errors.Is(err, ErrIllegalCut) {
		t.Errorf("gpt-oss first layer: %v, want ErrIllegalCut", err)
	}
	res := splitAndCheck(t, oss, []Range{{0, 4}, {4, 6}})
	f := mustOpen(t, res[1].Path)
	if _, ok := f.Tensor(output); !ok {
		t.Error("gpt-oss tail shard without output.weight (required)")
	}
	if ok, why := Certification("gpt-oss"); !ok || !strings.HasPrefix(why, "certified") {
		t.Errorf("Certification(gpt-oss) = %v, %q", ok, why)
	}
}
