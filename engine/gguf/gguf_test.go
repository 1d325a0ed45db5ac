package gguf

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/neuron-tai/meshp2p/internal/testmodels"
)

// modelsDir finds the shared test models or skips.
func modelsDir(t testing.TB) string {
	t.Helper()
	d, ok := testmodels.Dir()
	if !ok {
		t.Skipf("test models not found in %q (set MESHP2P_MODELS or provide ../shared/models next to the repository)", d)
	}
	return d
}

func stories(t testing.TB) string { return filepath.Join(modelsDir(t), "stories260K.gguf") }

// synthFile writes a synthetic model into a temp dir.
func synthFile(t testing.TB, s Spec) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), s.Arch+".gguf")
	if err := Synth(context.Background(), s, p); err != nil {
		t.Fatalf("Synth: %v", err)
	}
	return p
}

func tinySpec(arch string) Spec {
	s := DefaultSpec(arch)
	s.Embd, s.Heads, s.KVHeads, s.FF, s.Layers = 32, 4, 2, 64, 4
	switch arch {
	case "qwen3moe":
		s.ExpertFF = 16
	case "minimax-m2":
		s.RopeDim = 4
	case "gpt-oss":
		s.Layers, s.ExpertFF, s.HeadDim = 6, 16, 16 // 3 shards of 2 layers
	case "gemma3":
		s.Layers, s.HeadDim = 18, 16 // 3 shards of 6 layers
	case "llama4":
		s.Layers, s.ExpertFF = 12, 16 // 3 shards of 4 layers
	case "glm4moe":
		s.Layers, s.HeadDim, s.RopeDim, s.ExpertFF, s.DenseLead = 6, 16, 8, 16, 2
	case "deepseek2":
		s.KVHeads, s.ExpertFF, s.QLoraRank, s.KVLoraRank, s.RopeDim, s.NopeDim, s.VDim, s.Layers = 1, 16, 16, 16, 8, 8, 8, 6
	}
	return s
}

func fileSHA(t testing.TB, p string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

func mustOpen(t testing.TB, p string) *File {
	t.Helper()
	f, err := Open(p)
	if err != nil {
		t.Fatalf("Open(%s): %v", p, err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func TestTensorBytes(t *testing.T) {
	tests := []struct {
		typ     TensorType
		shape   []uint64
		want    uint64
		wantErr error
	}{
		{TypeF32, []uint64{64, 512}, 64 * 512 * 4, nil},
		{TypeF16, []uint64{3}, 6, nil},
		{TypeBF16, []uint64{8, 2}, 32, nil},
		{TypeQ4_0, []uint64{64, 2}, 4 * 18, nil},
		{TypeQ4_1, []uint64{32}, 20, nil},
		{TypeQ5_0, []uint64{32}, 22, nil},
		{TypeQ5_1, []uint64{32}, 24, nil},
		{TypeQ8_0, []uint64{128, 3}, 12 * 34, nil},
		{TypeQ2_K, []uint64{256}, 84, nil},
		{TypeQ3_K, []uint64{256}, 110, nil},
		{TypeQ4_K, []uint64{512, 2}, 4 * 144, nil},
		{TypeQ5_K, []uint64{256}, 176, nil},
		{TypeQ6_K, []uint64{256}, 210, nil},
		{TypeQ8_K, []uint64{256}, 292, nil},
		{TypeI8, []uint64{5}, 5, nil},
		{TypeI16, []uint64{5}, 10, nil},
		{TypeI32, []uint64{5}, 20, nil},
		{TypeIQ4_NL, []uint64{64}, 36, nil},
		{TypeF32, nil, 4, nil}, // scalar
		{TypeQ8_0, []uint64{100}, 0, ErrInvalidTensor},
		{TypeQ4_K, []uint64{128}, 0, ErrInvalidTensor},
		{TensorType(4), []uint64{32}, 0, ErrUnknownTensorType},
		{TensorType(99), []uint64{32}, 0, ErrUnknownTensorType},
		{TypeF32, []uint64{1 << 40, 1 << 40}, 0, ErrInvalidTensor},
		{TypeF32, []uint64{1, 1, 1, 1, 1}, 0, ErrInvalidTensor},
	}
	for _, tc := range tests {
		got, err := TensorBytes(tc.typ, tc.shape)
		if tc.wantErr != nil {
			if !errors.Is(err, tc.wantErr) {
				t.Errorf("TensorBytes(%v,%v) err = %v, want %v", tc.typ, tc.shape, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("TensorBytes(%v,%v) = %d, %v; want %d", tc.typ, tc.shape, got, err, tc.want)
		}
	}
	if typ, err := ParseTensorType("q4_k"); err != nil || typ != TypeQ4_K {
		t.Errorf("ParseTensorType(q4_k) = %v, %v", typ, err)
	}
}

// rewrite reads p and writes it again through Write, streaming from p.
func rewrite(t *testing.T, p, out string) {
	t.Helper()
	f := mustOpen(t, p)
	var ts []WriteTensor
	for i := range f.Tensors {
		ti := &f.Tensors[i]
		ts = append(ts, WriteTensor{ti.Name, ti.Type, ti.Shape, f.TensorData(ti)})
	}
	if err := WriteFile(context.Background(), out, f.Metadata, ts, nil); err != nil {
		t.Fatal(err)
	}
}

func TestRoundTrip(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{"synth-llama-f16": synthFile(t, func() Spec { s := tinySpec("llama"); s.Type = TypeF16; return s }())}
	if md, ok := testmodels.Dir(); ok {
		files["stories260K"] = filepath.Join(md, "stories260K.gguf")
		files["llama-2-tiny-random"] = filepath.Join(md, "llama-2-tiny-random.gguf")
		files["vocab-spm"] = filepath.Join(md, "ggml-vocab-llama-spm.gguf")
		files["vocab-gpt2"] = filepath.Join(md, "ggml-vocab-gpt-2.gguf")
	} else {
		t.Log("shared test models not found; round-tripping synthetic files only")
	}
	for name, p := range files {
		t.Run(name, func(t *testing.T) {
			out := filepath.Join(dir, name+".gguf")
			rewrite(t, p, out)
			a, b := mustOpen(t, p), mustOpen(t, out)
			if !reflect.DeepEqual(a.Metadata, b.Metadata) {
				t.Fatal("metadata differs after round trip")
			}
			if !reflect.DeepEqual(a.Tensors, b.Tensors) {
				t.Fatal("tensor infos differ after round trip")
			}
			// Our writer pads like llama.cpp's, so the files are byte-identical.
			if fileSHA(t, p) != fileSHA(t, out) {
				t.Errorf("round trip of %s is not byte-identical", name)
			}
		})
	}
}

func TestStoriesInfo(t *testing.T) {
	in, err := Inspect(context.Background(), stories(t), true)
	if err != nil {
		t.Fatal(err)
	}
	want := Info{Architecture: "llama", NLayer: 5, NEmbd: 64, NHead: 8, NHeadKV: 4, NFF: 172, VocabSize: 512, ContextLength: 2048, Tokenizer: "llama", TensorCount: 48}
	if in.Architecture != want.Architecture || in.NLayer != want.NLayer || in.NEmbd != want.NEmbd || in.NHead != want.NHead ||
		in.NHeadKV != want.NHeadKV || in.NFF != want.NFF || in.VocabSize != want.VocabSize || in.ContextLength != want.ContextLength ||
		in.Tokenizer != want.Tokenizer || in.TensorCount != want.TensorCount || in.TiedOutput {
		t.Errorf("Info = %+v", in)
	}
	if in.TensorTypes["F32"] != 48 || len(in.LayerBytes) != 5 || in.LayerBytes[0] == 0 || in.Params < 250000 || in.Params > 300000 {
		t.Errorf("Info types/bytes/params = %v %v %d", in.TensorTypes, in.LayerBytes, in.Params)
	}
	if len(in.Fingerprint) != 64 {
		t.Errorf("fingerprint %q", in.Fingerprint)
	}
	f := mustOpen(t, stories(t))
	if err := ValidateForLoad(f); err != nil {
		t.Errorf("ValidateForLoad(stories260K) = %v", err)
	}
}

func TestFingerprintStableAndSensitive(t *testing.T) {
	ctx := context.Background()
	p := synthFile(t, tinySpec("qwen2"))
	fp := func(p string) string {
		t.Helper()
		f := mustOpen(t, p)
		s, err := Fingerprint(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	base := fp(p)
	if again := fp(p); again != base {
		t.Fatalf("fingerprint not stable: %s vs %s", base, again)
	}
	// Same spec synthesized again: same bytes, same fingerprint.
	if other := fp(synthFile(t, tinySpec("qwen2"))); other != base {
		t.Errorf("same spec gave a different fingerprint")
	}
	f := mustOpen(t, p)
	raw, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	mutate := func(name string, edit func([]byte)) string {
		b := bytes.Clone(raw)
		edit(b)
		q := filepath.Join(t.TempDir(), name+".gguf")
		if err := os.WriteFile(q, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return fp(q)
	}
	ti, _ := f.Tensor("blk.2.attn_k.bias")
	lastT := f.Tensors[len(f.Tensors)-1]
	cases := []struct {
		name string
		edit func([]byte)
		same bool
	}{
		{"layer weight byte", func(b []byte) { b[f.DataOffset+int64(ti.Offset)+5] ^= 1 }, false},
		{"last global byte", func(b []byte) { b[f.DataOffset+int64(lastT.Offset)] ^= 0x80 }, false},
		{"rms eps", func(b []byte) { editMetaValue(t, b, "qwen2.attention.layer_norm_rms_epsilon", 0x01) }, false},
		{"general.name", func(b []byte) { editMetaValue(t, b, "general.name", 0x01) }, true},
		{"token score", func(b []byte) { editMetaValue(t, b, "tokenizer.ggml.scores", 0x01) }, false},
	}
	for _, tc := range cases {
		got := mutate(strings.ReplaceAll(tc.name, " ", "_"), tc.edit)
		if (got == base) != tc.same {
			t.Errorf("%s: fingerprint same=%v, want same=%v", tc.name, got == base, tc.same)
		}
	}
}

// editMetaValue flips bits in the first value byte after the key's encoding
// (for arrays: the first element byte).
func editMetaValue(t *testing.T, b []byte, key string, xor byte) {
	t.Helper()
	enc := binary.LittleEndian.AppendUint64(nil, uint64(len(key)))
	enc = append(enc, key...)
	i := bytes.Index(b, enc)
	if i < 0 {
		t.Fatalf("key %s not found", key)
	}
	i += len(enc)
	typ := ValueType(binary.LittleEndian.Uint32(b[i:]))
	i += 4
	switch typ {
	case ValArray:
		i += 12
	case ValString:
		i += 8
	}
	b[i] ^= xor
}

func TestSynthArchs(t *testing.T) {
	llamaMoE := tinySpec("llama")
	llamaMoE.Experts, llamaMoE.ExpertsUsed = 4, 2
	f16 := tinySpec("qwen3moe")
	f16.Type = TypeF16
	cases := map[string]Spec{
		"llama": tinySpec("llama"), "qwen2": tinySpec("qwen2"), "qwen3": tinySpec("qwen3"),
		"qwen3moe": tinySpec("qwen3moe"), "llama-experts": llamaMoE, "qwen3moe-f16": f16,
	}
	for name, s := range cases {
		t.Run(name, func(t *testing.T) {
			p := synthFile(t, s)
			f := mustOpen(t, p)
			if err := ValidateForLoad(f); err != nil {
				t.Fatalf("ValidateForLoad: %v", err)
			}
			in, err := f.Info()
			if err != nil {
				t.Fatal(err)
			}
			if in.Architecture != s.Arch || in.NLayer != s.Layers || in.NEmbd != s.Embd || in.NHead != s.Heads ||
				in.NHeadKV != s.KVHeads || in.NExpert != s.Experts || in.NExpertUsed != s.ExpertsUsed || in.VocabSize != 372 || in.TiedOutput != s.Tied {
				t.Errorf("Info = %+v for %+v", in, s)
			}
			headDim := uint64(s.Embd / s.Heads)
			expect := map[string][]uint64{
				"token_embd.weight":        {uint64(s.Embd), 372},
				"blk.0.attn_q.weight":      {uint64(s.Embd), uint64(s.Embd)},
				"blk.0.attn_k.weight":      {uint64(s.Embd), headDim * uint64(s.KVHeads)},
				"blk.3.attn_output.weight": {uint64(s.Embd), uint64(s.Embd)},
				"output_norm.weight":       {uint64(s.Embd)},
			}
			switch {
			case s.Arch == "qwen2":
				expect["blk.1.attn_v.bias"] = []uint64{headDim * uint64(s.KVHeads)}
			case s.Arch == "qwen3":
				expect["blk.1.attn_q_norm.weight"] = []uint64{headDim}
			case s.Arch == "qwen3moe":
				expect["blk.1.attn_k_norm.weight"] = []uint64{headDim}
				expect["blk.2.ffn_gate_inp.weight"] = []uint64{uint64(s.Embd), uint64(s.Experts)}
				expect["blk.2.ffn_down_exps.weight"] = []uint64{uint64(s.ExpertFF), uint64(s.Embd), uint64(s.Experts)}
			case s.Experts > 0:
				expect["blk.0.ffn_up_exps.weight"] = []uint64{uint64(s.Embd), uint64(s.FF), uint64(s.Experts)}
			default:
				expect["blk.0.ffn_down.weight"] = []uint64{uint64(s.FF), uint64(s.Embd)}
			}
			if s.Arch == "llama" {
				expect["rope_freqs.weight"] = []uint64{headDim / 2}
			}
			for name, shape := range expect {
				ti, ok := f.Tensor(name)
				if !ok || !reflect.DeepEqual(ti.Shape, shape) {
					t.Errorf("tensor %s: present=%v shape=%v want %v", name, ok, ti, shape)
				}
			}
			if ti, _ := f.Tensor("blk.0.attn_q.weight"); ti.Type != s.Type {
				t.Errorf("matrix type %v, want %v", ti.Type, s.Type)
			}
			if ti, _ := f.Tensor("blk.0.attn_norm.weight"); ti.Type != TypeF32 {
				t.Errorf("norm type %v, want F32", ti.Type)
			}
		})
	}
}

func TestSynthDeterministicAndValues(t *testing.T) {
	s := tinySpec("llama")
	a, b := synthFile(t, s), synthFile(t, s)
	if fileSHA(t, a) != fileSHA(t, b) {
		t.Fatal("same seed gave different files")
	}
	s.Seed = 2
	if fileSHA(t, synthFile(t, s)) == fileSHA(t, a) {
		t.Fatal("different seed gave the same file")
	}
	f := mustOpen(t, a)
	read := func(name string) []float32 {
		ti, _ := f.Tensor(name)
		raw, err := io.ReadAll(f.TensorData(ti))
		if err != nil {
			t.Fatal(err)
		}
		out := make([]float32, len(raw)/4)
		binary.Read(bytes.NewReader(raw), binary.LittleEndian, out)
		return out
	}
	for _, v := range read("output_norm.weight") {
		if v != 1 {
			t.Fatalf("norm value %v, want 1", v)
		}
	}
	w := read("blk.0.ffn_up.weight")
	var sum2 float64
	for _, v := range w {
		sum2 += float64(v) * float64(v)
	}
	if std := sum2 / float64(len(w)); std < 0.0002 || std > 0.0006 { // variance of N(0, 0.02²) = 0.0004
		t.Errorf("weight variance %v, want about 0.0004", std)
	}
	rf := read("rope_freqs.weight")
	if rf[0] != 1 || rf[len(rf)-1] != 4 {
		t.Errorf("rope_freqs %v, want 1..4", rf)
	}
}

func TestF32ToF16(t *testing.T) {
	cases := map[float32]uint16{0: 0, 1: 0x3c00, -2: 0xc000, 65504: 0x7bff, 1e6: 0x7c00, 0.5: 0x3800, 5.960464477539063e-08: 0x0001, 0.00006103515625: 0x0400, 1.0009765625: 0x3c01}
	for f, want := range cases {
		if got := f32ToF16(f); got != want {
			t.Errorf("f32ToF16(%v) = %#x, want %#x", f, got, want)
		}
	}
}

func TestSynthVocabFrom(t *testing.T) {
	s := tinySpec("qwen3")
	s.VocabFrom = filepath.Join(modelsDir(t), "ggml-vocab-llama-spm.gguf")
	f := mustOpen(t, synthFile(t, s))
	in, _ := f.Info()
	if in.VocabSize != 32000 || in.Tokenizer != "llama" {
		t.Errorf("vocab %d %q, want 32000 llama", in.VocabSize, in.Tokenizer)
	}
	if ti, _ := f.Tensor("token_embd.weight"); ti.Shape[1] != 32000 {
		t.Errorf("token_embd shape %v", ti.Shape)
	}
	if err := ValidateForLoad(f); err != nil {
		t.Error(err)
	}
}

func TestSynthValidate(t *testing.T) {
	mod := func(arch string, edit func(*Spec)) Spec { s := DefaultSpec(arch); edit(&s); return s }
	cases := map[string]Spec{
		"unknown arch":         mod("gpt2", func(*Spec) {}),
		"zero layers":          mod("llama", func(s *Spec) { s.Layers = 0 }),
		"too many layers":      mod("llama", func(s *Spec) { s.Layers = 513 }),
		"embd % heads":         mod("llama", func(s *Spec) { s.Heads = 3 }),
		"heads % kv":           mod("llama", func(s *Spec) { s.KVHeads = 3 }),
		"zero kv":              mod("llama", func(s *Spec) { s.KVHeads = 0 }),
		"odd head dim":         mod("llama", func(s *Spec) { s.Embd, s.Heads, s.KVHeads = 12, 4, 4 }),
		"moe used 0":           mod("qwen3moe", func(s *Spec) { s.ExpertsUsed = 0 }),
		"moe used > experts":   mod("qwen3moe", func(s *Spec) { s.ExpertsUsed = 9 }),
		"moe no experts":       mod("qwen3moe", func(s *Spec) { s.Experts, s.ExpertsUsed = 0, 0 }),
		"moe no expert ff":     mod("qwen3moe", func(s *Spec) { s.ExpertFF = 0 }),
		"qwen2 experts":        mod("qwen2", func(s *Spec) { s.Experts, s.ExpertsUsed = 4, 2 }),
		"llama used w/o exps":  mod("llama", func(s *Spec) { s.ExpertsUsed = 2 }),
		"quant type":           mod("llama", func(s *Spec) { s.Type = TypeQ8_0 }),
		"zero ff":              mod("llama", func(s *Spec) { s.FF = 0 }),
		"llama head dim":       mod("llama", func(s *Spec) { s.HeadDim = 64 }),
		"qwen3 window":         mod("qwen3", func(s *Spec) { s.SlidingWindow = 8 }),
		"gpt-oss no window":    mod("gpt-oss", func(s *Spec) { s.SlidingWindow = 0 }),
		"gpt-oss no experts":   mod("gpt-oss", func(s *Spec) { s.Experts, s.ExpertsUsed = 0, 0 }),
		"gpt-oss 1 layer":      mod("gpt-oss", func(s *Spec) { s.Layers = 1 }),
		"gemma3 all sliding":   mod("gemma3", func(s *Spec) { s.Layers = 5 }),
		"gemma3 odd head dim":  mod("gemma3", func(s *Spec) { s.HeadDim = 15 }),
		"gpt-oss odd head dim": mod("gpt-oss", func(s *Spec) { s.HeadDim = 15 }),
		"llama4 moe step 0":    mod("llama4", func(s *Spec) { s.MoEStep = 0 }),
		"llama4 3 layers":      mod("llama4", func(s *Spec) { s.Layers = 3 }),
		"llama4 head dim":      mod("llama4", func(s *Spec) { s.HeadDim = 64 }),
		"qwen3 moe step":       mod("qwen3", func(s *Spec) { s.MoEStep = 2 }),
	}
	for name, s := range cases {
		out := filepath.Join(t.TempDir(), "x.gguf")
		if err := Synth(context.Background(), s, out); !errors.Is(err, ErrBadSpec) {
			t.Errorf("%s: Synth err = %v, want ErrBadSpec", name, err)
		}
		if _, err := os.Stat(out); err == nil {
			t.Errorf("%s: output written despite bad spec", name)
		}
	}
	bad := DefaultSpec("llama")
	bad.VocabFrom = filepath.Join(t.TempDir(), "missing.gguf")
	if err := Synth(context.Background(), bad, filepath.Join(t.TempDir(), "x.gguf")); err == nil {
		t.Error("missing vocab file accepted")
	}
}
