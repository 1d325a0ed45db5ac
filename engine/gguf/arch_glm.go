package gguf

import "fmt"

// glm4moe (GLM-4.5, GLM-4.6, GLM-4.5-Air): attention with q/k/v biases
// (and q/k norms in the 355B), partial rotary, leading dense layers, then
// sigmoid-routed experts with a routing bias and shared experts, and a
// next-token-prediction (MTP) block of nextn_predict_layers layers at the
// end, which llama.cpp loads but skips in the forward pass
// (models/glm4-moe.cpp).
//   - leading_dense_block_count is keyed on the layer index: a shard from
//     layer a keeps max(0, lead-a) dense layers (as deepseek2's).
//   - nextn_predict_layers is keyed on block_count: the MTP block stays
//     whole with the tail, a tail holds a layer before it, and every other
//     shard gets nextn_predict_layers 0 (glm4moeCut).
//   - llama.cpp aborts a glm4moe graph fed hidden states
//     (llama_batch.embd) unless the model has M-RoPE sections
//     (GGML_ABORT "This GGUF does not support multimodal"). Every shard
//     fed hidden states (every shard but the head) gets
//     rope.dimension_sections with two non-empty sections: llama.cpp then
//     ropes with GGML_ROPE_TYPE_MROPE and 4 positions per row, which the
//     engine fills as llama.cpp fills a text batch's (p, p, p, 0). With the
//     three used positions equal, ggml's M-RoPE computes the same angles in
//     the same order as the NEOX rope the whole model takes
//     (ggml-cpu/ops.cpp ggml_mrope_cache_init, rotate_pairs):
//     docs/architectures.md.
var glm4moeRule = archRule{
	covers: "GLM-4.5, GLM-4.6, GLM-4.5-Air",
	layer:  glm4moeLayer,
	shardKeys: []string{
		"leading_dense_block_count", "nextn_predict_layers", "rope.dimension_sections",
	},
	shardMetadata: glm4moeShardMetadata,
	mropeShards:   true,
	cut:           glm4moeCut,
	legalCuts: func(md Metadata, p string, n int) string {
		nextn, _ := md.Uint(p + "nextn_predict_layers")
		if nextn == 0 || uint64(n) <= nextn+1 {
			return ""
		}
		first := n - int(nextn)
		return fmt.Sprintf("any range ending at layer %d or before, or at %d: layers %d-%d are the next-token-prediction block, which stays with the tail, and the tail starts at layer %d or before", first, n, first, n, first-1)
	},
	load: func(md Metadata, p string, n int) error {
		if nextn, _ := md.Uint(p + "nextn_predict_layers"); nextn >= uint64(n) && n > 0 {
			return fmt.Errorf("glm4moe nextn_predict_layers %d must be below block_count %d", nextn, n)
		}
		return nil
	},
}

// glm4moeLayer is the tensors layer i of a glm4moe model needs (the
// optional q/k norms aside): attention with biases, the post-attention
// norm, a dense or expert feed-forward, and the MTP tensors in the last
// nextn_predict_layers layers.
func glm4moeLayer(md Metadata, p string, i int) []string {
	layer := []string{"attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
		"attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.weight", "post_attention_norm.weight"}
	if lead, _ := md.Uint(p + "leading_dense_block_count"); uint64(i) < lead {
		layer = append(layer, "ffn_gate.weight", "ffn_down.weight", "ffn_up.weight")
	} else {
		layer = append(layer, "ffn_gate_inp.weight", "exp_probs_b.bias", "ffn_gate_exps.weight", "ffn_down_exps.weight", "ffn_up_exps.weight")
		if sh, _ := md.Uint(p + "expert_shared_count"); sh > 0 {
			layer = append(layer, "ffn_gate_shexp.weight", "ffn_down_shexp.weight", "ffn_up_shexp.weight")
		}
	}
	n, _ := md.Uint(p + "block_count")
	if nextn, _ := md.Uint(p + "nextn_predict_layers"); nextn > 0 && uint64(i)+nextn >= n {
		layer = append(layer, "nextn.eh_proj.weight", "nextn.enorm.weight", "nextn.hnorm.weight")
	}
	return layer
}

// glm4moeShardMetadata rewrites a glm4moe shard's metadata for range r of
// n layers (glm4moeRule).
func glm4moeShardMetadata(md *Metadata, p string, r Range, n int) {
	rewriteDenseLead(md, p, r)
	if _, ok := md.Get(p + "nextn_predict_layers"); ok && r.End < n {
		md.Set(p+"nextn_predict_layers", uint32(0))
	}
	if r.Start > 0 && !glm4moeMRoPE(*md, p) {
		md.Set(p+"rope.dimension_sections", glm4moeSections(*md, p))
	}
}

// glm4moeMRoPE reports whether llama.cpp ropes the glm4moe model md with
// M-RoPE (hparams.use_mrope: the first two sections non-empty).
func glm4moeMRoPE(md Metadata, p string) bool {
	v, _ := md.Get(p + "rope.dimension_sections")
	var s []int64
	switch x := v.(type) {
	case []int32:
		for _, e := range x {
			s = append(s, int64(e))
		}
	case []uint32:
		for _, e := range x {
			s = append(s, int64(e))
		}
	}
	return len(s) >= 2 && s[0] > 0 && s[1] > 0
}

// glm4moeSections are the M-RoPE sections a glm4moe shard fed hidden
// states gets: the rotated pairs (rope.dimension_count / 2) in two
// sections, none in the other two. Their sum stays within the head (ggml
// asserts it); with equal positions the split does not matter.
func glm4moeSections(md Metadata, p string) []int32 {
	rot, ok := md.Uint(p + "rope.dimension_count")
	if !ok || rot == 0 {
		rot, ok = md.Uint(p + "attention.key_length")
	}
	if !ok || rot == 0 {
		embd, _ := md.Uint(p + "embedding_length")
		heads, _ := md.Uint(p + "attention.head_count")
		rot = embd / max(1, heads)
	}
	pairs := int32(max(2, rot/2))
	return []int32{pairs / 2, pairs - pairs/2, 0, 0}
}

// glm4moeCut keeps glm4moe's MTP block (the last nextn_predict_layers
// layers) whole with the tail, and a layer before it in the tail.
func glm4moeCut(md Metadata, p string, r Range, n int) error {
	nextn, _ := md.Uint(p + "nextn_predict_layers")
	if nextn == 0 || r.Len() == n {
		return nil
	}
	first := n - int(nextn) // the MTP block is layers first..n-1
	switch {
	case r.End < n && r.End > first:
		return fmt.Errorf("%w: layers %s: glm4moe's last %d layers (%d-%d) are its next-token-prediction block (nextn_predict_layers), which stays whole with the tail: end a shard at layer %d or before, or at %d", ErrIllegalCut, r, nextn, first, n, first, n)
	case r.End == n && r.Start >= first:
		return fmt.Errorf("%w: layers %s: a glm4moe tail holds at least one layer before its next-token-prediction block (layers %d-%d), which llama.cpp skips: start it at layer %d or before", ErrIllegalCut, r, first, n, first-1)
	}
	return nil
}
