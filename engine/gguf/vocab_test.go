package gguf

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
)

// rewriteMeta copies src to dst with edited metadata and the same tensors.
func rewriteMeta(t *testing.T, src, dst string, edit func(md *Metadata)) {
	t.Helper()
	f := mustOpen(t, src)
	defer f.Close()
	md := f.Metadata.Clone()
	edit(&md)
	ts := make([]WriteTensor, len(f.Tensors))
	for i := range f.Tensors {
		x := &f.Tensors[i]
		ts[i] = WriteTensor{Name: x.Name, Type: x.Type, Shape: x.Shape, Data: f.TensorData(x)}
	}
	if err := WriteFile(context.Background(), dst, md, ts, nil); err != nil {
		t.Fatal(err)
	}
}

func TestWriteAndCheckVocab(t *testing.T) {
	ctx := context.Background()
	src := synthFile(t, tinySpec("qwen2"))
	dir := t.TempDir()
	f := mustOpen(t, src)
	fp, err := Fingerprint(ctx, f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	res, err := Split(ctx, src, EvenSplit(4, 3), dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{src, res[0].Path, res[2].Path} {
		out := filepath.Join(dir, filepath.Base(p)+".vocab")
		if err := WriteVocab(ctx, p, out); err != nil {
			t.Fatalf("WriteVocab(%s): %v", p, err)
		}
		if err := CheckVocab(ctx, out, fp); err != nil {
			t.Fatalf("CheckVocab(%s): %v", out, err)
		}
		v := mustOpen(t, out)
		if len(v.Tensors) != 0 || ValidateVocabForLoad(v) != nil || !errors.Is(ValidateForLoad(v), ErrNotLoadable) {
			t.Errorf("%s: %d tensors, vocab check %v, full check %v", out, len(v.Tensors), ValidateVocabForLoad(v), ValidateForLoad(v))
		}
		if _, err := ReadShardInfo(v.Metadata); !errors.Is(err, ErrNotShard) {
			t.Errorf("a vocab file reads as a shard: %v", err)
		}
		v.Close()
		if _, err := Inspect(ctx, out, false); err != nil {
			t.Errorf("Inspect(vocab): %v", err)
		}
	}
	vocab := filepath.Join(dir, filepath.Base(src)+".vocab")
	if err := WriteVocab(ctx, res[1].Path, filepath.Join(dir, "mid.vocab")); err == nil {
		t.Error("WriteVocab from a middle shard succeeded")
	}
	if err := WriteVocab(ctx, vocab, filepath.Join(dir, "again.vocab")); err == nil {
		t.Error("WriteVocab from a vocab file succeeded")
	}
	if err := CheckVocab(ctx, res[0].Path, fp); !errors.Is(err, ErrNotVocab) {
		t.Errorf("CheckVocab(shard) = %v, want ErrNotVocab", err)
	}
	tamper := []struct {
		name string
		edit func(md *Metadata)
		want error
	}{
		{"token", func(md *Metadata) {
			v, _ := md.Get("tokenizer.ggml.tokens")
			toks := append([]string(nil), v.([]string)...)
			toks[5] = "xx"
			md.Set("tokenizer.ggml.tokens", toks)
		}, ErrFingerprintMismatch},
		{"bos id", func(md *Metadata) { md.Set("tokenizer.ggml.bos_token_id", uint32(2)) }, ErrFingerprintMismatch},
		{"hparam", func(md *Metadata) { md.Set("qwen2.rope.freq_base", float32(1)) }, ErrFingerprintMismatch},
		{"fingerprint", func(md *Metadata) { md.Set(KeyVocabFingerprint, "11"+fp[2:]) }, ErrFingerprintMismatch},
		{"layer digest", func(md *Metadata) {
			v, _ := md.Get(KeyParentLayers)
			l := append([]string(nil), v.([]string)...)
			l[0] = l[1]
			md.Set(KeyParentLayers, l)
		}, ErrFingerprintMismatch},
		{"no proof", func(md *Metadata) { md.DeletePrefix("meshp2p.") }, ErrNotVocab},
	}
	for _, c := range tamper {
		p := filepath.Join(dir, "t-"+c.name+".vocab")
		rewriteMeta(t, vocab, p, c.edit)
		if err := CheckVocab(ctx, p, fp); !errors.Is(err, c.want) {
			t.Errorf("tampered %s: %v, want %v", c.name, err, c.want)
		}
	}
}

func TestValidateTokenizer(t *testing.T) {
	base := builtinVocab()
	n, _ := base.ArrayLen("tokenizer.ggml.tokens")
	cases := []struct {
		name string
		edit func(md *Metadata)
		ok   bool
	}{
		{"builtin", func(md *Metadata) {}, true},
		{"none", func(md *Metadata) { md.DeletePrefix("tokenizer."); md.Set("tokenizer.ggml.model", "none") }, true},
		{"no model", func(md *Metadata) { md.DeletePrefix("tokenizer.ggml.model") }, false},
		{"no tokens", func(md *Metadata) { md.DeletePrefix("tokenizer.ggml.tokens") }, false},
		{"tokens not strings", func(md *Metadata) { md.Set("tokenizer.ggml.tokens", make([]int32, n)) }, false},
		{"short scores", func(md *Metadata) { md.Set("tokenizer.ggml.scores", make([]float32, n-1)) }, false},
		{"int token types wrong width", func(md *Metadata) { md.Set("tokenizer.ggml.token_type", make([]uint8, n)) }, false},
		{"duplicate empty", func(md *Metadata) {
			v, _ := md.Get("tokenizer.ggml.tokens")
			toks := append([]string(nil), v.([]string)...)
			toks[3], toks[4] = "", "[EMPTY_3]"
			md.Set("tokenizer.ggml.tokens", toks)
		}, false},
	}
	for _, c := range cases {
		md := base.Clone()
		c.edit(&md)
		if err := ValidateTokenizer(md); (err == nil) != c.ok || (err != nil && !errors.Is(err, ErrBadTokenizer)) {
			t.Errorf("%s: %v, want ok=%v", c.name, err, c.ok)
		}
	}
	if err := ValidateTokenizer(mustOpen(t, stories(t)).Metadata); err != nil {
		t.Errorf("stories260K: %v", err)
	}
}
