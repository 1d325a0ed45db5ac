package gguf

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// Vocabulary files for thin clients: all metadata of the model (tokenizer.*
// included, so chat templates and special tokens come along) and no tensors,
// plus the proof material a shard carries, so a client can check that the
// vocabulary belongs to the model it talks to without holding any weight.
//
// A vocabulary file stores the parent fingerprint under KeyVocabFingerprint,
// not KeyParentFingerprint, and no range: it is not a shard (ReadShardInfo
// says ErrNotShard), and <arch>.block_count is removed so that it can only
// be loaded vocab-only (ValidateForLoad refuses it).

// KeyVocabFingerprint holds the fingerprint of the model a vocabulary file
// was taken from; the meshp2p.parent.* digest keys prove it.
const KeyVocabFingerprint = "meshp2p.vocab.fingerprint"

// ErrNotVocab reports a file without vocabulary proof metadata.
var ErrNotVocab = errors.New("not a vocabulary file (no valid meshp2p.vocab metadata)")

// ErrBadTokenizer reports tokenizer metadata llama.cpp would reject or
// abort on.
var ErrBadTokenizer = errors.New("bad tokenizer metadata")

// ValidateTokenizer checks the tokenizer.* metadata before llama.cpp's
// vocabulary loader sees it: the tokenizer model is named, and unless it is
// "none"/"no_vocab" the token list is a non-empty string array without
// duplicates (llama.cpp asserts on duplicates, aborting the process), and
// scores (float32) and token types (int32) have one entry per token (the
// loader reads them unchecked).
func ValidateTokenizer(md Metadata) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrBadTokenizer}, args...)...)
	}
	model, ok := md.String("tokenizer.ggml.model")
	if !ok {
		return bad("tokenizer.ggml.model missing")
	}
	if model == "none" || model == "no_vocab" {
		return nil
	}
	v, ok := md.Get("tokenizer.ggml.tokens")
	if !ok {
		return bad("tokenizer.ggml.tokens missing (tokenizer %q)", model)
	}
	toks, ok := v.([]string)
	if !ok || len(toks) == 0 {
		return bad("tokenizer.ggml.tokens must be a non-empty string array")
	}
	if len(toks) > 1<<31-1 {
		return bad("%d tokens", len(toks))
	}
	seen := make(map[string]struct{}, len(toks))
	for i, s := range toks {
		if s == "" {
			s = fmt.Sprintf("[EMPTY_%d]", i) // what llama.cpp substitutes
		}
		if _, dup := seen[s]; dup {
			return bad("token %d %q is a duplicate", i, s)
		}
		seen[s] = struct{}{}
	}
	if v, ok := md.Get("tokenizer.ggml.scores"); ok {
		if s, isF := v.([]float32); !isF || len(s) != len(toks) {
			return bad("tokenizer.ggml.scores must be %d float32 values", len(toks))
		}
	}
	if v, ok := md.Get("tokenizer.ggml.token_type"); ok {
		if s, isI := v.([]int32); !isI || len(s) != len(toks) {
			return bad("tokenizer.ggml.token_type must be %d int32 values", len(toks))
		}
	}
	return nil
}

// ValidateVocabForLoad is the light check before a vocabulary-only load
// (which reads the architecture name and the tokenizer, no hyper-parameters
// and no tensors): the architecture is named and the tokenizer is present
// and sane.
func ValidateVocabForLoad(f *File) error {
	if f.Architecture() == "" {
		return fmt.Errorf("%w: general.architecture missing", ErrNotLoadable)
	}
	if m, _ := f.Metadata.String("tokenizer.ggml.model"); m == "none" || m == "no_vocab" {
		return fmt.Errorf("%w: the file has no vocabulary (tokenizer %q; a middle shard?)", ErrNotLoadable, m)
	}
	if err := ValidateTokenizer(f.Metadata); err != nil {
		return fmt.Errorf("%w: %w", ErrNotLoadable, err)
	}
	return nil
}

// WriteVocab writes a vocabulary-only GGUF to out (atomically) from src, a
// whole model or a head/tail shard. From a whole model it fingerprints the
// file (one streaming pass); from a shard it reuses the stored proof
// material after checking that it hashes to the claimed fingerprint and that
// the shard's tokenizer is the one the proof names (cheap: no tensor data is
// read). Middle shards have no vocabulary.
func WriteVocab(ctx context.Context, src, out string) error {
	f, err := Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := ValidateVocabForLoad(f); err != nil {
		return fmt.Errorf("gguf: vocab from %s: %w", src, err)
	}
	if f.Metadata.Index(KeyVocabFingerprint) >= 0 {
		return fmt.Errorf("gguf: vocab from %s: it is a vocabulary file already", src)
	}
	var dg *Digests
	arch := f.Architecture()
	srcMD := f.Metadata // the model's metadata (a shard's, with what its architecture rewrote undone)
	if f.Metadata.Index(KeyParentFingerprint) >= 0 {
		si, err := ReadShardInfo(f.Metadata)
		if err != nil {
			return fmt.Errorf("gguf: vocab from %s: %w", src, err)
		}
		if si.Role == RoleMiddle {
			return fmt.Errorf("gguf: vocab from %s: a middle shard has no vocabulary", src)
		}
		if dg, err = digestsFromMetadata(f.Metadata); err != nil {
			return fmt.Errorf("gguf: vocab from %s: %w", src, err)
		}
		if srcMD, err = parentMetadata(f.Metadata, arch, si.Range, si.ParentNLayer); err != nil {
			return fmt.Errorf("gguf: vocab from %s: %w: %v", src, ErrFingerprintMismatch, err)
		}
		if err := checkVocabProof(srcMD, dg, si.ParentFingerprint); err != nil {
			return fmt.Errorf("gguf: vocab from %s: %w", src, err)
		}
	} else if dg, err = ComputeDigests(ctx, f, nil); err != nil {
		return fmt.Errorf("gguf: vocab from %s: %w", src, err)
	}
	var md Metadata
	for _, kv := range srcMD {
		if strings.HasPrefix(kv.Key, "meshp2p.") || kv.Key == arch+".block_count" {
			continue
		}
		md = append(md, kv)
	}
	proof := dg.shardMetadata(Range{0, len(dg.Layers)})
	for _, kv := range proof {
		switch kv.Key {
		case KeyParentFingerprint:
			md = append(md, KV{KeyVocabFingerprint, kv.Value})
		case KeyRangeStart, KeyRangeEnd:
		default:
			md = append(md, kv)
		}
	}
	return WriteFile(ctx, out, md, nil, nil)
}

// checkVocabProof checks that the digests hash to fp and that md's
// hyper-parameters and tokenizer are the ones the digests name.
func checkVocabProof(md Metadata, dg *Digests, fp string) error {
	if got := dg.Fingerprint(); got != fp {
		return fmt.Errorf("%w: stored digests hash to %s, not %s", ErrFingerprintMismatch, got, fp)
	}
	t, err := tokenizerDigest(md)
	if err != nil {
		return err
	}
	if t != dg.Tokenizer {
		return fmt.Errorf("%w: tokenizer differs from the model's", ErrFingerprintMismatch)
	}
	h, err := hparamsDigest(md)
	if err != nil {
		return err
	}
	if h != dg.HParams {
		return fmt.Errorf("%w: hyper-parameters differ from the model's", ErrFingerprintMismatch)
	}
	return nil
}

// ReadVocabFingerprint returns the model fingerprint a vocabulary file
// claims (ErrNotVocab when md has none). CheckVocab proves it.
func ReadVocabFingerprint(md Metadata) (string, error) {
	fp, ok := md.String(KeyVocabFingerprint)
	if !ok {
		return "", ErrNotVocab
	}
	if _, err := ParseDigest(fp); err != nil {
		return "", fmt.Errorf("%w: bad %s", ErrNotVocab, KeyVocabFingerprint)
	}
	return fp, nil
}

// CheckVocab checks that the vocabulary file at path belongs to the model
// with fingerprint fp: the stored digests hash to the stored fingerprint,
// the tokenizer.* keys (and hyper-parameters) in the file hash to the stored
// digests (ErrFingerprintMismatch otherwise), the file holds no tensors, and
// the fingerprint is fp (ErrWrongModel).
func CheckVocab(ctx context.Context, path, fp string) error {
	_, err := CheckVocabLayers(ctx, path, fp)
	return err
}

// CheckVocabLayers is CheckVocab that also returns the model's layer
// count as the verified digests give it (one per-layer digest each, and
// the digests hash to fp): the layer count fp binds, never a peer's claim.
func CheckVocabLayers(ctx context.Context, path, fp string) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	f, err := Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	claimed, err := ReadVocabFingerprint(f.Metadata)
	if err != nil {
		return 0, fmt.Errorf("gguf: %s: %w", path, err)
	}
	dg, err := digestsFromMetadata(f.Metadata)
	if err != nil {
		return 0, fmt.Errorf("gguf: %s: %w", path, err)
	}
	if len(f.Tensors) != 0 {
		return 0, fmt.Errorf("gguf: %s: %w: a vocabulary file holds %d tensors", path, ErrFingerprintMismatch, len(f.Tensors))
	}
	if err := checkVocabProof(f.Metadata, dg, claimed); err != nil {
		return 0, fmt.Errorf("gguf: %s: %w", path, err)
	}
	if err := ValidateVocabForLoad(f); err != nil {
		return 0, fmt.Errorf("gguf: %s: %w", path, err)
	}
	if claimed != strings.ToLower(fp) {
		return 0, fmt.Errorf("gguf: %s: %w: it is from %s, want %s", path, ErrWrongModel, claimed, fp)
	}
	return len(dg.Layers), nil
}
