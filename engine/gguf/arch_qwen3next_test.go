package gguf

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

// qwen3next's rules (arch_qwen3next.go): synthesized with the tensors
// llama.cpp's loader wants (delta-net layers 3 of every 4, gated attention
// on the 4th, experts and a shared expert everywhere), cut at multiples of
// 4 into shards of at least 4 layers, and refused at load with the measured
// reason (ErrRefusedArch, after every other check), not certified and not
// listed among the architectures meshp2p loads; it still quantizes.
func TestQwen3NextRules(t *testing.T) {
	s := DefaultSpec("qwen3next")
	f := mustOpen(t, synthFile(t, s))
	err := ValidateForLoad(f)
	if !errors.Is(err, ErrRefusedArch) || !errors.Is(err, ErrNotLoadable) || !strings.Contains(err.Error(), "batched") {
		t.Fatalf("ValidateForLoad: %v, want ErrRefusedArch and ErrNotLoadable with the reason", err)
	}
	if err := CheckQuantizable(f, "q8_0"); err != nil {
		t.Fatalf("CheckQuantizable: %v", err)
	}
	if ok, why := Certification("qwen3next"); ok || !strings.Contains(why, "not certified: qwen3next's recurrent layers") {
		t.Errorf("Certification: %v %q", ok, why)
	}
	for _, a := range Architectures() {
		if a == "qwen3next" {
			t.Error("Architectures lists qwen3next")
		}
	}
	e, st := uint64(s.Embd), uint64(s.SSMState)
	key, val := st*uint64(s.SSMGroups), st*uint64(s.SSMHeads)
	hd := uint64(s.HeadDim)
	for name, shape := range map[string][]uint64{
		"blk.0.ssm_in.weight":             {e, 2*key + 2*val},
		"blk.0.ssm_conv1d.weight":         {uint64(s.SSMConv), 2*key + val},
		"blk.1.ssm_a":                     {uint64(s.SSMHeads)},
		"blk.2.ssm_ba.weight":             {e, 2 * uint64(s.SSMHeads)},
		"blk.2.ssm_out.weight":            {val, e},
		"blk.3.attn_q.weight":             {e, 2 * hd * uint64(s.Heads)},
		"blk.3.attn_output.weight":        {hd * uint64(s.Heads), e},
		"blk.7.attn_k_norm.weight":        {hd},
		"blk.5.ffn_gate_inp_shexp.weight": {e},
		"blk.3.ffn_down_exps.weight":      {uint64(s.ExpertFF), e, uint64(s.Experts)},
	} {
		if ti, ok := f.Tensor(name); !ok || !reflect.DeepEqual(ti.Shape, shape) {
			t.Errorf("tensor %s: present %v, %v, want shape %v", name, ok, ti, shape)
		}
	}
	for _, absent := range []string{"blk.3.ssm_in.weight", "blk.0.attn_q.weight", "blk.0.ffn_norm.weight"} {
		if _, ok := f.Tensor(absent); ok {
			t.Errorf("tensor %s present", absent)
		}
	}
	if ti, _ := f.Tensor("blk.0.ssm_conv1d.weight"); ti.Type != TypeF32 {
		t.Errorf("ssm_conv1d is %v: ggml's ssm_conv takes F32 only", ti.Type)
	}
	md := f.Metadata
	for _, tc := range []struct {
		r     Range
		legal bool
	}{
		{Range{0, 4}, true}, {Range{4, 48}, true}, {Range{44, 48}, true}, {Range{0, 48}, true},
		{Range{2, 48}, false}, {Range{0, 3}, false}, {Range{44, 46}, false}, {Range{5, 9}, false},
	} {
		if err := CheckCut(md, tc.r, 48); (err == nil) != tc.legal || (err != nil && !errors.Is(err, ErrIllegalCut)) {
			t.Errorf("%v of 48 layers: %v, legal %v", tc.r, err, tc.legal)
		}
	}
	if err := CheckCut(md, Range{2, 48}, 48); err == nil || !strings.Contains(err.Error(), "a shard starts at a multiple of 4") {
		t.Errorf("cut at 2: %v", err)
	}
	if got, want := LegalCuts(md, 48), "shards start at a multiple of 4 layers; shards hold at least 4 layers"; got != want {
		t.Errorf("LegalCuts %q, want %q", got, want)
	}
	if got := LayerOutputName("qwen3next", 7); got != "post_moe-7" {
		t.Errorf("layer output %q", got)
	}
	s.Layers = 3
	if err := s.Validate(); err == nil {
		t.Error("a 3-layer qwen3next (no attention layer) validated")
	}
}
