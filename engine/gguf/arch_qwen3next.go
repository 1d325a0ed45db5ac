package gguf

import (
	"errors"
	"fmt"
)

// ErrRefusedArch reports an architecture meshp2p has rules for (synthesis,
// cut points) but refuses to run, with the measured reason
// (archRule.refused). ValidateForLoad's error wraps it and
// ErrNotLoadable.
var ErrRefusedArch = errors.New("architecture refused")

// qwen3nextPeriod is qwen3next's full-attention interval: llama.cpp marks
// layer i recurrent (a gated delta net) when (i+1)%4 != 0, hard-coded
// (llama-model.cpp load_hparams, LLM_ARCH_QWEN3NEXT; the GGUF's
// full_attention_interval is not read).
const qwen3nextPeriod = 4

// qwen3next (Qwen3-Next-80B-A3B): 3 of every 4 layers are gated delta
// nets (linear attention with a recurrent state per sequence: a causal
// convolution state and a matrix state), the 4th gated full attention with
// q/k norms and partial rotary; experts (softmax-routed) plus a sigmoid-
// gated shared expert in every layer. The memory is hybrid: a KV cache for
// the attention layers, one recurrent cell per sequence for the others.
//   - The recurrent layers are keyed on the layer index: a shard starts at
//     a multiple of 4 and holds at least 4 layers (a full-attention one:
//     the hybrid memory's attention input is filled whatever the graph
//     uses, as gemma3's, swaPatternLoad).
//   - Refused (refused): the delta net computes a one-token batch
//     (build_delta_net_autoregressive) and a longer one (chunked,
//     build_delta_net_chunking) differently, so a session's outputs
//     depend on how its tokens were batched, and recurrent state cannot be
//     truncated, copied by position range or compacted as KV cells are
//     (docs/architectures.md, "Not yet"; engine TestQwen3NextMeasured).
var qwen3nextRule = archRule{
	covers:   "Qwen3-Next (80B-A3B)",
	refused:  qwen3nextRefusal,
	layerOut: "post_moe", // models/qwen3next.cpp names no l_out
	layer:    qwen3nextLayer,
	cut: func(_ Metadata, _ string, r Range, n int) error {
		switch {
		case r.Len() == n:
			return nil
		case r.Start%qwen3nextPeriod != 0:
			return fmt.Errorf("%w: layers %s: qwen3next's recurrent (gated delta net) and full-attention layers alternate 3:1 by the layer index (llama.cpp: layer i is recurrent when (i+1)%%4 != 0), so a shard starts at a multiple of 4", ErrIllegalCut, r)
		case r.Len() < qwen3nextPeriod:
			return fmt.Errorf("%w: layers %s: %v", ErrIllegalCut, r, qwen3nextLoad(r.Len()))
		}
		return nil
	},
	load: func(_ Metadata, _ string, n int) error { return qwen3nextLoad(n) },
}

// qwen3nextRefusal is why meshp2p does not run qwen3next (Certification,
// ValidateForLoad), as measured by engine TestQwen3NextMeasured.
const qwen3nextRefusal = "qwen3next's recurrent layers compute a one-token batch and a longer one differently " +
	"(llama.cpp's gated delta net: autoregressive vs chunked), so a session's logits depend on how its tokens were batched " +
	"(measured: a prompt prefilled in one batch vs one token at a time moves the logits, by up to 1.3 at Q4_K_M), and its recurrent state " +
	"cannot be truncated or shared by position as the engine's speculation, prefix cache and KV compaction need"

// qwen3nextLoad reports why llama.cpp cannot run a qwen3next file of n
// layers: with fewer than 4 it has no full-attention layer.
func qwen3nextLoad(n int) error {
	if n >= qwen3nextPeriod {
		return nil
	}
	return fmt.Errorf("qwen3next with %d layers has no full-attention layer (one in every %d): it needs at least %d layers", n, qwen3nextPeriod, qwen3nextPeriod)
}

// qwen3nextLayer is the tensors layer i of a qwen3next model needs
// (llama-model.cpp load_tensors, LLM_ARCH_QWEN3NEXT).
func qwen3nextLayer(_ Metadata, _ string, i int) []string {
	layer := []string{"attn_norm.weight", "post_attention_norm.weight"}
	if qwen3nextRecurrent(i) {
		layer = append(layer, "ssm_in.weight", "ssm_conv1d.weight", "ssm_dt.bias", "ssm_a", "ssm_ba.weight", "ssm_norm.weight", "ssm_out.weight")
	} else {
		layer = append(layer, "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight", "attn_q_norm.weight", "attn_k_norm.weight")
	}
	return append(layer, "ffn_gate_inp.weight", "ffn_gate_exps.weight", "ffn_down_exps.weight", "ffn_up_exps.weight",
		"ffn_gate_inp_shexp.weight", "ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight")
}

// qwen3nextRecurrent reports whether llama.cpp makes layer i of a
// qwen3next model a recurrent (gated delta net) layer.
func qwen3nextRecurrent(i int) bool { return (i+1)%qwen3nextPeriod != 0 }
