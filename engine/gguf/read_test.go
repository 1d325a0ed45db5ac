package gguf

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"testing"
)

// hb builds raw GGUF bytes by hand for malformed-input tests.
type hb struct{ b []byte }

func (h *hb) u32(v uint32) *hb  { h.b = binary.LittleEndian.AppendUint32(h.b, v); return h }
func (h *hb) u64(v uint64) *hb  { h.b = binary.LittleEndian.AppendUint64(h.b, v); return h }
func (h *hb) str(s string) *hb  { h.u64(uint64(len(s))); h.b = append(h.b, s...); return h }
func (h *hb) raw(b ...byte) *hb { h.b = append(h.b, b...); return h }

// header starts a v3 file with nT tensors and nKV pairs.
func header(nT, nKV uint64) *hb {
	h := &hb{}
	h.raw('G', 'G', 'U', 'F').u32(3).u64(nT).u64(nKV)
	return h
}

// tensor appends a tensor info.
func (h *hb) tensor(name string, typ uint32, off uint64, dims ...uint64) *hb {
	h.str(name).u32(uint32(len(dims)))
	for _, d := range dims {
		h.u64(d)
	}
	return h.u32(typ).u64(off)
}

// data pads to 32 and appends n zero bytes.
func (h *hb) data(n int) *hb {
	for len(h.b)%32 != 0 {
		h.b = append(h.b, 0)
	}
	h.b = append(h.b, make([]byte, n)...)
	return h
}

func readBytes(b []byte) (*File, error) { return Read(bytes.NewReader(b), int64(len(b))) }

func TestReadMalformed(t *testing.T) {
	okKV := func(h *hb) *hb { return h.str("general.architecture").u32(uint32(ValString)).str("llama") }
	cases := []struct {
		name string
		b    []byte
		want error
	}{
		{"empty", nil, ErrTruncated},
		{"short magic", []byte("GG"), ErrTruncated},
		{"bad magic", (&hb{}).raw('G', 'G', 'M', 'L').u32(3).u64(0).u64(0).b, ErrBadMagic},
		{"version 1", (&hb{}).raw('G', 'G', 'U', 'F').u32(1).u64(0).u64(0).b, ErrUnsupportedVersion},
		{"version 4", (&hb{}).raw('G', 'G', 'U', 'F').u32(4).u64(0).u64(0).b, ErrUnsupportedVersion},
		{"big-endian version", (&hb{}).raw('G', 'G', 'U', 'F').u32(3 << 24).u64(0).u64(0).b, ErrUnsupportedVersion},
		{"huge tensor count", header(1<<60, 0).b, ErrTooLarge},
		{"max tensor count", header(math.MaxUint64, 0).b, ErrTooLarge},
		{"huge kv count", header(0, 1<<62).b, ErrTooLarge},
		{"kv count beyond file", header(0, 1000).b, ErrTruncated},
		{"huge key length", header(0, 1).u64(1 << 62).raw(make([]byte, 16)...).b, ErrTooLarge},
		{"huge string value", header(0, 1).str("k").u32(uint32(ValString)).u64(math.MaxUint64).b, ErrTooLarge},
		{"huge array", header(0, 1).str("k").u32(uint32(ValArray)).u32(uint32(ValUint64)).u64(1 << 61).b, ErrTooLarge},
		{"max array", header(0, 1).str("k").u32(uint32(ValArray)).u32(uint32(ValUint64)).u64(math.MaxUint64).b, ErrTooLarge},
		{"huge string array", header(0, 1).str("k").u32(uint32(ValArray)).u32(uint32(ValString)).u64(1 << 59).b, ErrTooLarge},
		{"array beyond file", header(0, 1).str("k").u32(uint32(ValArray)).u32(uint32(ValUint32)).u64(100).u32(1).b, ErrTruncated},
		{"string in array beyond file", header(0, 1).str("k").u32(uint32(ValArray)).u32(uint32(ValString)).u64(2).str("a").u64(1 << 50).b, ErrTooLarge},
		{"empty key", header(0, 1).str("").u32(uint32(ValUint8)).raw(1).b, ErrInvalidMetadata},
		{"unknown value type", header(0, 1).str("k").u32(13).raw(1, 2, 3, 4).b, ErrInvalidMetadata},
		{"nested array", header(0, 1).str("k").u32(uint32(ValArray)).u32(uint32(ValArray)).u64(1).u32(0).b, ErrInvalidMetadata},
		{"bool 2", header(0, 1).str("k").u32(uint32(ValBool)).raw(2).b, ErrInvalidMetadata},
		{"duplicate key", okKV(okKV(header(0, 2))).b, ErrInvalidMetadata},
		{"alignment not pow2", header(0, 1).str(KeyAlignment).u32(uint32(ValUint32)).u32(24).b, ErrInvalidMetadata},
		{"alignment zero", header(0, 1).str(KeyAlignment).u32(uint32(ValUint32)).u32(0).b, ErrInvalidMetadata},
		{"alignment wrong type", header(0, 1).str(KeyAlignment).u32(uint32(ValUint64)).u64(32).b, ErrInvalidMetadata},
		{"unknown tensor type", header(1, 0).tensor("a", 4, 0, 32).data(32).b, ErrUnknownTensorType},
		{"unknown tensor type 200", header(1, 0).tensor("a", 200, 0, 32).data(32).b, ErrUnknownTensorType},
		{"5 dims", header(1, 0).tensor("a", 0, 0, 1, 1, 1, 1, 1).data(4).b, ErrInvalidTensor},
		{"negative dim", header(1, 0).tensor("a", 0, 0, 1<<63).data(4).b, ErrInvalidTensor},
		{"element overflow", header(1, 0).tensor("a", 0, 0, 1<<40, 1<<40).data(4).b, ErrInvalidTensor},
		{"empty tensor name", header(1, 0).tensor("", 0, 0, 1).data(4).b, ErrInvalidTensor},
		{"long tensor name", header(1, 0).tensor(string(make([]byte, 64)), 0, 0, 1).data(4).b, ErrInvalidTensor},
		{"q8_0 partial block", header(1, 0).tensor("a", uint32(TypeQ8_0), 0, 33).data(68).b, ErrInvalidTensor},
		{"duplicate tensor", header(2, 0).tensor("a", 0, 0, 8).tensor("a", 0, 32, 8).data(64).b, ErrInvalidTensor},
		{"misaligned offset", header(2, 0).tensor("a", 0, 0, 8).tensor("b", 0, 33, 8).data(96).b, ErrInvalidTensor},
		{"gap between tensors", header(2, 0).tensor("a", 0, 0, 8).tensor("b", 0, 64, 8).data(128).b, ErrInvalidTensor},
		{"overlapping tensors", header(2, 0).tensor("a", 0, 0, 16).tensor("b", 0, 32, 8).data(128).b, ErrInvalidTensor},
		{"first offset not 0", header(1, 0).tensor("a", 0, 32, 8).data(64).b, ErrInvalidTensor},
		{"huge offset", header(1, 0).tensor("a", 0, 1<<62, 8).data(64).b, ErrTooLarge},
		{"data beyond file", header(1, 0).tensor("a", 0, 0, 64).data(100).b, ErrTruncated},
		{"huge tensor beyond file", header(1, 0).tensor("a", 0, 0, 1<<30, 1<<20).data(100).b, ErrTruncated},
	}
	for _, tc := range cases {
		f, err := readBytes(tc.b)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: Read err = %v, want %v", tc.name, err, tc.want)
			continue
		}
		var fe *FormatError
		if f != nil || !errors.As(err, &fe) {
			t.Errorf("%s: want nil file and *FormatError, got %v %T", tc.name, f, err)
		}
	}
	// A well-formed minimal file parses.
	good := header(2, 1)
	okKV(good).tensor("a", 0, 0, 8).tensor("b", uint32(TypeQ8_0), 32, 32, 2).data(32 + 68)
	f, err := readBytes(good.b)
	if err != nil || len(f.Tensors) != 2 || f.Tensors[1].Bytes != 68 || f.Architecture() != "llama" {
		t.Fatalf("minimal file: %v %+v", err, f)
	}
}

func TestReadTruncatedEverywhere(t *testing.T) {
	s := tinySpec("qwen3moe")
	s.Layers, s.Embd, s.Heads, s.KVHeads, s.ExpertFF, s.Experts = 2, 16, 2, 1, 8, 4
	p := synthFile(t, s)
	raw, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	f := mustOpen(t, p)
	last := f.Tensors[len(f.Tensors)-1]
	end := f.DataOffset + int64(last.Offset+last.Bytes)
	step := 1
	for cut := 0; cut < len(raw); cut += step {
		if cut > int(f.DataOffset) {
			step = 61 // every header byte, then a sample of the data section
		}
		g, err := readBytes(raw[:cut])
		if int64(cut) >= end {
			if err != nil {
				t.Errorf("cut at %d (after the last tensor's data): %v", cut, err)
			}
			continue
		}
		if err == nil || g != nil || !(errors.Is(err, ErrTruncated) || errors.Is(err, ErrTooLarge)) {
			t.Fatalf("cut at %d of %d: got %v, want truncation error", cut, len(raw), err)
		}
	}
}

func TestReadCorruptedBytes(t *testing.T) {
	// Flipping any header byte must give an error or a valid parse, never a panic.
	p := synthFile(t, tinySpec("qwen2"))
	raw, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	f := mustOpen(t, p)
	for i := 0; i < int(f.DataOffset); i += 5 {
		for _, x := range []byte{0x01, 0x80, 0xff} {
			raw[i] ^= x
			g, err := readBytes(raw)
			raw[i] ^= x
			if err == nil && g == nil {
				t.Fatalf("byte %d: nil file without error", i)
			}
		}
	}
}

func TestValidateForLoad(t *testing.T) {
	moe := synthFile(t, tinySpec("qwen3moe"))
	llama := synthFile(t, tinySpec("llama"))
	cases := []struct {
		name   string
		src    string
		editMD func(*Metadata)
		editT  func(*File, []WriteTensor) []WriteTensor
		ok     bool
	}{
		{"moe ok", moe, nil, nil, true},
		{"llama ok", llama, nil, nil, true},
		{"unknown arch", llama, func(m *Metadata) { m.Set(KeyArchitecture, "gpt2") }, nil, false},
		{"no arch", llama, func(m *Metadata) { m.DeletePrefix(KeyArchitecture) }, nil, false},
		{"expert_used_count 0", moe, func(m *Metadata) { m.Set("qwen3moe.expert_used_count", uint32(0)) }, nil, false},
		{"expert_used_count > count", moe, func(m *Metadata) { m.Set("qwen3moe.expert_used_count", uint32(9)) }, nil, false},
		{"no expert_count", moe, func(m *Metadata) { m.DeletePrefix("qwen3moe.expert_count") }, nil, false},
		{"experts > 512", moe, func(m *Metadata) { m.Set("qwen3moe.expert_count", uint32(513)) }, nil, false},
		{"used without experts", llama, func(m *Metadata) { m.Set("llama.expert_used_count", uint32(2)) }, nil, false},
		{"block_count 0", llama, func(m *Metadata) { m.Set("llama.block_count", uint32(0)) }, nil, false},
		{"block_count too big", llama, func(m *Metadata) { m.Set("llama.block_count", uint32(600)) }, nil, false},
		{"block_count negative", llama, func(m *Metadata) { m.Set("llama.block_count", int32(-1)) }, nil, false},
		{"head_count 0", llama, func(m *Metadata) { m.Set("llama.attention.head_count", uint32(0)) }, nil, false},
		{"head_count array", llama, func(m *Metadata) { m.Set("llama.attention.head_count", []uint32{4, 4, 4, 4}) }, nil, false},
		{"kv heads not dividing", llama, func(m *Metadata) { m.Set("llama.attention.head_count_kv", uint32(3)) }, nil, false},
		{"kv heads 0", llama, func(m *Metadata) { m.Set("llama.attention.head_count_kv", uint32(0)) }, nil, false},
		{"key_length 0", moe, func(m *Metadata) { m.Set("qwen3moe.attention.key_length", uint32(0)) }, nil, false},
		{"bad rope scaling", llama, func(m *Metadata) { m.Set("llama.rope.scaling.type", "fancy") }, nil, false},
		{"scores length", llama, func(m *Metadata) { m.Set("tokenizer.ggml.scores", []float32{1}) }, nil, false},
		{"expert groups", moe, func(m *Metadata) { m.Set("qwen3moe.expert_group_count", uint32(2)) }, nil, false},
		{"missing layer tensor", llama, nil, func(f *File, ts []WriteTensor) []WriteTensor { return dropTensor(ts, "blk.3.ffn_down.weight") }, false},
		{"missing qk norm", moe, nil, func(f *File, ts []WriteTensor) []WriteTensor { return dropTensor(ts, "blk.1.attn_q_norm.weight") }, false},
		{"missing token_embd", llama, nil, func(f *File, ts []WriteTensor) []WriteTensor { return dropTensor(ts, "token_embd.weight") }, false},
		{"extra layer", llama, nil, func(f *File, ts []WriteTensor) []WriteTensor {
			return append(ts, WriteTensor{"blk.9.attn_norm.weight", TypeF32, []uint64{4}, bytes.NewReader(make([]byte, 16))})
		}, false},
	}
	dir := t.TempDir()
	for i, tc := range cases {
		p := filepath.Join(dir, string(rune('a'+i))+".gguf")
		rewriteWith(t, tc.src, p, tc.editMD, tc.editT)
		err := ValidateForLoad(mustOpen(t, p))
		if tc.ok != (err == nil) || (err != nil && !errors.Is(err, ErrNotLoadable)) {
			t.Errorf("%s: ValidateForLoad = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}

func dropTensor(ts []WriteTensor, name string) []WriteTensor {
	var out []WriteTensor
	for _, w := range ts {
		if w.Name != name {
			out = append(out, w)
		}
	}
	return out
}

func TestWriteRejects(t *testing.T) {
	ctx := context.Background()
	data := bytes.NewReader(make([]byte, 64))
	cases := map[string]struct {
		md Metadata
		ts []WriteTensor
	}{
		"duplicate key":    {Metadata{{"a", uint8(1)}, {"a", uint8(2)}}, nil},
		"bad value type":   {Metadata{{"a", 3}}, nil},
		"bad alignment":    {Metadata{{KeyAlignment, uint32(3)}}, nil},
		"duplicate tensor": {nil, []WriteTensor{{"a", TypeF32, []uint64{4}, data}, {"a", TypeF32, []uint64{4}, data}}},
		"unknown type":     {nil, []WriteTensor{{"a", TensorType(5), []uint64{4}, data}}},
		"short data":       {nil, []WriteTensor{{"a", TypeF32, []uint64{32}, data}}},
		"long name":        {nil, []WriteTensor{{string(make([]byte, 64)), TypeF32, []uint64{4}, data}}},
	}
	for name, tc := range cases {
		p := filepath.Join(t.TempDir(), "x.gguf")
		if err := WriteFile(ctx, p, tc.md, tc.ts, nil); err == nil {
			t.Errorf("%s: WriteFile succeeded", name)
		}
		if ents, _ := os.ReadDir(filepath.Dir(p)); len(ents) != 0 {
			t.Errorf("%s: WriteFile left %d files", name, len(ents))
		}
	}
	// Cancellation stops a write and leaves nothing behind.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	s := tinySpec("llama")
	p := filepath.Join(t.TempDir(), "c.gguf")
	if err := Synth(cctx, s, p); !errors.Is(err, context.Canceled) {
		t.Errorf("Synth with cancelled context = %v", err)
	}
	if ents, _ := os.ReadDir(filepath.Dir(p)); len(ents) != 0 {
		t.Errorf("cancelled Synth left %d files", len(ents))
	}
}

func FuzzRead(f *testing.F) {
	s := tinySpec("qwen3moe")
	s.Layers, s.Embd, s.Heads, s.KVHeads, s.ExpertFF, s.Experts, s.FF = 1, 8, 2, 1, 8, 2, 8
	var buf bytes.Buffer
	md, ts := synthLayout(&s, 4)
	md = append(md, KV{"tokenizer.ggml.model", "llama"}, KV{"tokenizer.ggml.tokens", []string{"<unk>", "<s>", "</s>", "a"}})
	var wts []WriteTensor
	for _, st := range ts {
		n, _ := TensorBytes(st.typ, st.shape)
		wts = append(wts, WriteTensor{st.name, st.typ, st.shape, newSynthData(1, st, int64(n))})
	}
	if err := Write(context.Background(), &buf, md, wts, nil); err != nil {
		f.Fatal(err)
	}
	full := buf.Bytes()
	f.Add(full[:min(len(full), 1024)])
	f.Add(full[:min(len(full), 4096)])
	f.Add(header(2, 1).str("general.architecture").u32(uint32(ValString)).str("llama").tensor("a", 0, 0, 8).tensor("b", uint32(TypeQ8_0), 32, 32, 2).data(100).b)
	f.Add(header(0, 1).str("k").u32(uint32(ValArray)).u32(uint32(ValString)).u64(2).str("a").str("b").b)
	f.Fuzz(func(t *testing.T, b []byte) {
		g, err := readBytes(b)
		if err != nil {
			var fe *FormatError
			if g != nil || !errors.As(err, &fe) {
				t.Fatalf("error %v (%T) with file %v", err, err, g)
			}
			return
		}
		// A parsed file is self-consistent: every tensor lies inside the file.
		for i := range g.Tensors {
			ti := &g.Tensors[i]
			if g.DataOffset+int64(ti.Offset+ti.Bytes) > int64(len(b)) {
				t.Fatalf("tensor %s beyond file", ti.Name)
			}
		}
		_, _ = g.Info()
		_ = ValidateForLoad(g)
	})
}

func BenchmarkFingerprint(b *testing.B) {
	s := DefaultSpec("llama")
	s.Embd, s.Heads, s.KVHeads, s.FF, s.Layers = 512, 8, 4, 1024, 8 // ~ 40 MB F32
	p := filepath.Join(b.TempDir(), "bench.gguf")
	if err := Synth(context.Background(), s, p); err != nil {
		b.Fatal(err)
	}
	f, err := Open(p)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	b.SetBytes(f.DataBytes())
	b.ResetTimer()
	for b.Loop() {
		if _, err := Fingerprint(context.Background(), f); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSynth(b *testing.B) {
	s := DefaultSpec("llama")
	s.Embd, s.Heads, s.KVHeads, s.FF, s.Layers = 512, 8, 4, 1024, 4
	p := filepath.Join(b.TempDir(), "bench.gguf")
	for b.Loop() {
		if err := Synth(context.Background(), s, p); err != nil {
			b.Fatal(err)
		}
	}
	st, _ := os.Stat(p)
	b.SetBytes(st.Size())
}
