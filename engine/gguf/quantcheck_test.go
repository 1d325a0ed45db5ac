package gguf

import (
	"errors"
	"testing"
)

func TestCheckQuantizable(t *testing.T) {
	spec := func(arch string, embd, ff int, tied bool) Spec {
		s := tinySpec(arch)
		s.Embd, s.FF, s.Tied, s.Type = embd, ff, tied, TypeF16
		if arch == "qwen3moe" || arch == "gpt-oss" {
			s.ExpertFF = ff
		}
		return s
	}
	cases := []struct {
		name string
		spec Spec
		typ  string
		ok   bool
	}{
		{"f16 any geometry", spec("llama", 40, 100, false), "f16", true},
		{"q8_0 rows of 32", spec("llama", 64, 96, false), "q8_0", true},
		{"q8_0 ff 100", spec("llama", 64, 100, false), "q8_0", false},
		{"q8_0 embd 40", spec("llama", 40, 64, false), "q8_0", false},
		{"q8_0 moe expert ff 48", spec("qwen3moe", 64, 48, false), "q8_0", false},
		{"q4_k_m falls back", spec("llama", 64, 100, false), "q4_k_m", true},
		{"q4_k_m output row 40", spec("llama", 40, 64, false), "q4_k_m", false},
		{"q4_k_m tied token_embd row 40", spec("qwen3", 40, 64, true), "q4_k_m", false},
		{"q4_k_m 8 experts attn_k row 48", spec("qwen3moe", 48, 64, false), "q4_k_m", false},
		{"q4_k_m 8 experts rows of 32", spec("qwen3moe", 64, 64, false), "q4_k_m", true},
		{"unknown type", spec("llama", 64, 64, false), "q3_k", false},
		{"mxfp4_moe rows of 32", spec("gpt-oss", 64, 64, false), "mxfp4_moe", true},
		{"mxfp4_moe expert ff 48", spec("gpt-oss", 64, 48, false), "mxfp4_moe", false},
	}
	for _, c := range cases {
		f := mustOpen(t, synthFile(t, c.spec))
		err := CheckQuantizable(f, c.typ)
		f.Close()
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, ErrNotQuantizable)) {
			t.Errorf("%s: %v, want ok=%v", c.name, err, c.ok)
		}
	}
	// Shards and broken models are refused before any work.
	src := synthFile(t, spec("llama", 64, 64, false))
	res, err := Split(t.Context(), src, EvenSplit(4, 2), t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	f := mustOpen(t, res[0].Path)
	if err := CheckQuantizable(f, "q8_0"); !errors.Is(err, ErrIsShard) {
		t.Errorf("shard: %v, want ErrIsShard", err)
	}
	f.Close()
	moe := spec("qwen3moe", 64, 64, false)
	moe.ExpertsUsed = 1
	f = mustOpen(t, synthFile(t, moe))
	f.Metadata.Set("qwen3moe.expert_used_count", uint32(0))
	if err := CheckQuantizable(f, "f16"); !errors.Is(err, ErrNotLoadable) {
		t.Errorf("expert_used_count 0: %v, want ErrNotLoadable", err)
	}
	f.Close()
}
