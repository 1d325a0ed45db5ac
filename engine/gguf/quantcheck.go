package gguf

import (
	"errors"
	"fmt"
	"strings"
)

// ErrNotQuantizable reports a model llama.cpp's quantizer would fail on
// (or abort on), found before any work is done.
var ErrNotQuantizable = errors.New("model cannot be quantized")

// QuantTypes are the quantizations CheckQuantizable knows the rules of
// (the engine's Quantize types).
var QuantTypes = []string{"f16", "q8_0", "q4_0", "q6_k", "q4_k_m", "mxfp4_moe"}

// QuantizedByLlama reports whether llama.cpp's quantizer (llama-quant.cpp
// at the pinned revision) converts tensor t: names ending in "weight" with
// at least 2 dimensions, except norms, the MoE router (ffn_gate_inp) and
// a few architecture-specific tensors the supported architectures do not
// have.
func QuantizedByLlama(t *TensorInfo) bool {
	n := t.Name
	if !strings.HasSuffix(n, "weight") || len(t.Shape) < 2 {
		return false
	}
	for _, never := range []string{"_norm.weight", "ffn_gate_inp.weight", "altup", "laurel", "per_layer_model_proj",
		"ssm_conv1d.weight", "shortconv.conv.weight", "time_mix_", "attn_rel_b.weight", ".position_embd.", "position_embd.weight", "token_types.weight"} {
		if strings.Contains(n, never) {
			return false
		}
	}
	return true
}

// CheckQuantizable checks, in pure Go and before any work, that llama.cpp
// can quantize the whole model f to typ ("f16", "q8_0", "q4_0", "q6_k",
// "q4_k_m" or "mxfp4_moe"):
//   - f passes ValidateForLoad (the quantizer reads the hyper-parameters
//     with the same asserts as the loader) and is not a shard (quantize the
//     whole model, then split: a shard gets a different type mix);
//   - no tensor it converts is already quantized (requantizing is disabled);
//   - plain Q8_0 has no fallback: every converted tensor's row (ne0) must be
//     a multiple of 32; so must Q4_0's and Q6_K's (Q4_0 has no fallback,
//     Q6_K falls back to Q8_0, and both put the output tensor in Q6_K or
//     its Q8_0 fallback: a conservative rule, not llama.cpp's exact one);
//   - MXFP4_MOE puts tensors with several experts in MXFP4 and the others
//     in Q8_0, both in blocks of 32: rows must be multiples of 32;
//   - Q4_K_M falls back (Q4_K→Q5_0→F16, Q6_K→Q8_0) except where it picks
//     Q8_0 outright: the output tensor (output.weight, or token_embd when
//     tied) whose row is not a multiple of 256, and attn_k/attn_v of
//     8-expert models; those rows must be multiples of 32.
func CheckQuantizable(f *File, typ string) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrNotQuantizable}, args...)...)
	}
	typ = strings.ToLower(typ)
	switch typ {
	case "f16", "q8_0", "q4_0", "q6_k", "q4_k_m", "mxfp4_moe":
	default:
		return bad("unknown type %q (want f16, q8_0, q4_0, q6_k, q4_k_m or mxfp4_moe)", typ)
	}
	if f.Metadata.Index(KeyParentFingerprint) >= 0 || f.Metadata.Index(KeyVocabFingerprint) >= 0 {
		return bad("%w: quantize the whole model, then split", ErrIsShard)
	}
	// A refused architecture (ErrRefusedArch) quantizes: llama.cpp's
	// quantizer does not run it, and the engine's tests measure it.
	if err := ValidateForLoad(f); err != nil && !errors.Is(err, ErrRefusedArch) {
		return fmt.Errorf("%w: %w", ErrNotQuantizable, err)
	}
	_, hasOutput := f.Tensor(output)
	nExp, _ := f.Metadata.Uint(f.Architecture() + ".expert_count")
	for i := range f.Tensors {
		t := &f.Tensors[i]
		if !QuantizedByLlama(t) {
			continue
		}
		switch t.Type {
		case TypeF32, TypeF16, TypeBF16:
		default:
			if typ == "q8_0" && t.Type == TypeQ8_0 {
				continue // already the target type: copied
			}
			return bad("tensor %s is already %v (requantizing is disabled; start from an F32/F16/BF16 model)", t.Name, t.Type)
		}
		row := t.Shape[0]
		need := uint64(0)
		switch typ {
		case "q8_0", "q4_0", "q6_k", "mxfp4_moe":
			need = 32
		case "q4_k_m":
			isOutput := t.Name == output || (!hasOutput && t.Name == tokenEmbd)
			if isOutput && row%256 != 0 {
				need = 32
			}
			if nExp == 8 && (strings.HasSuffix(t.Name, "attn_k.weight") || strings.HasSuffix(t.Name, "attn_v.weight")) {
				need = 32
			}
		}
		if need != 0 && row%need != 0 {
			return bad("tensor %s has rows of %d, not a multiple of %d as %s requires for it", t.Name, row, need, strings.ToUpper(typ))
		}
	}
	return nil
}
