package gguf

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"strings"
)

// ErrBadSpec reports an invalid synthetic model geometry.
var ErrBadSpec = errors.New("bad model spec")

// Spec describes a random-weight model for Synth.
type Spec struct {
	Arch          string     // an architecture of Architectures()
	Layers        int        // block_count
	Embd          int        // embedding_length
	Heads         int        // attention.head_count
	KVHeads       int        // attention.head_count_kv
	FF            int        // feed_forward_length (per expert for llama with experts)
	Experts       int        // expert_count: >0 for qwen3moe, optional for llama
	ExpertsUsed   int        // expert_used_count, 1..Experts
	ExpertFF      int        // expert_feed_forward_length (qwen3moe, deepseek2)
	Type          TensorType // TypeF32 or TypeF16 for matrices; 1-D tensors are always F32
	Seed          uint64     // weights are a pure function of Spec (same seed, same file)
	ContextLength int        // context_length
	Tied          bool       // no output.weight (output tied to token_embd)
	VocabFrom     string     // copy tokenizer.* from this GGUF; "" = small built-in SPM vocab
	Name          string     // general.name

	// deepseek2: multi-head latent attention (Heads query heads over one
	// shared latent KV of KVLoraRank plus RopeDim), the first DenseLead
	// layers dense (FF), the rest Experts with SharedExperts always on,
	// routed within ExpertGroups groups of which ExpertGroupsUsed are kept
	// (0: no groups).
	DenseLead        int // leading_dense_block_count
	SharedExperts    int // expert_shared_count
	QLoraRank        int // attention.q_lora_rank
	KVLoraRank       int // attention.kv_lora_rank
	RopeDim          int // rope.dimension_count: the roped part of a q/k head
	NopeDim          int // the rest of a q/k head (key_length_mla = NopeDim + RopeDim)
	VDim             int // value_length_mla
	ExpertGroups     int // expert_group_count
	ExpertGroupsUsed int // expert_group_used_count

	// gpt-oss, gemma3: the q/k/v length of a head (attention.key_length,
	// value_length and rope.dimension_count; 0: Embd/Heads), and the
	// sliding window of the sliding layers (attention.sliding_window;
	// gemma3 without one has none).
	HeadDim       int
	SlidingWindow int
	// glm4moe: NextN is nextn_predict_layers, the next-token-prediction
	// layers at the end (counted in Layers); also DenseLead,
	// SharedExperts, ExpertFF, HeadDim and RopeDim (partial rotary).
	NextN int
	// llama4: experts (ExpertFF each, plus a shared one as wide) on every
	// MoEStep-th layer (interleave_moe_layer_step), FF on the others;
	// SlidingWindow > 0 turns chunked attention on (llama.cpp makes the
	// chunk 8192 whatever the value).
	MoEStep int
	// qwen3next: the gated delta net layers (3 of every 4): SSMGroups
	// key heads and SSMHeads value heads (a multiple of it) of SSMState
	// dims each (ssm.group_count, ssm.time_step_rank, ssm.state_size;
	// ssm.inner_size is SSMState × SSMHeads), a causal convolution of
	// SSMConv taps (ssm.conv_kernel); also HeadDim and RopeDim (gated
	// attention with partial rotary), Experts, ExpertFF and
	// SharedExperts (the shared expert is ExpertFF × SharedExperts wide).
	SSMState, SSMGroups, SSMHeads, SSMConv int

	Progress func(done, total int64) `json:"-"`
}

// DefaultSpec returns a tiny fixture geometry for arch: 128-dim,
// 6 layers, 4 heads (2 KV), n_ff 256, F32; qwen3moe gets 8 experts, top-2,
// expert n_ff 64; qwen3 is tied.
func DefaultSpec(arch string) Spec {
	s := Spec{Arch: arch, Layers: 6, Embd: 128, Heads: 4, KVHeads: 2, FF: 256, Type: TypeF32, ContextLength: 2048, Seed: 1}
	switch arch {
	case "qwen3":
		s.Tied = true
	case "qwen3moe":
		s.Experts, s.ExpertsUsed, s.ExpertFF = 8, 2, 64
	case "minimax-m2":
		// MiniMax-M2's structure: experts in every layer (FF is the
		// expert's), rotary on half of each head.
		s.Experts, s.ExpertsUsed, s.FF, s.RopeDim = 8, 2, 64, 16
	case "deepseek2":
		// DeepSeek-V3's structure at small widths: dense lead layers,
		// 8 routed experts in 4 groups (2 kept), 1 shared expert, MLA.
		s.KVHeads, s.Experts, s.ExpertsUsed, s.ExpertFF, s.DenseLead, s.SharedExperts = 1, 8, 2, 64, 2, 1
		s.QLoraRank, s.KVLoraRank, s.RopeDim, s.NopeDim, s.VDim = 64, 32, 16, 32, 32
		s.ExpertGroups, s.ExpertGroupsUsed = 4, 2
	case "gpt-oss":
		// gpt-oss's structure: experts in every layer (4 used, as the
		// real ones), heads wider than embd/heads, a window of 8 so that
		// short prompts slide.
		s.Experts, s.ExpertsUsed, s.ExpertFF, s.HeadDim, s.SlidingWindow = 8, 4, 64, 64, 8
	case "llama4":
		// Llama 4 Maverick's structure: experts (top-1, a shared one) on
		// every 2nd layer, chunked attention 3:1 with no rope on the
		// 4th; two periods.
		s.Layers, s.Experts, s.ExpertsUsed, s.ExpertFF, s.MoEStep, s.SlidingWindow = 8, 8, 1, 64, 2, 8192
	case "glm4moe":
		// GLM-4.5's structure at small widths: a dense lead layer,
		// sigmoid-routed experts with a routing bias and a shared
		// expert, heads wider than embd/heads with rotary on half of
		// each, q/k norms, and one MTP layer at the end.
		s.Layers, s.HeadDim, s.RopeDim, s.Experts, s.ExpertsUsed, s.ExpertFF, s.DenseLead, s.SharedExperts, s.NextN = 6, 64, 32, 8, 2, 64, 1, 1, 1
	case "qwen3next":
		// Qwen3-Next-80B-A3B's structure at small widths: two periods
		// of 3 delta-net layers and a gated attention layer, heads wider
		// than embd/heads with rotary on a quarter, 8 experts (top-2)
		// and a shared one in every layer.
		s.Layers, s.HeadDim, s.RopeDim, s.Experts, s.ExpertsUsed, s.ExpertFF, s.SharedExperts = 8, 64, 16, 8, 2, 64, 1
		s.SSMState, s.SSMGroups, s.SSMHeads, s.SSMConv = 32, 2, 4, 4
	case "gemma3":
		// Gemma 3's structure: two periods of the 5:1 sliding pattern,
		// heads wider than embd/heads, tied output, a window of 8.
		s.Layers, s.HeadDim, s.SlidingWindow, s.Tied = 12, 64, 8, true
	}
	return s
}

// Validate checks the geometry before any work is done.
func (s *Spec) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrBadSpec}, args...)...)
	}
	if _, ok := archRules[s.Arch]; !ok {
		return bad("unknown architecture %q (want one of %s)", s.Arch, strings.Join(Architectures(), ", "))
	}
	switch {
	case s.Layers < 1 || s.Layers > MaxLayers:
		return bad("layers %d must be in 1..%d", s.Layers, MaxLayers)
	case s.Embd < 1 || s.Embd > 1<<16:
		return bad("embd %d must be in 1..65536", s.Embd)
	case s.Heads < 1 || (s.HeadDim == 0 && s.Embd%s.Heads != 0):
		return bad("embd %d must be divisible by heads %d", s.Embd, s.Heads)
	case s.HeadDim < 0 || s.headDim()%2 != 0:
		return bad("head dimension %d must be even (rope)", s.headDim())
	case s.KVHeads < 1 || s.Heads%s.KVHeads != 0:
		return bad("heads %d must be divisible by kv-heads %d", s.Heads, s.KVHeads)
	case s.FF < 1 || s.FF > 1<<20:
		return bad("ff %d must be in 1..1048576", s.FF)
	case s.ContextLength < 1:
		return bad("context length %d must be positive", s.ContextLength)
	case s.Type != TypeF32 && s.Type != TypeF16:
		return bad("type %v: synth writes f32 or f16 (quantize afterwards)", s.Type)
	case s.Experts < 0 || s.Experts > MaxExperts:
		return bad("experts %d must be in 0..%d", s.Experts, MaxExperts)
	case s.SlidingWindow < 0:
		return bad("sliding window %d must not be negative", s.SlidingWindow)
	}
	if err := s.validateArch(); err != nil {
		return bad("%v", err)
	}
	if err := s.validateArchFields(); err != nil {
		return bad("%v", err)
	}
	if s.Arch != "llama4" && s.MoEStep != 0 {
		return bad("moe-step is llama4's")
	}
	if s.Experts > 0 && (s.ExpertsUsed < 1 || s.ExpertsUsed > s.Experts) {
		return bad("experts-used %d must be in 1..experts %d", s.ExpertsUsed, s.Experts)
	}
	if s.Experts == 0 && s.ExpertsUsed != 0 {
		return bad("experts-used %d without experts", s.ExpertsUsed)
	}
	return nil
}

// validateArchFields checks that the fields of one architecture are not
// set for another.
func (s *Spec) validateArchFields() error {
	ds, glm, q3n := s.Arch == "deepseek2", s.Arch == "glm4moe", s.Arch == "qwen3next"
	switch {
	case !ds && (s.QLoraRank != 0 || s.KVLoraRank != 0 || s.ExpertGroups != 0):
		return fmt.Errorf("LoRA ranks and expert groups are deepseek2's")
	case !ds && !glm && s.DenseLead != 0:
		return fmt.Errorf("dense-lead is deepseek2's and glm4moe's")
	case !ds && !glm && !q3n && s.SharedExperts != 0:
		return fmt.Errorf("shared experts are deepseek2's, glm4moe's and qwen3next's")
	case !ds && !glm && !q3n && s.Arch != "minimax-m2" && s.RopeDim != 0:
		return fmt.Errorf("rope-dim is deepseek2's, glm4moe's, qwen3next's and minimax-m2's")
	case !q3n && (s.SSMState != 0 || s.SSMGroups != 0 || s.SSMHeads != 0 || s.SSMConv != 0):
		return fmt.Errorf("the ssm geometry is qwen3next's")
	case !glm && s.NextN != 0:
		return fmt.Errorf("nextn is glm4moe's")
	case s.Arch != "gpt-oss" && s.Arch != "gemma3" && !glm && !q3n && s.HeadDim != 0:
		return fmt.Errorf("head-dim is gpt-oss's, gemma3's, glm4moe's and qwen3next's")
	case s.Arch != "gpt-oss" && s.Arch != "gemma3" && s.Arch != "llama4" && s.SlidingWindow != 0:
		return fmt.Errorf("sliding-window is gpt-oss's, gemma3's and llama4's")
	}
	return nil
}

// headDim is the per-head q/k/v length: HeadDim, or Embd/Heads.
func (s *Spec) headDim() int {
	if s.HeadDim > 0 || s.Heads < 1 {
		return s.HeadDim
	}
	return s.Embd / s.Heads
}

// validateArch checks the fields whose rules depend on the architecture.
func (s *Spec) validateArch() error {
	switch s.Arch {
	case "deepseek2":
		return s.validateDeepseek2()
	case "minimax-m2":
		if s.Experts < 1 || s.ExpertFF != 0 {
			return fmt.Errorf("minimax-m2 needs experts >= 1; its expert feed-forward length is ff (no expert-ff)")
		}
		if s.RopeDim < 2 || s.RopeDim%2 != 0 || s.RopeDim > s.headDim() {
			return fmt.Errorf("minimax-m2 rope-dim %d must be even, in 2..head dim %d", s.RopeDim, s.headDim())
		}
	case "qwen3moe", "gpt-oss":
		if s.Experts < 1 {
			return fmt.Errorf("%s needs experts >= 1", s.Arch)
		}
		if s.ExpertFF < 1 || s.ExpertFF > 1<<20 {
			return fmt.Errorf("%s needs expert-ff in 1..1048576, got %d", s.Arch, s.ExpertFF)
		}
		if s.Arch == "gpt-oss" && s.SlidingWindow < 1 {
			return fmt.Errorf("gpt-oss needs a sliding window >= 1 (llama.cpp requires attention.sliding_window)")
		}
		if s.Arch == "gpt-oss" {
			return swaPatternLoad("gpt-oss", 2, s.Layers)
		}
	case "gemma3":
		if s.SlidingWindow > 0 {
			return swaPatternLoad("gemma3", 6, s.Layers)
		}
	case "llama4":
		return s.validateLlama4()
	case "glm4moe":
		return s.validateGLM4MoE()
	case "qwen3next":
		return s.validateQwen3Next()
	case "llama", "mistral3":
		if s.ExpertFF != 0 {
			return fmt.Errorf("%s with experts uses ff per expert; expert-ff is for qwen3moe", s.Arch)
		}
	default:
		if s.Experts != 0 {
			return fmt.Errorf("%s has no experts (use llama or qwen3moe)", s.Arch)
		}
		if s.ExpertFF != 0 {
			return fmt.Errorf("expert-ff is for qwen3moe")
		}
	}
	return nil
}

// validateLlama4 checks the llama4 fields.
func (s *Spec) validateLlama4() error {
	switch {
	case s.Experts < 1 || s.ExpertFF < 1 || s.ExpertFF > 1<<20:
		return fmt.Errorf("llama4 needs experts >= 1 and expert-ff in 1..1048576")
	case s.MoEStep < 1:
		return fmt.Errorf("llama4 needs moe-step >= 1 (interleave_moe_layer_step)")
	case s.HeadDim != 0:
		return fmt.Errorf("llama4's heads are embd/heads wide (no head-dim)")
	case s.SlidingWindow > 0:
		return swaPatternLoad("llama4", 4, s.Layers)
	}
	return nil
}

// validateGLM4MoE checks the glm4moe fields.
func (s *Spec) validateGLM4MoE() error {
	switch {
	case s.Experts < 1 || s.ExpertFF < 1 || s.ExpertFF > 1<<20:
		return fmt.Errorf("glm4moe needs experts >= 1 and expert-ff in 1..1048576")
	case s.SharedExperts < 0 || s.DenseLead < 0 || s.DenseLead > s.Layers:
		return fmt.Errorf("glm4moe: shared experts >= 0 and dense-lead %d in 0..layers %d", s.DenseLead, s.Layers)
	case s.NextN < 0 || s.NextN >= s.Layers:
		return fmt.Errorf("glm4moe: nextn %d must be in 0..layers-1 (%d)", s.NextN, s.Layers-1)
	case s.RopeDim < 2 || s.RopeDim%2 != 0 || s.RopeDim > s.headDim():
		return fmt.Errorf("glm4moe rope-dim %d must be even, in 2..head dim %d", s.RopeDim, s.headDim())
	}
	return nil
}

// validateQwen3Next checks the qwen3next fields.
func (s *Spec) validateQwen3Next() error {
	switch {
	case s.Experts < 1 || s.ExpertFF < 1 || s.ExpertFF > 1<<20 || s.SharedExperts < 1:
		return fmt.Errorf("qwen3next needs experts >= 1, expert-ff in 1..1048576 and shared experts >= 1")
	case s.RopeDim < 2 || s.RopeDim%2 != 0 || s.RopeDim > s.headDim():
		return fmt.Errorf("qwen3next rope-dim %d must be even, in 2..head dim %d", s.RopeDim, s.headDim())
	case s.SSMState < 1 || s.SSMGroups < 1 || s.SSMHeads < 1 || s.SSMHeads%s.SSMGroups != 0 || s.SSMConv < 2:
		return fmt.Errorf("qwen3next needs ssm state, groups >= 1, ssm heads a multiple of groups and a conv kernel >= 2")
	}
	return qwen3nextLoad(s.Layers)
}

// validateDeepseek2 checks the deepseek2 fields.
func (s *Spec) validateDeepseek2() error {
	switch {
	case deepseek2Lite(uint64(s.Layers)):
		return fmt.Errorf("deepseek2 with 26 or 27 layers is the lite variant (one q projection): not synthesized")
	case s.Experts < 1 || s.ExpertFF < 1 || s.SharedExperts < 1:
		return fmt.Errorf("deepseek2 needs experts, expert-ff and shared experts >= 1")
	case s.DenseLead < 0 || s.DenseLead > s.Layers:
		return fmt.Errorf("dense-lead %d must be in 0..layers %d", s.DenseLead, s.Layers)
	case s.QLoraRank < 1 || s.KVLoraRank < 1 || s.RopeDim < 2 || s.RopeDim%2 != 0 || s.NopeDim < 1 || s.VDim < 1:
		return fmt.Errorf("deepseek2 needs q/kv LoRA ranks, nope and v dims >= 1 and an even rope dim >= 2")
	case s.KVHeads != 1:
		return fmt.Errorf("deepseek2's latent KV is one head: kv-heads must be 1")
	case s.ExpertGroups > 1 && (s.Experts%s.ExpertGroups != 0 || s.Experts/s.ExpertGroups < 2 || s.ExpertGroupsUsed < 1 || s.ExpertGroupsUsed >= s.ExpertGroups):
		return fmt.Errorf("expert groups: %d experts in %d groups (at least 2 each), %d used: want 0 < used < groups", s.Experts, s.ExpertGroups, s.ExpertGroupsUsed)
	}
	return nil
}

// init kinds of synthetic tensors
const (
	initNormal = iota
	initOnes
	initRopeFreqs
	initDecay // negative (a delta net's A = -exp(A_log)): between -0.25 and -2
)

type synthTensor struct {
	name  string
	typ   TensorType
	shape []uint64
	init  int
	std   float64
}

// Synth writes a random-weight model described by spec to out (atomically).
// Weights are generated chunk by chunk from a PRNG seeded by (Seed, tensor
// name, chunk), so memory use does not depend on the model size and the
// output is deterministic.
func Synth(ctx context.Context, spec Spec, out string) error {
	if err := spec.Validate(); err != nil {
		return err
	}
	tok, nVocab, err := synthVocab(spec.VocabFrom)
	if err != nil {
		return err
	}
	md, ts := synthLayout(&spec, nVocab)
	md = append(md, tok...)
	wts := make([]WriteTensor, len(ts))
	for i, t := range ts {
		n, err := TensorBytes(t.typ, t.shape)
		if err != nil {
			return fmt.Errorf("%w: tensor %s: %v", ErrBadSpec, t.name, err)
		}
		wts[i] = WriteTensor{Name: t.name, Type: t.typ, Shape: t.shape, Data: newSynthData(spec.Seed, t, int64(n))}
	}
	return WriteFile(ctx, out, md, wts, spec.Progress)
}

// synthLayout returns the metadata (without tokenizer) and the tensors of
// the model s describes, with a vocabulary of nVocab tokens.
func synthLayout(s *Spec, nVocab int) (Metadata, []synthTensor) {
	return synthMetadata(s), synthTensors(s, nVocab)
}

// synthMetadata returns the general.* and <arch>.* metadata of s.
func synthMetadata(s *Spec) Metadata {
	a := s.Arch
	headDim := s.headDim()
	fileType := uint32(0)
	if s.Type == TypeF16 {
		fileType = 1
	}
	name := s.Name
	if name == "" {
		name = fmt.Sprintf("meshp2p synthetic %s %dL %dd seed %d", a, s.Layers, s.Embd, s.Seed)
	}
	eps, base := float32(1e-5), float32(10000)
	if a != "llama" {
		eps, base = 1e-6, 1000000
	}
	md := Metadata{
		{KeyArchitecture, a},
		{"general.name", name},
		{"general.file_type", fileType},
		{a + ".context_length", uint32(s.ContextLength)},
		{a + ".embedding_length", uint32(s.Embd)},
		{a + ".block_count", uint32(s.Layers)},
		{a + ".feed_forward_length", uint32(s.FF)},
		{a + ".attention.head_count", uint32(s.Heads)},
		{a + ".attention.head_count_kv", uint32(s.KVHeads)},
		{a + ".rope.freq_base", base},
		{a + ".attention.layer_norm_rms_epsilon", eps},
		{a + ".rope.dimension_count", uint32(headDim)},
	}
	if a == "qwen3" || a == "qwen3moe" {
		md = append(md, KV{a + ".attention.key_length", uint32(headDim)}, KV{a + ".attention.value_length", uint32(headDim)})
	}
	if s.Experts > 0 {
		md = append(md, KV{a + ".expert_count", uint32(s.Experts)}, KV{a + ".expert_used_count", uint32(s.ExpertsUsed)})
	}
	if a == "qwen3moe" {
		md = append(md, KV{a + ".expert_feed_forward_length", uint32(s.ExpertFF)})
	}
	switch a {
	case "deepseek2":
		md = deepseek2Metadata(md, s)
	case "mistral3":
		// Ministral 3's YaRN and attention temperature scaling, with an
		// original context of 8 so that short prompts reach the scaled
		// positions (the scale depends on the position only).
		md = append(md, KV{a + ".rope.scaling.type", "yarn"}, KV{a + ".rope.scaling.factor", float32(4)},
			KV{a + ".rope.scaling.original_context_length", uint32(8)}, KV{a + ".attention.temperature_scale", float32(0.1)})
	case "gpt-oss", "gemma3":
		md = swaMetadata(md, s)
	case "llama4":
		// Llama 4's: rope base 500000, llama3-style rope factors
		// (rope_freqs), experts and their interleave step.
		md.Set(a+".rope.freq_base", float32(500000))
		md = append(md, KV{a + ".expert_feed_forward_length", uint32(s.ExpertFF)},
			KV{a + ".interleave_moe_layer_step", uint32(s.MoEStep)}, KV{a + ".attention.sliding_window", uint32(s.SlidingWindow)})
	case "glm4moe":
		md = glm4moeMetadata(md, s)
	case "qwen3next":
		md = qwen3nextMetadata(md, s)
	case "minimax-m2":
		md.Set(a+".rope.dimension_count", uint32(s.RopeDim))
		md = append(md, KV{a + ".attention.key_length", uint32(headDim)}, KV{a + ".attention.value_length", uint32(headDim)},
			KV{a + ".expert_feed_forward_length", uint32(s.FF)}, KV{a + ".expert_gating_func", uint32(2)})
	}
	return md
}

// swaMetadata sets the keys of gpt-oss and gemma3 on md: the head length
// and the sliding window; gpt-oss's experts and YaRN scaling (as
// gpt-oss ships them), gemma3's linear rope scaling (as the 4B and up).
func swaMetadata(md Metadata, s *Spec) Metadata {
	p := s.Arch + "."
	hd := uint32(s.headDim())
	md = append(md, KV{p + "attention.key_length", hd}, KV{p + "attention.value_length", hd})
	if s.SlidingWindow > 0 {
		md = append(md, KV{p + "attention.sliding_window", uint32(s.SlidingWindow)})
	}
	if s.Arch == "gemma3" {
		return append(md, KV{p + "rope.scaling.type", "linear"}, KV{p + "rope.scaling.factor", float32(8)})
	}
	md.Set(p+"rope.freq_base", float32(150000))
	md.Set(p+"attention.layer_norm_rms_epsilon", float32(1e-5))
	return append(md, KV{p + "expert_feed_forward_length", uint32(s.ExpertFF)},
		KV{p + "rope.scaling.type", "yarn"}, KV{p + "rope.scaling.factor", float32(32)},
		KV{p + "rope.scaling.original_context_length", uint32(min(4096, s.ContextLength))})
}

// glm4moeMetadata sets the glm4moe keys on md, as llama.cpp's converter
// writes GLM-4.5: head length, partial rotary, experts (sigmoid gating,
// weights normalised and scaled by 2.5), the dense lead and the MTP
// layers; no M-RoPE sections (a text model).
func glm4moeMetadata(md Metadata, s *Spec) Metadata {
	p := s.Arch + "."
	hd := uint32(s.headDim())
	md.Set(p+"rope.dimension_count", uint32(s.RopeDim))
	md.Set(p+"attention.layer_norm_rms_epsilon", float32(1e-5))
	return append(md,
		KV{p + "attention.key_length", hd}, KV{p + "attention.value_length", hd},
		KV{p + "expert_feed_forward_length", uint32(s.ExpertFF)},
		KV{p + "expert_shared_count", uint32(s.SharedExperts)},
		KV{p + "leading_dense_block_count", uint32(s.DenseLead)},
		KV{p + "expert_weights_scale", float32(2.5)},
		KV{p + "expert_weights_norm", true},
		KV{p + "expert_gating_func", uint32(2)},
		KV{p + "nextn_predict_layers", uint32(s.NextN)},
	)
}

// qwen3nextMetadata sets the qwen3next keys on md, as llama.cpp's
// converter writes Qwen3-Next: head length, partial rotary, experts and
// the shared expert's width, and the delta net's geometry (ssm.*).
func qwen3nextMetadata(md Metadata, s *Spec) Metadata {
	p := s.Arch + "."
	hd := uint32(s.headDim())
	md.Set(p+"rope.dimension_count", uint32(s.RopeDim))
	md.Set(p+"rope.freq_base", float32(10000000))
	return append(md,
		KV{p + "attention.key_length", hd}, KV{p + "attention.value_length", hd},
		KV{p + "expert_feed_forward_length", uint32(s.ExpertFF)},
		KV{p + "expert_shared_feed_forward_length", uint32(s.ExpertFF * s.SharedExperts)},
		KV{p + "ssm.conv_kernel", uint32(s.SSMConv)},
		KV{p + "ssm.state_size", uint32(s.SSMState)},
		KV{p + "ssm.group_count", uint32(s.SSMGroups)},
		KV{p + "ssm.time_step_rank", uint32(s.SSMHeads)},
		KV{p + "ssm.inner_size", uint32(s.SSMState * s.SSMHeads)},
	)
}

// deepseek2Metadata sets the deepseek2 keys on md (as llama.cpp's
// converter writes DeepSeek-V3 with MLA: the cache holds one latent head
// of kv_lora_rank + the roped dims; YaRN scaling as V3 ships it).
func deepseek2Metadata(md Metadata, s *Spec) Metadata {
	p := s.Arch + "."
	md.Set(p+"attention.head_count_kv", uint32(1))
	md.Set(p+"rope.dimension_count", uint32(s.RopeDim))
	md.Set(p+"rope.freq_base", float32(10000))
	md = append(md,
		KV{p + "attention.key_length", uint32(s.KVLoraRank + s.RopeDim)},
		KV{p + "attention.value_length", uint32(s.KVLoraRank)},
		KV{p + "attention.key_length_mla", uint32(s.NopeDim + s.RopeDim)},
		KV{p + "attention.value_length_mla", uint32(s.VDim)},
		KV{p + "attention.q_lora_rank", uint32(s.QLoraRank)},
		KV{p + "attention.kv_lora_rank", uint32(s.KVLoraRank)},
		KV{p + "leading_dense_block_count", uint32(s.DenseLead)},
		KV{p + "expert_feed_forward_length", uint32(s.ExpertFF)},
		KV{p + "expert_shared_count", uint32(s.SharedExperts)},
		KV{p + "expert_weights_scale", float32(2.5)},
		KV{p + "expert_weights_norm", true},
		KV{p + "expert_gating_func", uint32(2)}, // sigmoid (V3)
		KV{p + "rope.scaling.type", "yarn"},
		KV{p + "rope.scaling.factor", float32(40)},
		KV{p + "rope.scaling.original_context_length", uint32(min(4096, s.ContextLength))},
		KV{p + "rope.scaling.yarn_log_multiplier", float32(0.1)},
	)
	if s.ExpertGroups > 1 {
		md = append(md, KV{p + "expert_group_count", uint32(s.ExpertGroups)}, KV{p + "expert_group_used_count", uint32(s.ExpertGroupsUsed)})
	}
	return md
}

// synthStd is the standard deviation of normal-initialised weights.
const synthStd = 0.02

// synthMat is a weight matrix of s's type, normal-initialised.
func synthMat(s *Spec, name string, shape ...uint64) synthTensor {
	return synthTensor{name, s.Type, shape, initNormal, synthStd}
}

// synthVec is an F32 vector of n elements initialised by init.
func synthVec(name string, init int, n uint64) synthTensor {
	return synthTensor{name, TypeF32, []uint64{n}, init, synthStd}
}

// synthTensors returns the tensors of s in file order: token_embd,
// rope_freqs (llama), every layer's (synthLayer), output_norm, and output
// unless tied.
func synthTensors(s *Spec, nVocab int) []synthTensor {
	e, nv := uint64(s.Embd), uint64(nVocab)
	ts := []synthTensor{synthMat(s, tokenEmbd, e, nv)}
	if s.Arch == "llama" || s.Arch == "llama4" {
		ts = append(ts, synthVec("rope_freqs.weight", initRopeFreqs, uint64(s.Embd/s.Heads/2)))
	}
	for i := 0; i < s.Layers; i++ {
		switch s.Arch {
		case "deepseek2":
			ts = synthDeepseek2Layer(ts, s, i)
			continue
		case "minimax-m2":
			ts = synthMinimaxLayer(ts, s, i)
			continue
		case "gpt-oss":
			ts = synthGPTOSSLayer(ts, s, i)
			continue
		case "gemma3":
			ts = synthGemma3Layer(ts, s, i)
			continue
		case "llama4":
			ts = synthLlama4Layer(ts, s, i)
			continue
		case "glm4moe":
			ts = synthGLM4MoELayer(ts, s, i)
			continue
		case "qwen3next":
			ts = synthQwen3NextLayer(ts, s, i)
			continue
		}
		ts = synthLayer(ts, s, i)
	}
	ts = append(ts, synthVec(outputNorm, initOnes, e))
	if !s.Tied {
		ts = append(ts, synthMat(s, output, e, nv))
	}
	return ts
}

// synthLayer appends the tensors of layer i of s to ts: attention (with
// qwen2's biases or qwen3's q/k norms), then a dense or expert feed-forward.
func synthLayer(ts []synthTensor, s *Spec, i int) []synthTensor {
	a := s.Arch
	headDim := s.Embd / s.Heads
	e, q, kv := uint64(s.Embd), uint64(headDim*s.Heads), uint64(headDim*s.KVHeads)
	ff := uint64(s.FF)
	l := func(n string) string { return layerName(i, n) }
	mat := func(name string, shape ...uint64) synthTensor { return synthMat(s, name, shape...) }
	ts = append(ts,
		synthVec(l("attn_norm.weight"), initOnes, e),
		mat(l("attn_q.weight"), e, q),
		mat(l("attn_k.weight"), e, kv),
		mat(l("attn_v.weight"), e, kv),
		mat(l("attn_output.weight"), q, e),
	)
	switch a {
	case "qwen2":
		ts = append(ts, synthVec(l("attn_q.bias"), initNormal, q), synthVec(l("attn_k.bias"), initNormal, kv), synthVec(l("attn_v.bias"), initNormal, kv))
	case "qwen3", "qwen3moe":
		ts = append(ts, synthVec(l("attn_q_norm.weight"), initOnes, uint64(headDim)), synthVec(l("attn_k_norm.weight"), initOnes, uint64(headDim)))
	}
	ts = append(ts, synthVec(l("ffn_norm.weight"), initOnes, e))
	if s.Experts <= 0 {
		return append(ts, mat(l("ffn_gate.weight"), e, ff), mat(l("ffn_down.weight"), ff, e), mat(l("ffn_up.weight"), e, ff))
	}
	x, eff := uint64(s.Experts), ff
	if a == "qwen3moe" {
		eff = uint64(s.ExpertFF)
	}
	gate := mat(l("ffn_gate_inp.weight"), e, x)
	gate.std = 0.5 // spread the router logits so routing is exercised
	return append(ts, gate,
		mat(l("ffn_gate_exps.weight"), e, eff, x),
		mat(l("ffn_down_exps.weight"), eff, e, x),
		mat(l("ffn_up_exps.weight"), e, eff, x),
	)
}

// synthDeepseek2Layer appends layer i of a deepseek2 spec: latent
// attention (q through its LoRA, k/v from one latent, k_b and v_b split as
// MLA GGUFs ship them), then a dense feed-forward in the lead layers,
// experts with a routing bias and shared experts after.
func synthDeepseek2Layer(ts []synthTensor, s *Spec, i int) []synthTensor {
	l := func(n string) string { return layerName(i, n) }
	mat := func(name string, shape ...uint64) synthTensor { return synthMat(s, name, shape...) }
	e, h := uint64(s.Embd), uint64(s.Heads)
	qr, kvr, rope, nope, v := uint64(s.QLoraRank), uint64(s.KVLoraRank), uint64(s.RopeDim), uint64(s.NopeDim), uint64(s.VDim)
	ts = append(ts,
		synthVec(l("attn_norm.weight"), initOnes, e),
		synthVec(l("attn_q_a_norm.weight"), initOnes, qr),
		synthVec(l("attn_kv_a_norm.weight"), initOnes, kvr),
		mat(l("attn_q_a.weight"), e, qr),
		mat(l("attn_q_b.weight"), qr, h*(nope+rope)),
		mat(l("attn_kv_a_mqa.weight"), e, kvr+rope),
		mat(l("attn_k_b.weight"), nope, kvr, h),
		mat(l("attn_v_b.weight"), kvr, v, h),
		mat(l("attn_output.weight"), h*v, e),
		synthVec(l("ffn_norm.weight"), initOnes, e),
	)
	if i < s.DenseLead {
		ff := uint64(s.FF)
		return append(ts, mat(l("ffn_gate.weight"), e, ff), mat(l("ffn_down.weight"), ff, e), mat(l("ffn_up.weight"), e, ff))
	}
	x, eff, sh := uint64(s.Experts), uint64(s.ExpertFF), uint64(s.ExpertFF*s.SharedExperts)
	gate := mat(l("ffn_gate_inp.weight"), e, x)
	gate.std = 0.5
	bias := synthVec(l("exp_probs_b.bias"), initNormal, x)
	bias.std = 0.1
	return append(ts, gate, bias,
		mat(l("ffn_gate_exps.weight"), e, eff, x),
		mat(l("ffn_down_exps.weight"), eff, e, x),
		mat(l("ffn_up_exps.weight"), e, eff, x),
		mat(l("ffn_gate_shexp.weight"), e, sh),
		mat(l("ffn_down_shexp.weight"), sh, e),
		mat(l("ffn_up_shexp.weight"), e, sh),
	)
}

// synthMinimaxLayer appends layer i of a minimax-m2 spec: attention with
// q/k norms over all heads, then experts (FF each) with a routing bias.
func synthMinimaxLayer(ts []synthTensor, s *Spec, i int) []synthTensor {
	l := func(n string) string { return layerName(i, n) }
	mat := func(name string, shape ...uint64) synthTensor { return synthMat(s, name, shape...) }
	hd := uint64(s.Embd / s.Heads)
	e, q, kv, ff, x := uint64(s.Embd), hd*uint64(s.Heads), hd*uint64(s.KVHeads), uint64(s.FF), uint64(s.Experts)
	gate := mat(l("ffn_gate_inp.weight"), e, x)
	gate.std = 0.5
	bias := synthVec(l("exp_probs_b.bias"), initNormal, x)
	bias.std = 0.1
	return append(ts,
		synthVec(l("attn_norm.weight"), initOnes, e),
		mat(l("attn_q.weight"), e, q),
		mat(l("attn_k.weight"), e, kv),
		mat(l("attn_v.weight"), e, kv),
		mat(l("attn_output.weight"), q, e),
		synthVec(l("attn_q_norm.weight"), initOnes, q),
		synthVec(l("attn_k_norm.weight"), initOnes, kv),
		synthVec(l("ffn_norm.weight"), initOnes, e),
		gate, bias,
		mat(l("ffn_gate_exps.weight"), e, ff, x),
		mat(l("ffn_down_exps.weight"), ff, e, x),
		mat(l("ffn_up_exps.weight"), e, ff, x),
	)
}

// synthGPTOSSLayer appends layer i of a gpt-oss spec: attention with
// biases and a sink per head, a post-attention norm, then experts with
// biases (ExpertFF each) and a biased router.
func synthGPTOSSLayer(ts []synthTensor, s *Spec, i int) []synthTensor {
	l := func(n string) string { return layerName(i, n) }
	mat := func(name string, shape ...uint64) synthTensor { return synthMat(s, name, shape...) }
	bias := func(name string, shape ...uint64) synthTensor {
		return synthTensor{l(name), TypeF32, shape, initNormal, synthStd}
	}
	hd := uint64(s.headDim())
	e, q, kv, ff, x := uint64(s.Embd), hd*uint64(s.Heads), hd*uint64(s.KVHeads), uint64(s.ExpertFF), uint64(s.Experts)
	sinks := synthVec(l("attn_sinks.weight"), initNormal, uint64(s.Heads))
	sinks.std = 1 // sinks take a real share of the softmax
	gate := mat(l("ffn_gate_inp.weight"), e, x)
	gate.std = 0.5
	return append(ts,
		synthVec(l("attn_norm.weight"), initOnes, e),
		mat(l("attn_q.weight"), e, q), bias("attn_q.bias", q),
		mat(l("attn_k.weight"), e, kv), bias("attn_k.bias", kv),
		mat(l("attn_v.weight"), e, kv), bias("attn_v.bias", kv),
		mat(l("attn_output.weight"), q, e), bias("attn_output.bias", e),
		sinks,
		synthVec(l("post_attention_norm.weight"), initOnes, e),
		gate, bias("ffn_gate_inp.bias", x),
		mat(l("ffn_gate_exps.weight"), e, ff, x), bias("ffn_gate_exps.bias", ff, x),
		mat(l("ffn_down_exps.weight"), ff, e, x), bias("ffn_down_exps.bias", e, x),
		mat(l("ffn_up_exps.weight"), e, ff, x), bias("ffn_up_exps.bias", ff, x),
	)
}

// synthGemma3Layer appends layer i of a gemma3 spec: attention with q/k
// norms (per head), post-attention and post-feed-forward norms around a
// GELU feed-forward.
func synthGemma3Layer(ts []synthTensor, s *Spec, i int) []synthTensor {
	l := func(n string) string { return layerName(i, n) }
	mat := func(name string, shape ...uint64) synthTensor { return synthMat(s, name, shape...) }
	hd := uint64(s.headDim())
	e, q, kv, ff := uint64(s.Embd), hd*uint64(s.Heads), hd*uint64(s.KVHeads), uint64(s.FF)
	return append(ts,
		synthVec(l("attn_norm.weight"), initOnes, e),
		mat(l("attn_q.weight"), e, q),
		mat(l("attn_k.weight"), e, kv),
		mat(l("attn_v.weight"), e, kv),
		mat(l("attn_output.weight"), q, e),
		synthVec(l("attn_q_norm.weight"), initOnes, hd),
		synthVec(l("attn_k_norm.weight"), initOnes, hd),
		synthVec(l("post_attention_norm.weight"), initOnes, e),
		synthVec(l("ffn_norm.weight"), initOnes, e),
		mat(l("ffn_gate.weight"), e, ff),
		mat(l("ffn_down.weight"), ff, e),
		mat(l("ffn_up.weight"), e, ff),
		synthVec(l("post_ffw_norm.weight"), initOnes, e),
	)
}

// synthLlama4Layer appends layer i of a llama4 spec: llama's attention,
// then experts with a shared one on every MoEStep-th layer, a dense
// feed-forward on the others.
func synthLlama4Layer(ts []synthTensor, s *Spec, i int) []synthTensor {
	l := func(n string) string { return layerName(i, n) }
	mat := func(name string, shape ...uint64) synthTensor { return synthMat(s, name, shape...) }
	hd := uint64(s.headDim())
	e, q, kv := uint64(s.Embd), hd*uint64(s.Heads), hd*uint64(s.KVHeads)
	ts = append(ts,
		synthVec(l("attn_norm.weight"), initOnes, e),
		mat(l("attn_q.weight"), e, q),
		mat(l("attn_k.weight"), e, kv),
		mat(l("attn_v.weight"), e, kv),
		mat(l("attn_output.weight"), q, e),
		synthVec(l("ffn_norm.weight"), initOnes, e),
	)
	if (i+1)%s.MoEStep != 0 {
		ff := uint64(s.FF)
		return append(ts, mat(l("ffn_gate.weight"), e, ff), mat(l("ffn_down.weight"), ff, e), mat(l("ffn_up.weight"), e, ff))
	}
	x, eff := uint64(s.Experts), uint64(s.ExpertFF)
	gate := mat(l("ffn_gate_inp.weight"), e, x)
	gate.std = 0.5
	return append(ts, gate,
		mat(l("ffn_gate_exps.weight"), e, eff, x),
		mat(l("ffn_down_exps.weight"), eff, e, x),
		mat(l("ffn_up_exps.weight"), e, eff, x),
		mat(l("ffn_gate_shexp.weight"), e, eff),
		mat(l("ffn_down_shexp.weight"), eff, e),
		mat(l("ffn_up_shexp.weight"), e, eff),
	)
}

// synthGLM4MoELayer appends layer i of a glm4moe spec: attention with
// q/k/v biases and per-head q/k norms, the post-attention norm, a dense
// feed-forward in the lead layers, experts with a routing bias and shared
// experts after, and in the last NextN layers the MTP tensors
// (llama-model.cpp load_tensors, LLM_ARCH_GLM4_MOE).
func synthGLM4MoELayer(ts []synthTensor, s *Spec, i int) []synthTensor {
	l := func(n string) string { return layerName(i, n) }
	mat := func(name string, shape ...uint64) synthTensor { return synthMat(s, name, shape...) }
	hd := uint64(s.headDim())
	e, q, kv := uint64(s.Embd), hd*uint64(s.Heads), hd*uint64(s.KVHeads)
	ts = append(ts,
		synthVec(l("attn_norm.weight"), initOnes, e),
		mat(l("attn_q.weight"), e, q), synthVec(l("attn_q.bias"), initNormal, q),
		mat(l("attn_k.weight"), e, kv), synthVec(l("attn_k.bias"), initNormal, kv),
		mat(l("attn_v.weight"), e, kv), synthVec(l("attn_v.bias"), initNormal, kv),
		mat(l("attn_output.weight"), q, e),
		synthVec(l("attn_q_norm.weight"), initOnes, hd),
		synthVec(l("attn_k_norm.weight"), initOnes, hd),
		synthVec(l("post_attention_norm.weight"), initOnes, e),
	)
	if i < s.DenseLead {
		ff := uint64(s.FF)
		ts = append(ts, mat(l("ffn_gate.weight"), e, ff), mat(l("ffn_down.weight"), ff, e), mat(l("ffn_up.weight"), e, ff))
	} else {
		x, eff, sh := uint64(s.Experts), uint64(s.ExpertFF), uint64(s.ExpertFF*s.SharedExperts)
		gate := mat(l("ffn_gate_inp.weight"), e, x)
		gate.std = 0.5
		bias := synthVec(l("exp_probs_b.bias"), initNormal, x)
		bias.std = 0.1
		ts = append(ts, gate, bias,
			mat(l("ffn_gate_exps.weight"), e, eff, x),
			mat(l("ffn_down_exps.weight"), eff, e, x),
			mat(l("ffn_up_exps.weight"), e, eff, x))
		if sh > 0 {
			ts = append(ts, mat(l("ffn_gate_shexp.weight"), e, sh), mat(l("ffn_down_shexp.weight"), sh, e), mat(l("ffn_up_shexp.weight"), e, sh))
		}
	}
	if i < s.Layers-s.NextN {
		return ts
	}
	return append(ts,
		mat(l("nextn.eh_proj.weight"), 2*e, e),
		synthVec(l("nextn.enorm.weight"), initOnes, e),
		synthVec(l("nextn.hnorm.weight"), initOnes, e),
		synthVec(l("nextn.shared_head_norm.weight"), initOnes, e),
	)
}

// synthQwen3NextLayer appends layer i of a qwen3next spec: a gated delta
// net (3 of every 4 layers) or gated attention with q/k norms (the 4th),
// the post-attention norm, then experts and a sigmoid-gated shared expert
// (llama-model.cpp load_tensors, LLM_ARCH_QWEN3NEXT).
func synthQwen3NextLayer(ts []synthTensor, s *Spec, i int) []synthTensor {
	l := func(n string) string { return layerName(i, n) }
	mat := func(name string, shape ...uint64) synthTensor { return synthMat(s, name, shape...) }
	e, hd := uint64(s.Embd), uint64(s.headDim())
	ts = append(ts, synthVec(l("attn_norm.weight"), initOnes, e), synthVec(l("post_attention_norm.weight"), initOnes, e))
	if qwen3nextRecurrent(i) {
		st, hv := uint64(s.SSMState), uint64(s.SSMHeads)
		key, val := st*uint64(s.SSMGroups), st*hv
		dt := synthVec(l("ssm_dt.bias"), initNormal, hv)
		dt.std = 0.5
		ts = append(ts,
			mat(l("ssm_in.weight"), e, 2*key+2*val),
			// ggml's ssm_conv takes an F32 kernel only (llama.cpp's
			// quantizer leaves it so).
			synthTensor{l("ssm_conv1d.weight"), TypeF32, []uint64{uint64(s.SSMConv), 2*key + val}, initNormal, 0.3},
			dt,
			synthTensor{l("ssm_a"), TypeF32, []uint64{hv}, initDecay, 0},
			mat(l("ssm_ba.weight"), e, 2*hv),
			synthVec(l("ssm_norm.weight"), initOnes, st),
			mat(l("ssm_out.weight"), val, e))
	} else {
		q, kv := hd*uint64(s.Heads), hd*uint64(s.KVHeads)
		ts = append(ts,
			mat(l("attn_q.weight"), e, 2*q), // the query and its gate
			mat(l("attn_k.weight"), e, kv),
			mat(l("attn_v.weight"), e, kv),
			mat(l("attn_output.weight"), q, e),
			synthVec(l("attn_q_norm.weight"), initOnes, hd),
			synthVec(l("attn_k_norm.weight"), initOnes, hd))
	}
	x, eff, sh := uint64(s.Experts), uint64(s.ExpertFF), uint64(s.ExpertFF*s.SharedExperts)
	gate := mat(l("ffn_gate_inp.weight"), e, x)
	gate.std = 0.5
	return append(ts, gate,
		mat(l("ffn_gate_exps.weight"), e, eff, x),
		mat(l("ffn_down_exps.weight"), eff, e, x),
		mat(l("ffn_up_exps.weight"), e, eff, x),
		synthVec(l("ffn_gate_inp_shexp.weight"), initNormal, e),
		mat(l("ffn_gate_shexp.weight"), e, sh),
		mat(l("ffn_up_shexp.weight"), e, sh),
		mat(l("ffn_down_shexp.weight"), sh, e))
}

// synthData generates a tensor's bytes on demand: element i is a pure
// function of (seed, name, i/synthChunk, i%synthChunk).
type synthData struct {
	seed, nameHash uint64
	t              synthTensor
	size           int64
}

const synthChunk = 4096 // elements per PRNG stream

func newSynthData(seed uint64, t synthTensor, size int64) *synthData {
	h := fnv.New64a()
	h.Write([]byte(t.name))
	return &synthData{seed: seed, nameHash: h.Sum64(), t: t, size: size}
}

func (d *synthData) elemSize() int64 { return int64(d.t.typ.TypeSize()) }

// ReadAt fills p with the tensor's bytes at off.
func (d *synthData) ReadAt(p []byte, off int64) (int, error) {
	es := d.elemSize()
	n := 0
	var vals [synthChunk]float32
	var enc [synthChunk * 4]byte
	for n < len(p) && off+int64(n) < d.size {
		pos := off + int64(n)
		elem := pos / es
		chunk := elem / synthChunk
		d.fill(chunk, vals[:])
		first := chunk * synthChunk
		for i, v := range vals {
			if d.t.typ == TypeF16 {
				binary.LittleEndian.PutUint16(enc[2*i:], f32ToF16(v))
			} else {
				binary.LittleEndian.PutUint32(enc[4*i:], math.Float32bits(v))
			}
		}
		chunkBytes := enc[:synthChunk*es]
		from := pos - first*es
		end := min(int64(len(chunkBytes)), d.size-first*es)
		n += copy(p[n:], chunkBytes[from:end])
	}
	if n < len(p) {
		return n, errors.New("gguf: synth read past tensor end")
	}
	return n, nil
}

func (d *synthData) fill(chunk int64, vals []float32) {
	switch d.t.init {
	case initOnes:
		for i := range vals {
			vals[i] = 1
		}
	case initRopeFreqs:
		// llama3-style frequency factors between 1 and 4.
		n := float64(d.size / d.elemSize())
		for i := range vals {
			k := float64(chunk*synthChunk + int64(i))
			vals[i] = float32(1 + 3*k/max(1, n-1))
		}
	case initDecay:
		for i := range vals {
			vals[i] = -0.25 - float32((chunk*synthChunk+int64(i))%8)/4
		}
	default:
		r := rand.New(rand.NewPCG(d.seed^d.nameHash, uint64(chunk)))
		for i := range vals {
			vals[i] = float32(r.NormFloat64() * d.t.std)
		}
	}
}

// f32ToF16 converts to IEEE half precision, rounding to nearest even.
func f32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23) & 0xff
	mant := b & 0x7fffff
	switch {
	case exp == 0xff: // Inf/NaN
		if mant != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	case exp-127 > 15: // overflow
		return sign | 0x7c00
	case exp-127 >= -14: // normal
		e := uint32(exp-127+15) << 10
		m := mant >> 13
		h := e | m
		rem := mant & 0x1fff
		if rem > 0x1000 || (rem == 0x1000 && h&1 == 1) {
			h++ // may carry into the exponent, which is correct
		}
		return sign | uint16(h)
	case exp-127 >= -25: // subnormal
		mant |= 0x800000
		shift := uint32(-14-(exp-127)) + 13
		m := mant >> shift
		rem := mant & (1<<shift - 1)
		half := uint32(1) << (shift - 1)
		if rem > half || (rem == half && m&1 == 1) {
			m++
		}
		return sign | uint16(m)
	}
	return sign
}

// synthVocab returns the tokenizer.* pairs and the vocabulary size.
func synthVocab(from string) (Metadata, int, error) {
	if from == "" {
		md := builtinVocab()
		n, _ := md.ArrayLen("tokenizer.ggml.tokens")
		return md, n, nil
	}
	f, err := Open(from)
	if err != nil {
		return nil, 0, fmt.Errorf("vocab: %w", err)
	}
	defer f.Close()
	var md Metadata
	for _, kv := range f.Metadata {
		if strings.HasPrefix(kv.Key, "tokenizer.") {
			md = append(md, kv)
		}
	}
	n, ok := md.ArrayLen("tokenizer.ggml.tokens")
	if !ok || n == 0 {
		return nil, 0, fmt.Errorf("%w: vocab file %s has no tokenizer.ggml.tokens", ErrBadSpec, from)
	}
	return md, n, nil
}

// builtinVocab is a 372-token SentencePiece-style vocabulary: <unk>, <s>,
// </s>, 256 byte tokens, ▁, printable ASCII and a few merges.
func builtinVocab() Metadata {
	const (
		typNormal  = 1
		typUnknown = 2
		typControl = 3
		typByte    = 6
	)
	var toks []string
	var scores []float32
	var types []int32
	add := func(s string, score float32, typ int32) {
		toks = append(toks, s)
		scores = append(scores, score)
		types = append(types, typ)
	}
	add("<unk>", 0, typUnknown)
	add("<s>", 0, typControl)
	add("</s>", 0, typControl)
	for b := 0; b < 256; b++ {
		add(fmt.Sprintf("<0x%02X>", b), 0, typByte)
	}
	add("▁", -1000, typNormal)
	for c := byte(0x21); c <= 0x7e; c++ {
		add(string(rune(c)), -1001-float32(c), typNormal)
	}
	for i, m := range []string{"▁t", "he", "▁a", "in", "▁the", "on", "er", "an", "▁s", "re", "nd", "at", "▁w", "en", "▁o", "it", "es", "ed"} {
		add(m, -10-float32(i), typNormal)
	}
	return Metadata{
		{"tokenizer.ggml.model", "llama"},
		{"tokenizer.ggml.tokens", toks},
		{"tokenizer.ggml.scores", scores},
		{"tokenizer.ggml.token_type", types},
		{"tokenizer.ggml.bos_token_id", uint32(1)},
		{"tokenizer.ggml.eos_token_id", uint32(2)},
		{"tokenizer.ggml.unknown_token_id", uint32(0)},
		{"tokenizer.ggml.add_bos_token", true},
		{"tokenizer.ggml.add_eos_token", false},
	}
}
