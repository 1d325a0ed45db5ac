package gguf

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// Info summarises a model or shard for `meshp2p shard inspect` and for
// capability adverts. Its JSON form is stable (fixed field order, sorted
// map keys).
type Info struct {
	Architecture  string         `json:"architecture"`
	Name          string         `json:"name,omitempty"`
	FileSize      int64          `json:"file_size"`
	NLayer        int            `json:"n_layer"`
	NEmbd         int            `json:"n_embd"`
	NHead         int            `json:"n_head"`
	NHeadKV       int            `json:"n_head_kv"`
	NFF           int            `json:"n_ff"`
	NExpert       int            `json:"n_expert"`
	NExpertUsed   int            `json:"n_expert_used"`
	NFFExpert     int            `json:"n_ff_expert,omitempty"`
	VocabSize     int            `json:"vocab_size"`
	ContextLength int            `json:"context_length"`
	Tokenizer     string         `json:"tokenizer"` // tokenizer.ggml.model
	TiedOutput    bool           `json:"tied_output"`
	TensorCount   int            `json:"tensor_count"`
	TensorTypes   map[string]int `json:"tensor_types"`
	LayerBytes    []int64        `json:"layer_bytes"`  // data bytes of each layer
	GlobalBytes   int64          `json:"global_bytes"` // data bytes outside layers
	Params        uint64         `json:"params"`
	// Fingerprint is the model fingerprint (whole models only, when computed).
	Fingerprint string `json:"fingerprint,omitempty"`
	// Shard is the shard's claim (shards only; VerifyShard proves it).
	Shard *ShardInfo `json:"shard,omitempty"`
	// Certified: meshp2p splits the architecture exactly; Support says
	// so or why not; Cuts the layer ranges a shard may take ("" any).
	Certified bool   `json:"certified"`
	Support   string `json:"support"`
	Cuts      string `json:"cuts,omitempty"`
}

func mdInt(md Metadata, key string) int {
	v, ok := md.Uint(key)
	if !ok || v > 1<<31 {
		return 0
	}
	return int(v)
}

// Info computes the static summary of f (no tensor data is read).
func (f *File) Info() (*Info, error) {
	arch := f.Architecture()
	md := f.Metadata
	n, err := f.NLayer()
	if err != nil {
		return nil, err
	}
	in := &Info{
		Architecture:  arch,
		FileSize:      f.Size,
		NLayer:        n,
		NEmbd:         mdInt(md, arch+".embedding_length"),
		NHead:         mdInt(md, arch+".attention.head_count"),
		NHeadKV:       mdInt(md, arch+".attention.head_count_kv"),
		NFF:           mdInt(md, arch+".feed_forward_length"),
		NExpert:       mdInt(md, arch+".expert_count"),
		NExpertUsed:   mdInt(md, arch+".expert_used_count"),
		NFFExpert:     mdInt(md, arch+".expert_feed_forward_length"),
		ContextLength: mdInt(md, arch+".context_length"),
		TensorCount:   len(f.Tensors),
		TensorTypes:   map[string]int{},
		LayerBytes:    make([]int64, n),
	}
	in.Name, _ = md.String("general.name")
	in.Tokenizer, _ = md.String("tokenizer.ggml.model")
	if in.NHeadKV == 0 {
		in.NHeadKV = in.NHead
	}
	switch {
	case mdInt(md, arch+".vocab_size") > 0:
		in.VocabSize = mdInt(md, arch+".vocab_size")
	default:
		if l, ok := md.ArrayLen("tokenizer.ggml.tokens"); ok {
			in.VocabSize = l
		} else if t, ok := f.Tensor(tokenEmbd); ok && len(t.Shape) == 2 {
			in.VocabSize = int(t.Shape[1])
		}
	}
	_, hasOutput := f.Tensor(output)
	in.TiedOutput = !hasOutput
	for i := range f.Tensors {
		t := &f.Tensors[i]
		in.TensorTypes[t.Type.String()]++
		in.Params += t.Elements()
		idx, _, isLayer, err := splitLayerName(t.Name)
		if err != nil {
			return nil, err
		}
		if isLayer && idx < n {
			in.LayerBytes[idx] += int64(t.Bytes)
		} else {
			in.GlobalBytes += int64(t.Bytes)
		}
	}
	in.Certified, in.Support = Certification(arch)
	in.Cuts = LegalCuts(md, n)
	if si, err := ReadShardInfo(md); err == nil {
		in.Shard = si
	} else if !errors.Is(err, ErrNotShard) || md.Index(KeyParentFingerprint) >= 0 {
		return nil, err
	}
	return in, nil
}

// Inspect opens path and returns its Info; with fingerprint set it also
// streams the file to compute the model fingerprint (whole models only).
func Inspect(ctx context.Context, path string, fingerprint bool) (*Info, error) {
	f, err := Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	in, err := f.Info()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if fingerprint && in.Shard == nil {
		if in.Fingerprint, err = Fingerprint(ctx, f); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	return in, nil
}

// ErrNotLoadable reports a file the engine must not hand to llama.cpp
// (unknown architecture, or metadata that would make llama.cpp abort the
// process or divide by zero).
var ErrNotLoadable = errors.New("model cannot be loaded")

// Architectures the engine supports (range execution verified for these).

// MaxExperts is llama.cpp's LLAMA_MAX_EXPERTS.
const MaxExperts = 512

// ValidateForLoad checks f before the engine passes it to llama.cpp, whose
// loader asserts (aborting the process) on some bad metadata: known
// architecture, 0 < block_count <= 512, sane head counts, expert counts
// (expert_used_count in 1..expert_count when experts > 0, both 0
// otherwise), alignment type, rope scaling type, tokenizer arrays of equal
// length, and the tensors the architecture needs in every layer. Last, an
// architecture meshp2p has rules for but refuses (qwen3next) is refused
// with its measured reason: an error wrapping ErrNotLoadable and
// ErrRefusedArch, after every other check, so that the engine's tests can
// load it to measure it (and nothing else does).
func ValidateForLoad(f *File) error {
	c := &loadCheck{md: f.Metadata, arch: f.Architecture()}
	if _, ok := archRules[c.arch]; !ok {
		if why, ok := notSplittable[c.arch]; ok {
			return c.bad("unsupported architecture %q: %s", c.arch, why)
		}
		return c.bad("unsupported architecture %q (supported: %s; docs/architectures.md)", c.arch, strings.Join(Architectures(), ", "))
	}
	c.p = c.arch + "."
	nLayer, nEmbd, err := c.checkDims()
	if err != nil {
		return err
	}
	if load := archRules[c.arch].load; load != nil {
		if err := load(c.md, c.p, int(nLayer)); err != nil {
			return c.bad("%v", err)
		}
	}
	if _, err := c.checkExperts(); err != nil {
		return err
	}
	if err := c.checkRopeAndAlignment(); err != nil {
		return err
	}
	if err := c.checkTokenizer(); err != nil {
		return err
	}
	if err := c.checkTensors(f, nLayer, nEmbd); err != nil {
		return err
	}
	if why := archRules[c.arch].refused; why != "" {
		return fmt.Errorf("%w: %w: unsupported architecture %q: %s", ErrNotLoadable, ErrRefusedArch, c.arch, why)
	}
	return nil
}

// loadCheck is the state ValidateForLoad's steps share: the metadata, the
// architecture and its key prefix.
type loadCheck struct {
	md   Metadata
	arch string
	p    string // arch + "."
}

// bad returns an ErrNotLoadable error.
func (c *loadCheck) bad(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrNotLoadable}, args...)...)
}

// count reads the count <arch>.key: present reports whether the key exists;
// a present value that is not an unsigned integer <= 1<<31 is an error.
func (c *loadCheck) count(key string) (v uint64, present bool, err error) {
	x, present := c.md.Get(c.p + key)
	if !present {
		return 0, false, nil
	}
	v, ok := asUint(x)
	if !ok || v > 1<<31 {
		return 0, true, c.bad("%s%s = %v is not a valid count (per-layer arrays are not supported)", c.p, key, x)
	}
	return v, true, nil
}

// checkDims checks block_count, embedding_length, context_length, the head
// counts and the per-head lengths; it returns block_count and
// embedding_length.
func (c *loadCheck) checkDims() (nLayer, nEmbd uint64, err error) {
	nLayer, ok, err := c.count("block_count")
	if err != nil {
		return 0, 0, err
	}
	if !ok || nLayer == 0 || nLayer > MaxLayers {
		return 0, 0, c.bad("block_count %d must be in 1..%d", nLayer, MaxLayers)
	}
	nEmbd, _, err = c.count("embedding_length")
	if err != nil {
		return 0, 0, err
	}
	if nEmbd == 0 {
		return 0, 0, c.bad("embedding_length missing or 0")
	}
	if n, _, err := c.count("context_length"); err != nil || n == 0 {
		return 0, 0, c.bad("context_length missing or 0")
	}
	nHead, _, err := c.count("attention.head_count")
	if err != nil {
		return 0, 0, err
	}
	if nHead == 0 {
		return 0, 0, c.bad("attention.head_count missing or 0")
	}
	nKV, hasKV, err := c.count("attention.head_count_kv")
	if err != nil {
		return 0, 0, err
	}
	if hasKV && (nKV == 0 || nKV > nHead || nHead%nKV != 0) {
		return 0, 0, c.bad("attention.head_count_kv %d must divide head_count %d", nKV, nHead)
	}
	if _, hasKeyLen := c.md.Get(c.p + "attention.key_length"); !hasKeyLen && nEmbd%nHead != 0 {
		return 0, 0, c.bad("embedding_length %d not divisible by head_count %d", nEmbd, nHead)
	}
	for _, k := range []string{"attention.key_length", "attention.value_length", "rope.dimension_count"} {
		if v, present, err := c.count(k); err != nil {
			return 0, 0, err
		} else if present && v == 0 {
			return 0, 0, c.bad("%s%s is 0", c.p, k)
		}
	}
	return nLayer, nEmbd, nil
}

// checkExperts checks expert_count and expert_used_count (and that expert
// groups are absent); it returns expert_count.
func (c *loadCheck) checkExperts() (nExp uint64, err error) {
	nExp, _, err = c.count("expert_count")
	if err != nil {
		return 0, err
	}
	nUsed, _, err := c.count("expert_used_count")
	if err != nil {
		return 0, err
	}
	if nExp > MaxExperts {
		return 0, c.bad("expert_count %d > %d", nExp, MaxExperts)
	}
	if nExp > 0 && (nUsed == 0 || nUsed > nExp) {
		return 0, c.bad("expert_used_count %d must be in 1..expert_count %d", nUsed, nExp)
	}
	if nExp == 0 && nUsed != 0 {
		return 0, c.bad("expert_used_count %d without experts", nUsed)
	}
	if (c.arch == "qwen3moe" || c.arch == "deepseek2" || c.arch == "minimax-m2" || c.arch == "gpt-oss" || c.arch == "llama4" || c.arch == "glm4moe") && nExp == 0 {
		return 0, c.bad("%s needs expert_count > 0", c.arch)
	}
	return nExp, c.checkExpertGroups(nExp)
}

// checkExpertGroups checks expert_group_count and expert_group_used_count
// as llama.cpp's loader asserts them (DeepSeek-V3 routes to the top 4 of
// 8 groups of experts first).
func (c *loadCheck) checkExpertGroups(nExp uint64) error {
	groups, _, err := c.count("expert_group_count")
	if err != nil {
		return err
	}
	used, _, err := c.count("expert_group_used_count")
	if err != nil {
		return err
	}
	switch {
	case nExp == 0 && groups != 0:
		return c.bad("expert_group_count %d without experts", groups)
	case nExp > 0 && groups >= nExp:
		return c.bad("expert_group_count %d must be under expert_count %d", groups, nExp)
	case groups > 1 && (nExp%groups != 0 || used == 0 || used >= groups):
		return c.bad("expert groups: %d experts in %d groups, %d used: want experts divisible by groups and 0 < used < groups", nExp, groups, used)
	}
	return nil
}

// checkRopeAndAlignment checks rope.scaling.type is one llama.cpp knows and
// general.alignment is a uint32.
func (c *loadCheck) checkRopeAndAlignment() error {
	if v, ok := c.md.Get(c.p + "rope.scaling.type"); ok {
		s, _ := v.(string)
		switch s {
		case "none", "linear", "yarn", "longrope":
		default:
			return c.bad("unknown rope.scaling.type %v", v)
		}
	}
	if v, ok := c.md.Get(KeyAlignment); ok {
		if _, isU32 := v.(uint32); !isU32 {
			return c.bad("%s must be uint32", KeyAlignment)
		}
	}
	return nil
}

// checkTokenizer checks the per-token arrays match tokenizer.ggml.tokens in
// length and that a tokenizer model other than "none" has tokens.
func (c *loadCheck) checkTokenizer() error {
	nTok, hasTok := c.md.ArrayLen("tokenizer.ggml.tokens")
	for _, k := range []string{"tokenizer.ggml.scores", "tokenizer.ggml.token_type"} {
		if l, ok := c.md.ArrayLen(k); ok && (!hasTok || l != nTok) {
			return c.bad("%s has %d entries for %d tokens", k, l, nTok)
		}
	}
	model, _ := c.md.String("tokenizer.ggml.model")
	if model != "none" && !hasTok {
		return c.bad("tokenizer.ggml.model %q without tokenizer.ggml.tokens", model)
	}
	return nil
}

// checkTensors checks f has the global tensors and every layer's tensors
// (the architecture's rule), token_embd's shape, and no layer beyond
// block_count.
func (c *loadCheck) checkTensors(f *File, nLayer, nEmbd uint64) error {
	need := []string{tokenEmbd, outputNorm}
	rule := archRules[c.arch]
	if rule.outputRequired {
		need = append(need, output)
	}
	for i := 0; i < int(nLayer); i++ {
		for _, s := range rule.layer(c.md, c.p, i) {
			need = append(need, layerName(i, s))
		}
	}
	for _, name := range need {
		if _, ok := f.Tensor(name); !ok {
			return c.bad("tensor %q missing", name)
		}
	}
	if t, _ := f.Tensor(tokenEmbd); len(t.Shape) != 2 || t.Shape[0] != nEmbd {
		return c.bad("%s shape %v, want {%d, n_vocab}", tokenEmbd, t.Shape, nEmbd)
	}
	for i := range f.Tensors {
		if idx, _, isLayer, err := splitLayerName(f.Tensors[i].Name); err != nil {
			return c.bad("%v", err)
		} else if isLayer && idx >= int(nLayer) {
			return c.bad("tensor %q beyond block_count %d", f.Tensors[i].Name, nLayer)
		}
	}
	return nil
}
