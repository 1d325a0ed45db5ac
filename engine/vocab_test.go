package engine

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/internal/testmodels"
)

// A vocabulary file (gguf.WriteVocab) from a whole model, a head or a tail
// shard loads vocab-only, proves its model (gguf.CheckVocab) and tokenizes
// exactly like the whole model.
func TestVocabFileTokenizesLikeModel(t *testing.T) {
	ctx := context.Background()
	path := testmodels.Path(t, "stories260K.gguf")
	dir := t.TempDir()
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	fp, err := gguf.Fingerprint(ctx, f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	whole, err := LoadModel(ctx, path, LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer whole.Close()
	shards, err := gguf.Split(ctx, path, gguf.EvenSplit(5, 3), filepath.Join(dir, "shards"), nil)
	if err != nil {
		t.Fatal(err)
	}
	texts := []string{"Once upon a time", "", "  Tom and   Lily\nwent to the park. 123 ünïcödé!", "<s> not special"}
	for _, src := range []struct{ name, path string }{{"whole", path}, {"head", shards[0].Path}, {"tail", shards[2].Path}} {
		t.Run(src.name, func(t *testing.T) {
			out := filepath.Join(dir, src.name+".vocab.gguf")
			if err := gguf.WriteVocab(ctx, src.path, out); err != nil {
				t.Fatal(err)
			}
			if err := gguf.CheckVocab(ctx, out, fp); err != nil {
				t.Fatalf("CheckVocab: %v", err)
			}
			v, err := LoadModel(ctx, out, LoadOptions{VocabOnly: true})
			if err != nil {
				t.Fatal(err)
			}
			defer v.Close()
			vi, wi := v.Info(), whole.Info()
			if !vi.HasVocab || vi.NVocab != wi.NVocab || vi.ParentFingerprint != fp || v.BOS() != whole.BOS() || v.EOS() != whole.EOS() {
				t.Fatalf("vocab info %+v (bos %d eos %d), whole %+v (bos %d eos %d)", vi, v.BOS(), v.EOS(), wi, whole.BOS(), whole.EOS())
			}
			for _, text := range texts {
				for _, special := range []bool{false, true} {
					a, err1 := v.Tokenize(text, special, special)
					b, err2 := whole.Tokenize(text, special, special)
					if err1 != nil || err2 != nil || len(a) != len(b) {
						t.Fatalf("Tokenize(%q): %v %v / %v %v", text, a, err1, b, err2)
					}
					for i := range a {
						if a[i] != b[i] {
							t.Fatalf("Tokenize(%q) = %v, whole model %v", text, a, b)
						}
					}
				}
			}
			for tok := int32(0); tok < int32(wi.NVocab); tok++ {
				a, err1 := v.TokenPiece(tok, true)
				b, err2 := whole.TokenPiece(tok, true)
				if a != b || err1 != nil || err2 != nil {
					t.Fatalf("TokenPiece(%d) = %q %v, whole %q %v", tok, a, err1, b, err2)
				}
			}
			// Not loadable with weights: it has none.
			if m, err := LoadModel(ctx, out, LoadOptions{}); err == nil {
				m.Close()
				t.Fatal("a vocabulary file loaded as a model")
			} else if !errors.Is(err, gguf.ErrNotLoadable) {
				t.Fatalf("full load of a vocab file: %v", err)
			}
		})
	}
	// Tampering with the tokenizer breaks the proof.
	good := filepath.Join(dir, "whole.vocab.gguf")
	bad := filepath.Join(dir, "tampered.vocab.gguf")
	rewriteGGUF(t, good, bad, func(md *gguf.Metadata) {
		v, _ := md.Get("tokenizer.ggml.tokens")
		toks := append([]string(nil), v.([]string)...)
		toks[100] = "tampered"
		md.Set("tokenizer.ggml.tokens", toks)
	})
	if err := gguf.CheckVocab(ctx, bad, fp); !errors.Is(err, gguf.ErrFingerprintMismatch) {
		t.Fatalf("tampered vocab: %v, want ErrFingerprintMismatch", err)
	}
	other := "00" + fp[2:]
	if other == fp {
		other = "11" + fp[2:]
	}
	if err := gguf.CheckVocab(ctx, good, other); !errors.Is(err, gguf.ErrWrongModel) {
		t.Fatalf("wrong model: %v, want ErrWrongModel", err)
	}
}
