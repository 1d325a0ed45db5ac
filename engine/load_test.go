package engine

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/neuron-tai/meshp2p/engine/gguf"
)

// rewriteGGUF copies src to dst with its metadata changed by edit (tensors
// unchanged), using the gguf writer.
func rewriteGGUF(t *testing.T, src, dst string, edit func(md *gguf.Metadata)) {
	t.Helper()
	f, err := gguf.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	md := f.Metadata.Clone()
	edit(&md)
	ts := make([]gguf.WriteTensor, len(f.Tensors))
	for i := range f.Tensors {
		x := &f.Tensors[i]
		ts[i] = gguf.WriteTensor{Name: x.Name, Type: x.Type, Shape: x.Shape, Data: f.TensorData(x)}
	}
	if err := gguf.WriteFile(context.Background(), dst, md, ts, nil); err != nil {
		t.Fatal(err)
	}
}

func synthTiny(t *testing.T, dir, arch string) string {
	t.Helper()
	p := filepath.Join(dir, arch+".gguf")
	s := gguf.DefaultSpec(arch)
	s.Layers, s.Embd, s.FF = 3, 64, 128
	if arch == "qwen3moe" {
		s.ExpertFF = 32
	}
	if err := gguf.Synth(context.Background(), s, p); err != nil {
		t.Fatal(err)
	}
	return p
}

// Bad files must give a clear, wrapped error from the pure-Go checks, never
// reach llama.cpp (whose GGML_ASSERTs abort the process). The test process
// surviving every case, and loading a good model afterwards, is the proof.
func TestLoadModelRejectsBadFiles(t *testing.T) {
	dir := t.TempDir()
	good := synthTiny(t, dir, "llama")
	moe := synthTiny(t, dir, "qwen3moe")
	raw, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	badMagic := append([]byte("GGUX"), raw[4:]...)
	rewrite := func(name, src string, edit func(md *gguf.Metadata)) string {
		p := filepath.Join(dir, name)
		rewriteGGUF(t, src, p, edit)
		return p
	}
	shards, err := gguf.Split(context.Background(), good, gguf.EvenSplit(3, 3), filepath.Join(dir, "split"), nil)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name      string
		path      string
		vocabOnly bool
		want      error // errors.Is target; nil = any error
	}{
		{"truncated header", write("trunc-header.gguf", raw[:100]), false, gguf.ErrTruncated},
		{"truncated data", write("trunc-data.gguf", raw[:len(raw)/2]), false, gguf.ErrTruncated},
		{"truncated, vocab-only", write("trunc-vocab.gguf", raw[:len(raw)/2]), true, gguf.ErrTruncated},
		{"corrupt magic", write("magic.gguf", badMagic), false, gguf.ErrBadMagic},
		{"corrupt magic, vocab-only", write("magic2.gguf", badMagic), true, gguf.ErrBadMagic},
		{"empty file", write("empty.gguf", nil), false, nil},
		{"unknown architecture", rewrite("arch.gguf", good, func(md *gguf.Metadata) { md.Set(gguf.KeyArchitecture, "gpt-j-9000") }), false, gguf.ErrNotLoadable},
		{"qwen3moe expert_used_count 0", rewrite("moe0.gguf", moe, func(md *gguf.Metadata) { md.Set("qwen3moe.expert_used_count", uint32(0)) }), false, gguf.ErrNotLoadable},
		{"qwen3moe expert_used_count > expert_count", rewrite("moe9.gguf", moe, func(md *gguf.Metadata) { md.Set("qwen3moe.expert_used_count", uint32(9)) }), false, gguf.ErrNotLoadable},
		{"block_count 0", rewrite("blk0.gguf", good, func(md *gguf.Metadata) { md.Set("llama.block_count", uint32(0)) }), false, gguf.ErrNotLoadable},
		{"duplicate token", rewrite("dup.gguf", good, func(md *gguf.Metadata) {
			v, _ := md.Get("tokenizer.ggml.tokens")
			toks := append([]string(nil), v.([]string)...)
			toks[300] = toks[301]
			md.Set("tokenizer.ggml.tokens", toks)
		}), false, gguf.ErrBadTokenizer},
		{"duplicate token, vocab-only", filepath.Join(dir, "dup.gguf"), true, gguf.ErrBadTokenizer},
		{"scores of the wrong type", rewrite("scores.gguf", good, func(md *gguf.Metadata) {
			md.Set("tokenizer.ggml.scores", make([]uint8, 372))
		}), true, gguf.ErrBadTokenizer},
		{"no tokenizer, vocab-only", rewrite("notok.gguf", good, func(md *gguf.Metadata) { md.DeletePrefix("tokenizer.") }), true, gguf.ErrNotLoadable},
		{"middle shard, vocab-only", shards[1].Path, true, gguf.ErrNotLoadable},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, err := LoadModel(context.Background(), c.path, LoadOptions{VocabOnly: c.vocabOnly})
			if err == nil {
				m.Close()
				t.Fatalf("LoadModel(%s) succeeded", c.name)
			}
			if c.want != nil && !errors.Is(err, c.want) {
				t.Fatalf("err = %v, want %v", err, c.want)
			}
			t.Logf("%v", err)
		})
	}
	// The caller's hook runs after the engine's own checks.
	hookErr := errors.New("not the model I asked for")
	if _, err := LoadModel(context.Background(), good, LoadOptions{Validate: func(context.Context, string) error { return hookErr }}); !errors.Is(err, hookErr) {
		t.Fatalf("Validate hook: %v", err)
	}
	// Still alive: the good files load.
	for _, p := range []string{good, moe, shards[0].Path, shards[1].Path, shards[2].Path} {
		m, err := LoadModel(context.Background(), p, LoadOptions{})
		if err != nil {
			t.Fatalf("good file %s: %v", p, err)
		}
		m.Close()
	}
}
