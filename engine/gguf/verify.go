package gguf

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// Shard verification errors.
var (
	ErrNotShard            = errors.New("not a shard (no valid meshp2p.* metadata)")
	ErrFingerprintMismatch = errors.New("shard content does not prove the claimed fingerprint")
	ErrWrongModel          = errors.New("shard belongs to a different model")
	ErrWrongRange          = errors.New("shard holds a different layer range")
)

// ShardInfo is what a shard claims about itself (see VerifyShard for proof).
type ShardInfo struct {
	ParentFingerprint string `json:"parent_fingerprint"`
	ParentNLayer      int    `json:"parent_n_layer"`
	Range             Range  `json:"range"`
	Role              Role   `json:"role"`
}

// ReadShardInfo parses a shard's claims without checking them. It returns
// ErrNotShard when md has no shard metadata.
func ReadShardInfo(md Metadata) (*ShardInfo, error) {
	fp, ok := md.String(KeyParentFingerprint)
	if !ok {
		return nil, ErrNotShard
	}
	if _, err := ParseDigest(fp); err != nil {
		return nil, fmt.Errorf("%w: bad %s", ErrNotShard, KeyParentFingerprint)
	}
	n, ok1 := md.Uint(KeyParentNLayer)
	a, ok2 := md.Uint(KeyRangeStart)
	b, ok3 := md.Uint(KeyRangeEnd)
	if !ok1 || !ok2 || !ok3 || n == 0 || n > MaxLayers || a >= b || b > n {
		return nil, fmt.Errorf("%w: bad n_layer/range metadata", ErrNotShard)
	}
	r := Range{int(a), int(b)}
	return &ShardInfo{ParentFingerprint: fp, ParentNLayer: int(n), Range: r, Role: RoleOf(r, int(n))}, nil
}

// VerifyShard opens the shard at path and checks that it proves membership
// of its parent model: the stored proof material hashes to the stored parent
// fingerprint, and the hyper-parameters, tokenizer (head/tail), global
// tensors and every layer it holds hash to that material (with layer indices
// mapped back to the parent's, the tail's output-as-token_embd rule and the
// middle shard's exact 1-row stand-ins). Every tensor in the file must be
// accounted for. It streams the data once.
func VerifyShard(ctx context.Context, path string) (*ShardInfo, error) {
	f, err := Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	si, err := VerifyShardFile(ctx, f)
	if err != nil {
		return nil, fmt.Errorf("gguf: verify %s: %w", path, err)
	}
	return si, nil
}

// CheckShard verifies the shard at path (VerifyShard) and that it belongs to
// the model with fingerprint fp and holds exactly layers r.
func CheckShard(ctx context.Context, path, fp string, r Range) (*ShardInfo, error) {
	si, err := VerifyShard(ctx, path)
	if err != nil {
		return nil, err
	}
	if si.ParentFingerprint != strings.ToLower(fp) {
		return si, fmt.Errorf("gguf: %s: %w: it is from %s, want %s", path, ErrWrongModel, si.ParentFingerprint, fp)
	}
	if si.Range != r {
		return si, fmt.Errorf("gguf: %s: %w: it holds %v, want %v", path, ErrWrongRange, si.Range, r)
	}
	return si, nil
}

// VerifyShardFile is VerifyShard on an open file.
func VerifyShardFile(ctx context.Context, f *File) (*ShardInfo, error) {
	si, err := ReadShardInfo(f.Metadata)
	if err != nil {
		return nil, err
	}
	dg, err := digestsFromMetadata(f.Metadata)
	if err != nil {
		return nil, err
	}
	if err := verifyProof(si, dg); err != nil {
		return nil, err
	}
	if err := verifyShardMetadata(f, si, dg); err != nil {
		return nil, err
	}
	nEmbd, err := embdLength(f.Metadata)
	if err != nil {
		return nil, err
	}
	want, standIns, err := shardGlobals(ctx, si.Role, dg, nEmbd, archRules[f.Architecture()].outputRequired)
	if err != nil {
		return nil, err
	}
	layers, err := verifyShardTensors(ctx, f, si, dg, want, standIns)
	if err != nil {
		return nil, err
	}
	if err := verifyAccounted(want, standIns, layers, dg, si.Range); err != nil {
		return nil, err
	}
	return si, nil
}

// mismatch returns an ErrFingerprintMismatch error.
func mismatch(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrFingerprintMismatch}, args...)...)
}

// verifyProof checks the stored proof material: one digest per parent layer,
// hashing to the claimed parent fingerprint.
func verifyProof(si *ShardInfo, dg *Digests) error {
	if len(dg.Layers) != si.ParentNLayer {
		return mismatch("%d layer digests for %d layers", len(dg.Layers), si.ParentNLayer)
	}
	if dg.Fingerprint() != si.ParentFingerprint {
		return mismatch("stored digests hash to %s, not %s", dg.Fingerprint(), si.ParentFingerprint)
	}
	return nil
}

// verifyShardMetadata checks block_count against the range, the
// hyper-parameters against the parent's, and the tokenizer: absent (with
// vocab_size 1) in a middle shard, the parent's in the others.
func verifyShardMetadata(f *File, si *ShardInfo, dg *Digests) error {
	arch := f.Architecture()
	r := si.Range
	if got, err := f.NLayer(); err != nil || got != r.Len() {
		return mismatch("block_count %d for range %v", got, r)
	}
	parent, err := parentMetadata(f.Metadata, arch, r, si.ParentNLayer)
	if err != nil {
		return mismatch("%v", err)
	}
	h, err := hparamsDigest(parent)
	if err != nil {
		return err
	}
	if h != dg.HParams {
		return mismatch("hyper-parameters differ from the parent's")
	}
	if si.Role == RoleMiddle {
		return verifyNoTokenizer(f.Metadata, arch)
	}
	return verifyTokenizer(f.Metadata, arch, dg)
}

// verifyNoTokenizer checks a middle shard carries no tokenizer: no
// tokenizer.* key but tokenizer.ggml.model = "none", and vocab_size 1.
func verifyNoTokenizer(md Metadata, arch string) error {
	for _, kv := range md {
		if strings.HasPrefix(kv.Key, "tokenizer.") && kv.Key != "tokenizer.ggml.model" {
			return mismatch("middle shard has tokenizer key %q", kv.Key)
		}
	}
	if m, _ := md.String("tokenizer.ggml.model"); m != "none" {
		return mismatch("middle shard has tokenizer model %q, want \"none\"", m)
	}
	if v, _ := md.Uint(arch + ".vocab_size"); v != 1 {
		return mismatch("middle shard has vocab_size %d, want 1", v)
	}
	return nil
}

// verifyTokenizer checks a head, tail or whole shard carries the parent's
// tokenizer and a vocab_size, if any, equal to its token count.
func verifyTokenizer(md Metadata, arch string, dg *Digests) error {
	t, err := tokenizerDigest(md)
	if err != nil {
		return err
	}
	if t != dg.Tokenizer {
		return mismatch("tokenizer differs from the parent's")
	}
	if v, ok := md.Get(arch + ".vocab_size"); ok {
		nTok, hasTok := md.ArrayLen("tokenizer.ggml.tokens")
		if u, isU := asUint(v); !isU || !hasTok || u != uint64(nTok) {
			return mismatch("vocab_size %v does not match the tokenizer", v)
		}
	}
	return nil
}

// shardGlobals returns which global digests a shard of role must hold:
// want maps a shard tensor name to the parent tensor whose digest it must
// match (the tail's token_embd is the parent's output when it has one), and
// standIns the digests of a middle shard's exact 1-row stand-ins. With
// outputRequired (archRule), head and tail shards hold the parent's output
// too and a middle shard a 1-row stand-in of it.
func shardGlobals(ctx context.Context, role Role, dg *Digests, nEmbd uint64, outputRequired bool) (want map[string]string, standIns map[string]Digest, err error) {
	want = make(map[string]string) // shard tensor name -> parent tensor name
	for _, g := range dg.Globals {
		want[g.Name] = g.Name
	}
	_, parentHasOutput := dg.Global(output)
	standIns = map[string]Digest{}
	switch role {
	case RoleHead:
		if !outputRequired {
			delete(want, output)
		}
	case RoleMiddle:
		delete(want, output)
		delete(want, tokenEmbd)
		delete(want, outputNorm)
		names := []string{tokenEmbd, outputNorm}
		if outputRequired && parentHasOutput {
			names = append(names, output)
		}
		for _, name := range names {
			st := standIn(name, nEmbd)
			dh, err := hashData(ctx, st.Data, int64(4*nEmbd), make([]byte, 64<<10), nil)
			if err != nil {
				return nil, nil, err
			}
			standIns[name] = tensorDigest(name, st.Type, st.Shape, dh)
		}
	case RoleTail:
		if !outputRequired {
			delete(want, output)
		}
		if parentHasOutput {
			want[tokenEmbd] = output
		}
	}
	return want, standIns, nil
}

// verifyShardTensors streams every tensor of f once: each global tensor must
// match its entry in want (deleted once seen) or standIns (likewise), and
// every layer tensor is digested under its parent layer name; it returns
// those digests per shard layer.
func verifyShardTensors(ctx context.Context, f *File, si *ShardInfo, dg *Digests, want map[string]string, standIns map[string]Digest) ([][]Digest, error) {
	r := si.Range
	layers := make([][]Digest, r.Len())
	buf := make([]byte, copyChunk)
	for i := range f.Tensors {
		t := &f.Tensors[i]
		idx, rest, isLayer, err := splitLayerName(t.Name)
		if err != nil {
			return nil, mismatch("%v", err)
		}
		if isLayer && idx >= r.Len() {
			return nil, mismatch("tensor %q is beyond the shard's %d layers", t.Name, r.Len())
		}
		dh, err := hashData(ctx, f.TensorData(t), int64(t.Bytes), buf, nil)
		if err != nil {
			return nil, fmt.Errorf("hashing tensor %q: %w", t.Name, err)
		}
		if isLayer {
			layers[idx] = append(layers[idx], tensorDigest(layerName(r.Start+idx, rest), t.Type, t.Shape, dh))
			continue
		}
		if sd, ok := standIns[t.Name]; ok {
			if tensorDigest(t.Name, t.Type, t.Shape, dh) != sd {
				return nil, mismatch("stand-in %q is not the exact 1-row stand-in", t.Name)
			}
			delete(standIns, t.Name)
			continue
		}
		parentName, ok := want[t.Name]
		if !ok {
			return nil, mismatch("unexpected tensor %q in a %s shard", t.Name, si.Role)
		}
		pd, _ := dg.Global(parentName)
		if tensorDigest(parentName, t.Type, t.Shape, dh) != pd {
			return nil, mismatch("tensor %q differs from the parent's %q", t.Name, parentName)
		}
		delete(want, t.Name)
	}
	return layers, nil
}

// verifyAccounted checks nothing the shard must hold is missing: no global
// left in want or standIns, and every layer of r present and hashing to the
// parent's layer digest.
func verifyAccounted(want map[string]string, standIns map[string]Digest, layers [][]Digest, dg *Digests, r Range) error {
	for name := range want {
		return mismatch("tensor %q is missing", name)
	}
	for name := range standIns {
		return mismatch("stand-in %q is missing", name)
	}
	for j, l := range layers {
		if len(l) == 0 || layerDigest(l) != dg.Layers[r.Start+j] {
			return mismatch("layer %d (parent layer %d) differs", j, r.Start+j)
		}
	}
	return nil
}
