package gguf

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// TruncateName is the file Truncate writes for src cut to its first k
// layers: <base>.first<k>.gguf.
func TruncateName(src string, k int) string {
	base := strings.TrimSuffix(filepath.Base(src), ".gguf")
	return fmt.Sprintf("%s.first%d.gguf", base, k)
}

// Truncate writes to path a standalone model made of src's first k layers
// and every global tensor (token embedding, output norm, output): the same
// model cut short. Its vocabulary is src's (VocabDigest is equal), which is
// what a draft model for speculative decoding needs (a self-draft); it is
// not a shard of src and has a fingerprint of its own. 1 ≤ k < src's
// layers; src must be a whole model.
func Truncate(ctx context.Context, src string, k int, path string) (SplitResult, error) {
	f, err := Open(src)
	if err != nil {
		return SplitResult{}, err
	}
	defer f.Close()
	if _, ok := f.Metadata.Get(KeyParentFingerprint); ok {
		return SplitResult{}, fmt.Errorf("gguf: truncate %s: %w; truncate the whole model instead", src, ErrIsShard)
	}
	n, err := f.NLayer()
	if err != nil {
		return SplitResult{}, err
	}
	if k < 1 || k >= n {
		return SplitResult{}, fmt.Errorf("%w: keep %d of %d layers (want 1 to %d)", ErrBadRange, k, n, n-1)
	}
	arch := f.Architecture()
	if arch == "" {
		return SplitResult{}, fmt.Errorf("gguf: %w: no %s", ErrInvalidMetadata, KeyArchitecture)
	}
	nEmbd, err := embdLength(f.Metadata)
	if err != nil {
		return SplitResult{}, err
	}
	// A standalone model of k layers: what the architecture keys on the
	// layer count must hold for k (deepseek2: not 26 or 27 layers), and
	// what it keys on the layer index is rewritten as for a shard.
	if err := CheckCut(f.Metadata, Range{0, k}, n); err != nil {
		return SplitResult{}, fmt.Errorf("gguf: truncate %s: %w", src, err)
	}
	md := f.Metadata.Clone()
	md.DeletePrefix("meshp2p.")
	md.Set(arch+".block_count", uint32(k))
	if rw := archRules[arch].shardMetadata; rw != nil {
		rw(&md, arch+".", Range{0, k}, n)
	}
	p := shardPlan{f: f, r: Range{0, k}, n: n, role: RoleWhole, nEmbd: nEmbd}
	ts, err := p.tensors()
	if err != nil {
		return SplitResult{}, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return SplitResult{}, err
	}
	if err := WriteFile(ctx, path, md, ts, nil); err != nil {
		return SplitResult{}, fmt.Errorf("gguf: truncate %s: %w", src, err)
	}
	st, err := os.Stat(path)
	if err != nil {
		return SplitResult{}, err
	}
	out, err := Open(path)
	if err != nil {
		return SplitResult{}, err
	}
	defer out.Close()
	fp, err := Fingerprint(ctx, out)
	if err != nil {
		return SplitResult{}, err
	}
	return SplitResult{Path: path, Range: Range{0, k}, Role: RoleWhole, Size: st.Size(), Fingerprint: fp}, nil
}

// VocabDigest identifies a file's vocabulary: the tokenizer digest its
// model's fingerprint is made of (a shard's, middle ones included, from its
// proof material). Two files tokenize alike exactly when their digests are
// equal. A file without a tokenizer has none.
func VocabDigest(f *File) (Digest, error) {
	if s, ok := f.Metadata.String(KeyParentTokenizer); ok {
		return ParseDigest(s)
	}
	if m, _ := f.Metadata.String("tokenizer.ggml.model"); m == "" || m == "none" {
		return Digest{}, fmt.Errorf("gguf: %w: no vocabulary", ErrInvalidMetadata)
	}
	return tokenizerDigest(f.Metadata)
}
