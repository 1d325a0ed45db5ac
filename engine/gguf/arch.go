package gguf

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
)

// Architecture rules: what meshp2p knows about each architecture it runs
// split (docs/architectures.md). A shard is a sub-GGUF whose block_count is
// its range's length and whose layers are renumbered from 0, so anything
// llama.cpp keys on the layer index or on block_count must be rewritten in
// the shard's metadata, or the cut points restricted, for a chain of shards
// to compute exactly what the whole model does.

// ErrIllegalCut is a layer range an architecture cannot be cut at.
var ErrIllegalCut = errors.New("illegal cut")

// OutputRequired reports whether llama.cpp's loader needs output.weight
// in every shard of arch (no tied fallback): a head shard then carries
// the output matrix besides the token embeddings, and a tail shard
// besides the copy of it in its token_embd slot (Split). Read into
// memory, as `start` loads by default, each copy costs its size.
func OutputRequired(arch string) bool { return archRules[arch].outputRequired }

// LayerOutputName is the name llama.cpp's graph gives layer il's output
// tensor in a model of arch ("l_out-<il>" for most).
func LayerOutputName(arch string, il int) string {
	name := archRules[arch].layerOut
	if name == "" {
		name = "l_out"
	}
	return fmt.Sprintf("%s-%d", name, il)
}

// MRoPEShards reports whether arch's shards fed hidden states rope with
// M-RoPE (their metadata rewritten so: glm4moe), whose KV compaction the
// engine restores in one piece through a second copy (engine/kvmerge.go).
func MRoPEShards(arch string) bool { return archRules[arch].mropeShards }

// archRule is one architecture's rules.
type archRule struct {
	// covers names the model families of the architecture (for people).
	covers string
	// layer returns the tensors (after "blk.N.") layer i of a model with
	// metadata md needs.
	layer func(md Metadata, p string, i int) []string
	// outputRequired: llama.cpp's loader needs output.weight (no tied
	// fallback), so every shard carries one.
	outputRequired bool
	// mropeShards: shardMetadata gives shards fed hidden states M-RoPE
	// sections (MRoPEShards).
	mropeShards bool
	// shardMetadata rewrites a shard's metadata for range r of a model
	// of n layers (after block_count is set); nil: nothing to rewrite.
	// shardKeys are the keys (after "<arch>.") it may change: a shard
	// keeps their parent values under KeyParentPrefix + key, which the
	// shard's proof covers (verifyShardMetadata undoes the rewrite).
	shardMetadata func(md *Metadata, p string, r Range, n int)
	shardKeys     []string
	// cut reports why range r of a model of n layers cannot be a shard
	// (nil: it can); nil: every range can.
	cut func(md Metadata, p string, r Range, n int) error
	// legalCuts describes the legal ranges for people when LegalCuts'
	// generic description (starts and lengths) does not fit the rule;
	// nil: the generic one.
	legalCuts func(md Metadata, p string, n int) string
	// load reports why llama.cpp cannot run a file (model or shard) of n
	// layers with metadata md (ValidateForLoad); nil: it can.
	load func(md Metadata, p string, n int) error
	// refused, when set, is why meshp2p does not run the architecture
	// although it has its rules (synthesis and cut points, to measure it):
	// not certified, and ValidateForLoad refuses it (ErrRefusedArch).
	refused string
	// layerOut names the graph tensor of a layer's output (llama.cpp's
	// callback name before "-<il>"), which a shard that is not the tail
	// captures; "": "l_out".
	layerOut string
}

// archRules are the architectures meshp2p loads.
var archRules = map[string]archRule{
	"llama":    {covers: "Llama 2/3.x, Mistral 7B, Mixtral, TinyLlama, stories", layer: denseOrMoELayer(nil)},
	"qwen2":    {covers: "Qwen2, Qwen2.5", layer: denseOrMoELayer([]string{"attn_q.bias", "attn_k.bias", "attn_v.bias"})},
	"qwen3":    {covers: "Qwen3 dense", layer: denseOrMoELayer([]string{"attn_q_norm.weight", "attn_k_norm.weight"})},
	"qwen3moe": {covers: "Qwen3 MoE (30B-A3B, 235B-A22B)", layer: denseOrMoELayer([]string{"attn_q_norm.weight", "attn_k_norm.weight"})},
	// mistral3 (Ministral 3): llama's layers; its attention temperature
	// scaling depends on the position only. Any cut.
	"mistral3":  {covers: "Mistral 3 (Ministral 3 3B/8B/14B)", layer: denseOrMoELayer(nil)},
	"deepseek2": deepseek2Rule,
	// minimax-m2 (MiniMax-M2): experts in every layer with a routing
	// bias, q/k norms over all heads, partial rotary; output required.
	// Nothing keyed on the layer index: any cut.
	"minimax-m2": {covers: "MiniMax-M2", outputRequired: true, layer: func(Metadata, string, int) []string {
		return []string{"attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
			"attn_q_norm.weight", "attn_k_norm.weight", "ffn_norm.weight",
			"ffn_gate_inp.weight", "ffn_gate_exps.weight", "ffn_down_exps.weight", "ffn_up_exps.weight", "exp_probs_b.bias"}
	}},
	"gpt-oss": gptOSSRule,
	"gemma3":  gemma3Rule,
	"llama4":  llama4Rule,
	"glm4moe": glm4moeRule,
	// qwen3next: rules to synthesize, cut and measure it; refused
	// (arch_qwen3next.go).
	"qwen3next": qwen3nextRule,
}

// gpt-oss (gpt-oss-20b, gpt-oss-120b): experts in every layer (biased,
// clamped SwiGLU, softmax over the chosen experts' router logits),
// attention with biases and a learned sink per head, and sliding-window
// attention on every other layer.
//   - llama.cpp keys the sliding layers on the layer index
//     (llama-model.cpp load_hparams, LLM_ARCH_OPENAI_MOE:
//     set_swa_pattern(2): layer il slides when il%2 == 0), and no GGUF key
//     overrides the pattern, so a shard starts at an even layer and holds
//     at least 2 layers (a full-attention one: swaPatternLoad).
//   - output.weight is required (no tied fallback).
var gptOSSRule = archRule{
	covers: "gpt-oss-20b, gpt-oss-120b",
	layer: func(Metadata, string, int) []string {
		return []string{"attn_norm.weight", "post_attention_norm.weight",
			"attn_q.weight", "attn_q.bias", "attn_k.weight", "attn_k.bias", "attn_v.weight", "attn_v.bias",
			"attn_output.weight", "attn_output.bias", "attn_sinks.weight",
			"ffn_gate_inp.weight", "ffn_gate_inp.bias", "ffn_gate_exps.weight", "ffn_gate_exps.bias",
			"ffn_up_exps.weight", "ffn_up_exps.bias", "ffn_down_exps.weight", "ffn_down_exps.bias"}
	},
	outputRequired: true,
	cut: func(_ Metadata, _ string, r Range, n int) error {
		return swaPatternCut("gpt-oss", 2, r, n)
	},
	load: func(_ Metadata, _ string, n int) error { return swaPatternLoad("gpt-oss", 2, n) },
}

// gemma3 (Gemma 3 270M/1B/4B/12B/27B): q/k norms, post-attention and
// post-feed-forward norms, GELU feed-forward, output tied to token_embd.
//   - With attention.sliding_window set, llama.cpp marks 5 of every 6
//     layers sliding by the layer index (llama-model.cpp load_hparams,
//     LLM_ARCH_GEMMA3: set_swa_pattern(6)) and gives them another rope
//     base; no GGUF key overrides the pattern: a shard starts at a
//     multiple of 6 and holds at least 6 layers (a full-attention one:
//     swaPatternLoad).
//   - It scales the queries by 1/√(embedding_length/head_count) in a model
//     of 62 layers (Gemma 3 27B) and by 1/√key_length otherwise, keyed on
//     block_count. Where the two differ (27B: 1/√168 against 1/√128), a
//     62-layer model runs whole, and no other model is cut into a
//     62-layer shard. No key sets the scale, so no rewrite saves those
//     cuts.
//   - The input is scaled by √embedding_length only when a batch carries
//     tokens (models/gemma3.cpp), so a shard fed hidden states does not
//     scale them again.
var gemma3Rule = archRule{
	covers: "Gemma 3 (270M, 1B, 4B, 12B; 27B whole only)",
	layer: func(Metadata, string, int) []string {
		return []string{"attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
			"attn_q_norm.weight", "attn_k_norm.weight", "post_attention_norm.weight",
			"ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight", "post_ffw_norm.weight"}
	},
	cut: func(md Metadata, p string, r Range, n int) error {
		if r.Len() == n {
			return nil
		}
		if gemma3ScaleKeyed(md, p) {
			switch {
			case n == gemma3Layers27B:
				return fmt.Errorf("%w: a gemma3 model of %d layers runs whole: llama.cpp takes it for the 27B and scales its queries by 1/√(embedding_length/head_count), which a shard of another length would not", ErrIllegalCut, n)
			case r.Len() == gemma3Layers27B:
				return fmt.Errorf("%w: layers %s: a gemma3 shard of %d layers would load as the 27B, with another query scale (llama.cpp keys it on the layer count); cut elsewhere", ErrIllegalCut, r, r.Len())
			}
		}
		if gemma3Slides(md, p) {
			return swaPatternCut("gemma3", 6, r, n)
		}
		return nil
	},
	load: func(md Metadata, p string, n int) error {
		if gemma3Slides(md, p) {
			return swaPatternLoad("gemma3", 6, n)
		}
		return nil
	},
}

// gemma3Slides reports whether llama.cpp gives the gemma3 model md
// sliding-window layers (attention.sliding_window > 0).
func gemma3Slides(md Metadata, p string) bool {
	w, _ := md.Uint(p + "attention.sliding_window")
	return w > 0
}

// gemma3Layers27B is the layer count llama.cpp takes a gemma3 model of for
// the 27B (LLM_TYPE_27B), whose query scale differs.
const gemma3Layers27B = 62

// gemma3ScaleKeyed reports whether the 27B's query scale differs from the
// others' for the model md: embedding_length/head_count != key_length.
func gemma3ScaleKeyed(md Metadata, p string) bool {
	embd, _ := md.Uint(p + "embedding_length")
	heads, _ := md.Uint(p + "attention.head_count")
	if heads == 0 {
		return false
	}
	k, ok := md.Uint(p + "attention.key_length")
	return ok && k != embd/heads
}

// llama4 (Llama 4 Scout 17B-16E, Maverick 17B-128E): with chunked
// attention (any attention.sliding_window but 0; llama.cpp makes the chunk
// 8192), 3 of every 4 layers attend within their chunk and rope, the 4th
// attends to everything without rope and with a position-dependent query
// temperature, all keyed on the layer index (llama-model.cpp load_hparams,
// LLM_ARCH_LLAMA4: set_swa_pattern(4); n_no_rope_layer_step 4). Experts
// (sigmoid-routed, plus a shared expert) sit on every
// interleave_moe_layer_step-th layer (load_tensors: (i+1) % step == 0).
// No key overrides the patterns: a shard starts at a multiple of 4 and of
// the MoE step, and holds at least 4 layers (a full-attention one:
// swaPatternLoad).
var llama4Rule = archRule{
	covers: "Llama 4 Scout (17B-16E), Maverick (17B-128E)",
	layer: func(md Metadata, p string, i int) []string {
		layer := []string{"attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight", "ffn_norm.weight"}
		if step, _ := md.Uint(p + "interleave_moe_layer_step"); step > 0 && uint64(i+1)%step == 0 {
			return append(layer, "ffn_gate_inp.weight", "ffn_gate_exps.weight", "ffn_down_exps.weight", "ffn_up_exps.weight",
				"ffn_gate_shexp.weight", "ffn_down_shexp.weight", "ffn_up_shexp.weight")
		}
		return append(layer, "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")
	},
	cut: func(md Metadata, p string, r Range, n int) error {
		if r.Len() == n {
			return nil
		}
		if llama4Chunked(md, p) {
			if err := swaPatternCut("llama4", 4, r, n); err != nil {
				return err
			}
		}
		if step, _ := md.Uint(p + "interleave_moe_layer_step"); step > 1 && uint64(r.Start)%step != 0 {
			return fmt.Errorf("%w: layers %s: llama4's expert layers are every %d-th by the layer index, so a shard starts at a multiple of %d", ErrIllegalCut, r, step, step)
		}
		return nil
	},
	load: func(md Metadata, p string, n int) error {
		if llama4Chunked(md, p) {
			return swaPatternLoad("llama4", 4, n)
		}
		return nil
	},
}

// llama4Chunked reports whether llama.cpp runs the llama4 model md with
// chunked attention: unless attention.sliding_window is present and 0.
func llama4Chunked(md Metadata, p string) bool {
	w, ok := md.Uint(p + "attention.sliding_window")
	return !ok || w > 0
}

// swaPatternCut is the rule of an architecture whose sliding-window layers
// llama.cpp marks by the layer index with set_swa_pattern(period) (layer il
// slides unless il%period == period-1):
//   - a shard renumbers its layers from 0, so it keeps the pattern only if
//     it starts at a multiple of period;
//   - it must hold a full-attention layer, so at least period layers
//     (swaPatternLoad).
func swaPatternCut(arch string, period int, r Range, n int) error {
	switch {
	case r.Len() == n:
		return nil
	case r.Start%period != 0:
		return fmt.Errorf("%w: layers %s: %s's sliding-window layers repeat every %d layers by the layer index (llama.cpp set_swa_pattern(%d)), so a shard starts at a multiple of %d", ErrIllegalCut, r, arch, period, period, period)
	case r.Len() < period:
		return fmt.Errorf("%w: layers %s: %v", ErrIllegalCut, r, swaPatternLoad(arch, period, r.Len()))
	}
	return nil
}

// swaPatternLoad reports why llama.cpp cannot run a model (or shard) of
// n layers with set_swa_pattern(period), or nil. With fewer than period
// layers all of them slide, and llama.cpp aborts at the first decode:
// llm_graph_input_attn_kv_iswa::set_input (llama-graph.cpp) fills the
// cell indices of the full-attention cache, which no layer uses, so the
// graph never allocated them (GGML_ASSERT(buffer) in ggml-backend.cpp).
func swaPatternLoad(arch string, period int, n int) error {
	if n >= period {
		return nil
	}
	return fmt.Errorf("%s with %d layers has no full-attention layer (one in every %d), which llama.cpp aborts on (llm_graph_input_attn_kv_iswa::set_input): it needs at least %d layers", arch, n, period, period)
}

// Architectures lists the architectures meshp2p loads, sorted (not the
// refused ones).
func Architectures() []string {
	out := make([]string, 0, len(archRules))
	for a, r := range archRules {
		if r.refused == "" {
			out = append(out, a)
		}
	}
	slices.Sort(out)
	return out
}

// denseOrMoELayer is the llama-style layer: q/k/v/output attention plus
// extra, then a dense or an expert feed-forward.
func denseOrMoELayer(extra []string) func(md Metadata, p string, i int) []string {
	return func(md Metadata, p string, _ int) []string {
		layer := []string{"attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight", "ffn_norm.weight"}
		if n, _ := md.Uint(p + "expert_count"); n > 0 {
			layer = append(layer, "ffn_gate_inp.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")
		} else {
			layer = append(layer, "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")
		}
		return append(layer, extra...)
	}
}

// deepseek2 (DeepSeek-V2/V3/R1, Kimi-K2): multi-head latent attention,
// leading dense layers, then experts with shared experts.
//   - leading_dense_block_count is keyed on the layer index: a shard from
//     layer a keeps max(0, lead-a) dense layers (clipped to its length).
//   - llama.cpp takes a model of 26 or 27 layers for a "lite" variant
//     (DeepSeek-V2-Lite: one q projection, no q LoRA), keyed on
//     block_count: a shard of 26 or 27 layers of a full model would load
//     the wrong attention, and a lite model's shards of other lengths
//     too. So a full model is never cut into a 26- or 27-layer shard, and
//     a lite model runs whole.
//   - output.weight is required (no tied fallback).
var deepseek2Rule = archRule{
	covers: "DeepSeek-V2/V2.5/V3/V3.1/R1, Kimi-K2",
	layer: func(md Metadata, p string, i int) []string {
		layer := []string{"attn_norm.weight", "attn_kv_a_norm.weight", "attn_kv_a_mqa.weight", "attn_output.weight", "ffn_norm.weight"}
		n, _ := md.Uint(p + "block_count")
		if !deepseek2Lite(n) {
			layer = append(layer, "attn_q_a_norm.weight", "attn_q_a.weight", "attn_q_b.weight")
		} else {
			layer = append(layer, "attn_q.weight")
		}
		if _, mla := md.Get(p + "attention.key_length_mla"); mla {
			layer = append(layer, "attn_k_b.weight", "attn_v_b.weight")
		} else {
			layer = append(layer, "attn_kv_b.weight")
		}
		if lead, _ := md.Uint(p + "leading_dense_block_count"); uint64(i) < lead {
			return append(layer, "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")
		}
		return append(layer, "ffn_gate_inp.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight",
			"ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight")
	},
	outputRequired: true,
	shardKeys:      []string{"leading_dense_block_count"},
	shardMetadata:  func(md *Metadata, p string, r Range, _ int) { rewriteDenseLead(md, p, r) },
	cut: func(_ Metadata, _ string, r Range, n int) error {
		switch {
		case r.Len() == n:
			return nil
		case deepseek2Lite(uint64(n)):
			return fmt.Errorf("%w: deepseek2 with %d layers is a lite variant, which llama.cpp recognises by its layer count: it runs whole", ErrIllegalCut, n)
		case deepseek2Lite(uint64(r.Len())):
			return fmt.Errorf("%w: layers %s: a deepseek2 shard of %d layers would load as the lite variant (llama.cpp keys it on 26 or 27 layers); cut elsewhere", ErrIllegalCut, r, r.Len())
		}
		return nil
	},
}

// rewriteDenseLead sets leading_dense_block_count, when md has it, to the
// dense lead layers range r keeps: max(0, lead-r.Start), clipped to its
// length.
func rewriteDenseLead(md *Metadata, p string, r Range) {
	if lead, ok := md.Uint(p + "leading_dense_block_count"); ok {
		md.Set(p+"leading_dense_block_count", uint32(min(uint64(r.Len()), lead-min(lead, uint64(r.Start)))))
	}
}

func deepseek2Lite(nLayer uint64) bool { return nLayer == 26 || nLayer == 27 }

// notSplittable are architectures llama.cpp runs that meshp2p refuses,
// with the reason (docs/architectures.md).
var notSplittable = map[string]string{
	"glm4": "llama.cpp aborts a glm4 layer range fed hidden states (models/glm4.cpp), so it cannot be split without patching llama.cpp",
}

// Certification says whether meshp2p certifies arch (split at any legal
// cut point, every shard chain computes exactly what the whole model does:
// docs/architectures.md) and, for people, what it covers or why not.
func Certification(arch string) (bool, string) {
	if r, ok := archRules[arch]; ok && r.refused != "" {
		return false, "not certified: " + r.refused
	} else if ok {
		return true, "certified: chains of shards equal the whole model exactly (" + r.covers + ")"
	}
	if why, ok := notSplittable[arch]; ok {
		return false, "not certified: " + why
	}
	return false, fmt.Sprintf("not certified: meshp2p does not load %q yet (certified: %s; docs/architectures.md)", arch, strings.Join(Architectures(), ", "))
}

// CheckCut reports why layers r of a model (metadata md, n layers) cannot
// be a shard: an ErrIllegalCut naming the rule, or nil.
func CheckCut(md Metadata, r Range, n int) error {
	arch, _ := md.String(KeyArchitecture)
	rule, ok := archRules[arch]
	if !ok || rule.cut == nil {
		return nil
	}
	return rule.cut(md, arch+".", r, n)
}

// LegalCuts says which layer ranges a shard of a model (metadata md, n
// layers) may take ("" when any range is legal), for people: where a
// shard may start and the lengths it may not have.
func LegalCuts(md Metadata, n int) string {
	arch, _ := md.String(KeyArchitecture)
	if d := archRules[arch].legalCuts; d != nil {
		return d(md, arch+".", n)
	}
	legal := func(r Range) bool { return CheckCut(md, r, n) == nil }
	var starts []int // legal starts after 0
	for a := 1; a < n; a++ {
		for e := a + 1; e <= n; e++ {
			if legal(Range{Start: a, End: e}) {
				starts = append(starts, a)
				break
			}
		}
	}
	if len(starts) == 0 {
		if n > 1 {
			return "whole model only"
		}
		return ""
	}
	var badLens []string
	for l := 1; l < n; l++ {
		ok := false
		for a := 0; a+l <= n && !ok; a++ {
			ok = legal(Range{Start: a, End: a + l})
		}
		if !ok {
			badLens = append(badLens, fmt.Sprint(l))
		}
	}
	var parts []string
	if len(starts) < n-1 {
		parts = append(parts, legalStarts(starts))
	}
	short := 0 // lengths 1..short are all illegal
	for short < len(badLens) && badLens[short] == fmt.Sprint(short+1) {
		short++
	}
	if short > 0 {
		parts = append(parts, fmt.Sprintf("shards hold at least %d layers", short+1))
		badLens = badLens[short:]
	}
	if len(badLens) > 0 {
		if len(parts) == 0 {
			return "any range except shards of " + strings.Join(badLens, " or ") + " layers"
		}
		parts = append(parts, "no shard of "+strings.Join(badLens, " or ")+" layers")
	}
	return strings.Join(parts, "; ")
}

// legalStarts describes the legal start layers after 0 (starts, sorted):
// a period when they are its multiples.
func legalStarts(starts []int) string {
	p := starts[0]
	periodic := true
	for i, a := range starts {
		periodic = periodic && a == p*(i+1)
	}
	if periodic {
		return fmt.Sprintf("shards start at a multiple of %d layers", p)
	}
	s := make([]string, len(starts))
	for i, a := range starts {
		s[i] = fmt.Sprint(a)
	}
	return "shards start at layer 0, " + strings.Join(s, ", ")
}

// KeyParentPrefix prefixes the parent's values of the keys a shard's
// architecture rewrites (archRule.shardKeys).
const KeyParentPrefix = "meshp2p.parent."

// rewriteShardMetadata applies arch's rewrite to md (a shard of range r of
// n layers), keeping the parent values of the keys it changes.
func rewriteShardMetadata(md Metadata, arch string, r Range, n int) Metadata {
	rule := archRules[arch]
	if rule.shardMetadata == nil {
		return md
	}
	p := arch + "."
	var keep Metadata
	var absent []string
	for _, k := range rule.shardKeys {
		if v, ok := md.Get(p + k); ok {
			keep = append(keep, KV{KeyParentPrefix + k, v})
		} else {
			absent = append(absent, k)
		}
	}
	rule.shardMetadata(&md, p, r, n)
	var added []string // keys the parent lacks and the rewrite sets
	for _, k := range absent {
		if _, ok := md.Get(p + k); ok {
			added = append(added, k)
		}
	}
	if len(added) > 0 {
		keep = append(keep, KV{KeyParentAbsent, added})
	}
	return append(md, keep...)
}

// KeyParentAbsent lists the keys (after "<arch>.") a shard's architecture
// rewrite added that its parent lacks (parentMetadata removes them).
const KeyParentAbsent = KeyParentPrefix + "absent_keys"

// parentMetadata undoes rewriteShardMetadata on a shard's metadata: the
// parent's values back, after checking the shard's are what the rewrite
// makes of them (a forged parent value then fails the shard's proof).
func parentMetadata(md Metadata, arch string, r Range, n int) (Metadata, error) {
	rule := archRules[arch]
	if rule.shardMetadata == nil {
		return md, nil
	}
	p := arch + "."
	parent := md.Clone()
	for _, k := range rule.shardKeys {
		v, ok := md.Get(KeyParentPrefix + k)
		if !ok {
			continue
		}
		parent.Set(p+k, v)
	}
	if v, ok := md.Get(KeyParentAbsent); ok {
		added, _ := v.([]string)
		for _, k := range added {
			parent.Delete(p + k)
		}
	}
	again := parent.Clone()
	rule.shardMetadata(&again, p, r, n)
	for _, k := range rule.shardKeys {
		got, _ := md.Get(p + k)
		want, _ := again.Get(p + k)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			return nil, fmt.Errorf("%s%s is %v, the range %s of the parent's makes %v", p, k, got, r, want)
		}
	}
	return parent, nil
}

// LegalSplit returns k ranges covering a model of n layers (metadata md)
// that its architecture allows (CheckCut), each cut as near as it can be
// to EvenSplit(n, k)'s (the sum of the distances is smallest), or an
// ErrIllegalCut when no k shards are legal. k is clamped like EvenSplit's.
func LegalSplit(md Metadata, n, k int) ([]Range, error) {
	even := EvenSplit(n, k)
	legal := func(r Range) bool { return CheckCut(md, r, n) == nil }
	if !slices.ContainsFunc(even, func(r Range) bool { return !legal(r) }) {
		return even, nil
	}
	k = len(even)
	const inf = math.MaxInt
	// cost[i][b]: the least distance of the first i cuts with the i-th at
	// layer b, every shard before it legal; from[i][b] the cut before.
	cost, from := make([][]int, k+1), make([][]int, k+1)
	for i := range cost {
		cost[i], from[i] = make([]int, n+1), make([]int, n+1)
		for b := range cost[i] {
			cost[i][b] = inf
		}
	}
	cost[0][0] = 0
	for i := 1; i <= k; i++ {
		for b := i; b <= n; b++ {
			if i == k && b != n {
				continue
			}
			for a := i - 1; a < b; a++ {
				if cost[i-1][a] == inf || !legal(Range{Start: a, End: b}) {
					continue
				}
				if c := cost[i-1][a] + abs(b-even[i-1].End); c < cost[i][b] {
					cost[i][b], from[i][b] = c, a
				}
			}
		}
	}
	if cost[k][n] == inf {
		return nil, fmt.Errorf("%w: no %d shards of this model are legal (%s)", ErrIllegalCut, k, LegalCuts(md, n))
	}
	out := make([]Range, k)
	for i, b := k, n; i > 0; i-- {
		out[i-1] = Range{Start: from[i][b], End: b}
		b = from[i][b]
	}
	return out, nil
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}
