package gguf

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func tensorBytes(t *testing.T, f *File, name string) []byte {
	t.Helper()
	ti, ok := f.Tensor(name)
	if !ok {
		t.Fatalf("tensor %s missing", name)
	}
	b, err := io.ReadAll(f.TensorData(ti))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// checkShardRules checks the head/middle/tail rules of one shard against its source.
func checkShardRules(t *testing.T, src *File, res SplitResult, n int) {
	t.Helper()
	sh := mustOpen(t, res.Path)
	r := res.Range
	arch := src.Architecture()
	if got, _ := sh.NLayer(); got != r.Len() {
		t.Errorf("%v: block_count %d", r, got)
	}
	if want := ShardName(src.closer.(*os.File).Name(), r); filepath.Base(res.Path) != want {
		t.Errorf("shard name %s, want %s", filepath.Base(res.Path), want)
	}
	si, err := ReadShardInfo(sh.Metadata)
	if err != nil || si.Range != r || si.ParentNLayer != n || si.ParentFingerprint != res.Fingerprint || si.Role != RoleOf(r, n) {
		t.Errorf("%v: shard info %+v, %v", r, si, err)
	}
	// Layers: renumbered, byte-identical, nothing else.
	var layerTensors int
	for i := range sh.Tensors {
		idx, rest, isLayer, _ := splitLayerName(sh.Tensors[i].Name)
		if !isLayer {
			continue
		}
		layerTensors++
		if !bytes.Equal(tensorBytes(t, sh, sh.Tensors[i].Name), tensorBytes(t, src, layerName(r.Start+idx, rest))) {
			t.Errorf("%v: %s differs from source layer %d", r, sh.Tensors[i].Name, r.Start+idx)
		}
	}
	var srcLayerTensors int
	for i := range src.Tensors {
		if idx, _, isLayer, _ := splitLayerName(src.Tensors[i].Name); isLayer && idx >= r.Start && idx < r.End {
			srcLayerTensors++
		}
	}
	if layerTensors != srcLayerTensors {
		t.Errorf("%v: %d layer tensors, want %d", r, layerTensors, srcLayerTensors)
	}
	_, srcHasOutput := src.Tensor(output)
	_, hasOutput := sh.Tensor(output)
	// An architecture without a tied fallback keeps output everywhere: the
	// parent's in head and tail shards, a 1-row stand-in in a middle one.
	keepsOutput := archRules[arch].outputRequired && srcHasOutput
	tok, _ := sh.Metadata.String("tokenizer.ggml.model")
	switch si.Role {
	case RoleHead, RoleWhole:
		if !bytes.Equal(tensorBytes(t, sh, tokenEmbd), tensorBytes(t, src, tokenEmbd)) {
			t.Errorf("%v: head token_embd differs", r)
		}
		if hasOutput != (si.Role == RoleWhole && srcHasOutput || keepsOutput) {
			t.Errorf("%v: output.weight present=%v", r, hasOutput)
		}
	case RoleMiddle:
		te, _ := sh.Tensor(tokenEmbd)
		on, _ := sh.Tensor(outputNorm)
		nEmbd, _ := src.Metadata.Uint(arch + ".embedding_length")
		if te == nil || te.Type != TypeF32 || !reflect.DeepEqual(te.Shape, []uint64{nEmbd, 1}) || on == nil || on.Type != TypeF32 || !reflect.DeepEqual(on.Shape, []uint64{nEmbd}) {
			t.Errorf("%v: stand-ins %+v %+v", r, te, on)
		}
		if !bytes.Equal(tensorBytes(t, sh, tokenEmbd), make([]byte, 4*nEmbd)) {
			t.Errorf("%v: token_embd stand-in not zeros", r)
		}
		if !bytes.Equal(tensorBytes(t, sh, outputNorm), bytes.Repeat([]byte{0, 0, 0x80, 0x3f}, int(nEmbd))) {
			t.Errorf("%v: output_norm stand-in not ones", r)
		}
		if hasOutput != keepsOutput || tok != "none" {
			t.Errorf("%v: middle output=%v tokenizer=%q", r, hasOutput, tok)
		}
		for _, kv := range sh.Metadata {
			if strings.HasPrefix(kv.Key, "tokenizer.") && kv.Key != "tokenizer.ggml.model" {
				t.Errorf("%v: middle keeps %s", r, kv.Key)
			}
		}
		if v, _ := sh.Metadata.Get(arch + ".vocab_size"); v != uint32(1) {
			t.Errorf("%v: vocab_size %#v, want uint32 1", r, v)
		}
	case RoleTail:
		want := tokenEmbd
		if srcHasOutput {
			want = output
		}
		if !bytes.Equal(tensorBytes(t, sh, tokenEmbd), tensorBytes(t, src, want)) {
			t.Errorf("%v: tail token_embd is not the source %s", r, want)
		}
		if hasOutput != keepsOutput {
			t.Errorf("%v: tail output.weight present=%v", r, hasOutput)
		}
	}
	if si.Role != RoleMiddle {
		if tok == "none" || sh.Metadata.Index("tokenizer.ggml.tokens") < 0 {
			t.Errorf("%v: %s lost the tokenizer", r, si.Role)
		}
		if !bytes.Equal(tensorBytes(t, sh, outputNorm), tensorBytes(t, src, outputNorm)) {
			t.Errorf("%v: output_norm differs", r)
		}
	}
	// Globals such as rope_freqs are always copied.
	for i := range src.Tensors {
		name := src.Tensors[i].Name
		if _, _, isLayer, _ := splitLayerName(name); !isLayer && name != tokenEmbd && name != outputNorm && name != output {
			if !bytes.Equal(tensorBytes(t, sh, name), tensorBytes(t, src, name)) {
				t.Errorf("%v: global %s differs", r, name)
			}
		}
	}
	if err := ValidateForLoad(sh); err != nil {
		t.Errorf("%v: ValidateForLoad: %v", r, err)
	}
	got, err := VerifyShard(context.Background(), res.Path)
	if err != nil {
		t.Fatalf("%v: VerifyShard: %v", r, err)
	}
	if *got != *si {
		t.Errorf("VerifyShard = %+v, want %+v", got, si)
	}
	if _, err := CheckShard(context.Background(), res.Path, res.Fingerprint, r); err != nil {
		t.Errorf("%v: CheckShard: %v", r, err)
	}
}

func splitAndCheck(t *testing.T, src string, ranges []Range) []SplitResult {
	t.Helper()
	ctx := context.Background()
	f := mustOpen(t, src)
	n, _ := f.NLayer()
	fp, err := Fingerprint(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	var calls int
	var last, total int64
	res, err := Split(ctx, src, ranges, t.TempDir(), func(d, tt int64) {
		if d < last || d > tt {
			t.Fatalf("progress %d/%d after %d", d, tt, last)
		}
		calls, last, total = calls+1, d, tt
	})
	if err != nil {
		t.Fatalf("Split(%v): %v", ranges, err)
	}
	if calls == 0 || last != total {
		t.Errorf("progress: %d calls, ended at %d/%d", calls, last, total)
	}
	if len(res) != len(ranges) {
		t.Fatalf("%d results for %d ranges", len(res), len(ranges))
	}
	for i, r := range res {
		if r.Range != ranges[i] || r.Fingerprint != fp {
			t.Errorf("result %+v, want range %v fp %s", r, ranges[i], fp)
		}
		checkShardRules(t, f, r, n)
	}
	return res
}

func TestSplitStories(t *testing.T) {
	src := stories(t)
	for _, ranges := range [][]Range{EvenSplit(5, 2), EvenSplit(5, 3), {{0, 5}}, {{1, 2}}, {{0, 1}, {4, 5}}} {
		t.Run(rangesString(ranges), func(t *testing.T) {
			res := splitAndCheck(t, src, ranges)
			if ranges[0] == (Range{0, 5}) {
				sh := mustOpen(t, res[0].Path)
				if _, ok := sh.Tensor(output); !ok {
					t.Error("whole shard dropped output.weight")
				}
			}
		})
	}
}

func rangesString(rs []Range) string {
	var s []string
	for _, r := range rs {
		s = append(s, r.String())
	}
	return strings.Join(s, ",")
}

func TestSplitSynth(t *testing.T) {
	moe := tinySpec("llama")
	moe.Experts, moe.ExpertsUsed = 4, 2
	for name, s := range map[string]Spec{"qwen3-tied": tinySpec("qwen3"), "qwen3moe": tinySpec("qwen3moe"), "qwen2": tinySpec("qwen2"), "llama-experts": moe,
		"deepseek2": tinySpec("deepseek2"), "minimax-m2": tinySpec("minimax-m2"), "mistral3": tinySpec("mistral3"),
		"gpt-oss": tinySpec("gpt-oss"), "gemma3": tinySpec("gemma3"), "llama4": tinySpec("llama4"), "glm4moe": tinySpec("glm4moe")} {
		t.Run(name, func(t *testing.T) {
			p := synthFile(t, s)
			f := mustOpen(t, p)
			ranges, err := LegalSplit(f.Metadata, s.Layers, 3)
			if err != nil {
				t.Fatal(err)
			}
			splitAndCheck(t, p, ranges)
		})
	}
}

// rewriteWith copies src to out with edited metadata and tensors.
func rewriteWith(t *testing.T, src, out string, editMD func(*Metadata), editTensors func(*File, []WriteTensor) []WriteTensor) {
	t.Helper()
	f := mustOpen(t, src)
	md := f.Metadata.Clone()
	if editMD != nil {
		editMD(&md)
	}
	var ts []WriteTensor
	for i := range f.Tensors {
		ti := &f.Tensors[i]
		ts = append(ts, WriteTensor{ti.Name, ti.Type, ti.Shape, f.TensorData(ti)})
	}
	if editTensors != nil {
		ts = editTensors(f, ts)
	}
	if err := WriteFile(context.Background(), out, md, ts, nil); err != nil {
		t.Fatal(err)
	}
}

func TestVerifyRejects(t *testing.T) {
	ctx := context.Background()
	sA := tinySpec("llama")
	sB := sA
	sB.Seed = 7
	a, b := synthFile(t, sA), synthFile(t, sB)
	ra := splitAndCheck(t, a, EvenSplit(4, 3))
	rb, err := Split(ctx, b, EvenSplit(4, 3), t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	fpA, fpB := ra[0].Fingerprint, rb[0].Fingerprint
	if fpA == fpB {
		t.Fatal("different weights, same fingerprint")
	}
	mid, midB := ra[1], rb[1] // [2,3)? EvenSplit(4,3) = 0-2, 2-3, 3-4
	tail := ra[2]
	dir := t.TempDir()
	out := func(name string) string { return filepath.Join(dir, name+".gguf") }

	// Wrong model / wrong range with intact shards.
	if _, err := CheckShard(ctx, mid.Path, fpB, mid.Range); !errors.Is(err, ErrWrongModel) {
		t.Errorf("shard of A checked against B: %v, want ErrWrongModel", err)
	}
	if _, err := CheckShard(ctx, mid.Path, fpA, Range{1, 3}); !errors.Is(err, ErrWrongRange) {
		t.Errorf("wrong range: %v, want ErrWrongRange", err)
	}
	if _, err := VerifyShard(ctx, a); !errors.Is(err, ErrNotShard) {
		t.Errorf("VerifyShard(whole model) = %v, want ErrNotShard", err)
	}
	if _, err := Split(ctx, mid.Path, []Range{{0, 1}}, dir, nil); !errors.Is(err, ErrIsShard) {
		t.Errorf("Split(shard) = %v, want ErrIsShard", err)
	}

	flipIn := func(name string) func(*File, []WriteTensor) []WriteTensor {
		return func(f *File, ts []WriteTensor) []WriteTensor {
			for i := range ts {
				if ts[i].Name == name {
					ti, _ := f.Tensor(name)
					buf, _ := io.ReadAll(f.TensorData(ti))
					buf[len(buf)/2] ^= 1
					ts[i].Data = bytes.NewReader(buf)
				}
			}
			return ts
		}
	}
	cases := []struct {
		name    string
		src     string
		editMD  func(*Metadata)
		editT   func(*File, []WriteTensor) []WriteTensor
		wantErr error
	}{
		{"layer weight byte", mid.Path, nil, flipIn("blk.0.ffn_up.weight"), ErrFingerprintMismatch},
		{"stand-in byte", mid.Path, nil, flipIn("output_norm.weight"), ErrFingerprintMismatch},
		{"tail output byte", tail.Path, nil, flipIn("token_embd.weight"), ErrFingerprintMismatch},
		{"global rope_freqs byte", tail.Path, nil, flipIn("rope_freqs.weight"), ErrFingerprintMismatch},
		{"claims B's fingerprint", mid.Path, func(m *Metadata) { m.Set(KeyParentFingerprint, fpB) }, nil, ErrFingerprintMismatch},
		{"carries B's proof material", mid.Path, func(m *Metadata) {
			fb := mustOpen(t, midB.Path)
			for _, kv := range fb.Metadata {
				if strings.HasPrefix(kv.Key, "meshp2p.") {
					m.Set(kv.Key, kv.Value)
				}
			}
		}, nil, ErrFingerprintMismatch},
		{"changed hparam", mid.Path, func(m *Metadata) { m.Set("llama.rope.freq_base", float32(5000)) }, nil, ErrFingerprintMismatch},
		{"changed tokenizer", tail.Path, func(m *Metadata) { m.Set("tokenizer.ggml.bos_token_id", uint32(2)) }, nil, ErrFingerprintMismatch},
		{"middle with tokenizer", mid.Path, func(m *Metadata) { m.Set("tokenizer.ggml.tokens", []string{"a"}) }, nil, ErrFingerprintMismatch},
		{"claims another range", mid.Path, func(m *Metadata) { m.Set(KeyRangeStart, uint32(1)); m.Set(KeyRangeEnd, uint32(2)) }, nil, ErrFingerprintMismatch},
		{"wrong block_count", mid.Path, func(m *Metadata) { m.Set("llama.block_count", uint32(2)) }, nil, ErrFingerprintMismatch},
		{"no proof material", mid.Path, func(m *Metadata) { m.DeletePrefix("meshp2p.parent.layer") }, nil, ErrNotShard},
		{"extra tensor", mid.Path, nil, func(f *File, ts []WriteTensor) []WriteTensor {
			return append(ts, WriteTensor{"extra.weight", TypeF32, []uint64{4}, bytes.NewReader(make([]byte, 16))})
		}, ErrFingerprintMismatch},
		{"missing layer tensor", mid.Path, nil, func(f *File, ts []WriteTensor) []WriteTensor {
			var out []WriteTensor
			for _, w := range ts {
				if w.Name != "blk.0.attn_k.weight" {
					out = append(out, w)
				}
			}
			return out
		}, ErrFingerprintMismatch},
		{"missing global", tail.Path, nil, func(f *File, ts []WriteTensor) []WriteTensor {
			var out []WriteTensor
			for _, w := range ts {
				if w.Name != "rope_freqs.weight" {
					out = append(out, w)
				}
			}
			return out
		}, ErrFingerprintMismatch},
		{"layers swapped", ra[0].Path, nil, func(f *File, ts []WriteTensor) []WriteTensor {
			for i := range ts {
				if strings.HasPrefix(ts[i].Name, "blk.0.") {
					ts[i].Name = "blk.1." + strings.TrimPrefix(ts[i].Name, "blk.0.")
				} else if strings.HasPrefix(ts[i].Name, "blk.1.") {
					ts[i].Name = "blk.0." + strings.TrimPrefix(ts[i].Name, "blk.1.")
				}
			}
			return ts
		}, ErrFingerprintMismatch},
	}
	for _, tc := range cases {
		p := out(strings.ReplaceAll(tc.name, " ", "_"))
		rewriteWith(t, tc.src, p, tc.editMD, tc.editT)
		if _, err := VerifyShard(ctx, p); !errors.Is(err, tc.wantErr) {
			t.Errorf("%s: VerifyShard = %v, want %v", tc.name, err, tc.wantErr)
		}
	}
}

func TestSplitBadRanges(t *testing.T) {
	src := synthFile(t, tinySpec("llama")) // 4 layers
	cases := map[string][]Range{
		"overlap":       {{0, 2}, {1, 3}},
		"beyond":        {{2, 5}},
		"empty":         {{2, 2}},
		"reversed":      {{3, 1}},
		"negative":      {{-1, 2}},
		"none":          nil,
		"overlap order": {{2, 4}, {0, 3}},
	}
	for name, rs := range cases {
		dir := t.TempDir()
		if _, err := Split(context.Background(), src, rs, dir, nil); !errors.Is(err, ErrBadRange) {
			t.Errorf("%s: Split = %v, want ErrBadRange", name, err)
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 0 {
			t.Errorf("%s: Split left %d files", name, len(ents))
		}
	}
}

func TestRanges(t *testing.T) {
	parse := []struct {
		in   string
		want []Range
		ok   bool
	}{
		{"0-3,3-6", []Range{{0, 3}, {3, 6}}, true},
		{" 0-1 , 1-5 ", []Range{{0, 1}, {1, 5}}, true},
		{"4-2", nil, false},
		{"3-3", nil, false},
		{"", nil, false},
		{"0-", nil, false},
		{"a-b", nil, false},
		{"0-3;3-6", nil, false},
		{"-1-2", nil, false},
		{"0-99999", nil, false},
	}
	for _, tc := range parse {
		got, err := ParseRanges(tc.in)
		if tc.ok != (err == nil) || (tc.ok && !reflect.DeepEqual(got, tc.want)) {
			t.Errorf("ParseRanges(%q) = %v, %v", tc.in, got, err)
		}
		if err != nil && !errors.Is(err, ErrBadRange) {
			t.Errorf("ParseRanges(%q) error %v is not ErrBadRange", tc.in, err)
		}
	}
	cover := []struct {
		rs          []Range
		n           int
		validOK     bool
		coverOK     bool
		errContains string
	}{
		{[]Range{{0, 3}, {3, 6}}, 6, true, true, ""},
		{[]Range{{0, 2}, {3, 6}}, 6, true, false, "gap"},
		{[]Range{{0, 3}}, 6, true, false, "gap"},
		{[]Range{{1, 6}}, 6, true, false, "gap"},
		{[]Range{{0, 4}, {3, 6}}, 6, false, false, "overlaps"},
		{[]Range{{0, 3}, {3, 7}}, 6, false, false, "beyond"},
		{[]Range{{3, 6}, {0, 3}}, 6, true, false, "order"},
		{nil, 6, false, false, "no ranges"},
	}
	for _, tc := range cover {
		if err := ValidateRanges(tc.rs, tc.n); (err == nil) != tc.validOK {
			t.Errorf("ValidateRanges(%v,%d) = %v", tc.rs, tc.n, err)
		}
		err := ValidateCover(tc.rs, tc.n)
		if (err == nil) != tc.coverOK || (err != nil && (!errors.Is(err, ErrBadRange) || !strings.Contains(err.Error(), tc.errContains))) {
			t.Errorf("ValidateCover(%v,%d) = %v, want ok=%v containing %q", tc.rs, tc.n, err, tc.coverOK, tc.errContains)
		}
	}
	even := []struct {
		n, k int
		want []Range
	}{
		{5, 2, []Range{{0, 3}, {3, 5}}},
		{5, 3, []Range{{0, 2}, {2, 4}, {4, 5}}},
		{6, 3, []Range{{0, 2}, {2, 4}, {4, 6}}},
		{3, 5, []Range{{0, 1}, {1, 2}, {2, 3}}},
		{4, 0, []Range{{0, 4}}},
		{0, 2, nil},
	}
	for _, tc := range even {
		got := EvenSplit(tc.n, tc.k)
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("EvenSplit(%d,%d) = %v, want %v", tc.n, tc.k, got, tc.want)
		}
		if tc.n > 0 {
			if err := ValidateCover(got, tc.n); err != nil {
				t.Errorf("EvenSplit(%d,%d) does not cover: %v", tc.n, tc.k, err)
			}
		}
	}
	if RoleOf(Range{0, 5}, 5) != RoleWhole || RoleOf(Range{0, 2}, 5) != RoleHead || RoleOf(Range{2, 3}, 5) != RoleMiddle || RoleOf(Range{3, 5}, 5) != RoleTail {
		t.Error("RoleOf")
	}
}

// deepseek2's rules (arch.go): a shard keeps the dense lead layers that
// fall in its range (leading_dense_block_count rewritten, the parent's
// value kept under the shard's proof), and no shard may take the layer
// counts llama.cpp reads as the lite variant.
func TestDeepseek2ShardRules(t *testing.T) {
	ctx := context.Background()
	s := tinySpec("deepseek2") // 6 layers, the first 2 dense
	src := synthFile(t, s)
	for _, tc := range []struct {
		r    Range
		lead uint32
	}{{Range{0, 2}, 2}, {Range{1, 3}, 1}, {Range{2, 4}, 0}, {Range{0, 6}, 2}, {Range{1, 2}, 1}} {
		res := splitAndCheck(t, src, []Range{tc.r})
		sh := mustOpen(t, res[0].Path)
		if v, _ := sh.Metadata.Get("deepseek2.leading_dense_block_count"); v != tc.lead {
			t.Errorf("%v: leading_dense_block_count %v, want %d", tc.r, v, tc.lead)
		}
		if err := ValidateForLoad(sh); err != nil {
			t.Errorf("%v: %v", tc.r, err)
		}
		if _, err := VerifyShard(ctx, res[0].Path); err != nil {
			t.Errorf("%v: %v", tc.r, err)
		}
	}
	// The rewritten value and the parent's kept value are both bound by
	// the shard's proof.
	res := splitAndCheck(t, src, []Range{{1, 4}})
	for name, edit := range map[string]func(*Metadata){
		"shard value":  func(md *Metadata) { md.Set("deepseek2.leading_dense_block_count", uint32(0)) },
		"parent value": func(md *Metadata) { md.Set(KeyParentPrefix+"leading_dense_block_count", uint32(3)) },
	} {
		out := filepath.Join(t.TempDir(), "forged.gguf")
		rewriteWith(t, res[0].Path, out, edit, nil)
		if _, err := VerifyShard(ctx, out); !errors.Is(err, ErrFingerprintMismatch) {
			t.Errorf("forged %s: %v, want ErrFingerprintMismatch", name, err)
		}
	}
	// Cut rules at real layer counts: DeepSeek-V3 (61 layers) never in a
	// 26- or 27-layer shard; V2-Lite (27 layers) only whole.
	md := Metadata{{KeyArchitecture, "deepseek2"}}
	for _, tc := range []struct {
		r     Range
		n     int
		legal bool
	}{
		{Range{0, 30}, 61, true}, {Range{30, 61}, 61, true}, {Range{0, 26}, 61, false}, {Range{35, 61}, 61, false}, {Range{3, 30}, 61, false},
		{Range{0, 27}, 27, true}, {Range{0, 13}, 27, false}, {Range{13, 27}, 27, false},
	} {
		err := CheckCut(md, tc.r, tc.n)
		if (err == nil) != tc.legal || (err != nil && !errors.Is(err, ErrIllegalCut)) {
			t.Errorf("%v of %d layers: %v, legal %v", tc.r, tc.n, err, tc.legal)
		}
	}
	if got := LegalCuts(md, 61); got != "any range except shards of 26 or 27 layers" {
		t.Errorf("LegalCuts(61) = %q", got)
	}
	if got := LegalCuts(md, 27); got != "whole model only" {
		t.Errorf("LegalCuts(27) = %q", got)
	}
	// Split refuses an illegal range, naming the rule.
	big := tinySpec("deepseek2")
	big.Layers = 30
	if _, err := Split(ctx, synthFile(t, big), []Range{{0, 26}, {26, 30}}, t.TempDir(), nil); !errors.Is(err, ErrIllegalCut) || !strings.Contains(err.Error(), "lite") {
		t.Errorf("split into 26 + 4 layers: %v, want ErrIllegalCut naming the lite rule", err)
	}
}

// A deepseek2 model cut to its first k layers (a self-draft) keeps the
// dense lead layers it holds and loads; 26 or 27 layers are refused.
func TestDeepseek2Truncate(t *testing.T) {
	ctx := context.Background()
	s := tinySpec("deepseek2")
	s.Layers, s.DenseLead = 30, 3
	src := synthFile(t, s)
	for _, k := range []int{2, 5} {
		res, err := Truncate(ctx, src, k, filepath.Join(t.TempDir(), "draft.gguf"))
		if err != nil {
			t.Fatal(err)
		}
		f := mustOpen(t, res.Path)
		if v, _ := f.Metadata.Get("deepseek2.leading_dense_block_count"); v != uint32(min(k, 3)) {
			t.Errorf("first %d layers: leading_dense_block_count %v", k, v)
		}
		if err := ValidateForLoad(f); err != nil {
			t.Errorf("first %d layers: %v", k, err)
		}
	}
	if _, err := Truncate(ctx, src, 26, filepath.Join(t.TempDir(), "d.gguf")); !errors.Is(err, ErrIllegalCut) {
		t.Errorf("first 26 layers: %v, want ErrIllegalCut", err)
	}
}

// glm4moe's rules (arch_glm.go): a shard keeps the dense lead layers in
// its range; the next-token-prediction (MTP) block at the end stays whole
// with a tail that holds a layer before it, every other shard gets
// nextn_predict_layers 0; every shard fed hidden states gets M-RoPE
// sections (llama.cpp aborts a glm4moe graph fed embeddings without them),
// the head keeps none. The proof covers every rewritten key.
func TestGLM4MoEShardRules(t *testing.T) {
	ctx := context.Background()
	s := tinySpec("glm4moe") // 6 layers, 2 dense lead, the last the MTP block
	src := synthFile(t, s)
	for _, tc := range []struct {
		r           Range
		lead, nextn uint32
		mrope       bool
	}{
		{Range{0, 2}, 2, 0, false}, {Range{1, 3}, 1, 0, true}, {Range{2, 5}, 0, 0, true},
		{Range{3, 6}, 0, 1, true}, {Range{0, 6}, 2, 1, false}, {Range{1, 6}, 1, 1, true},
	} {
		res := splitAndCheck(t, src, []Range{tc.r})
		sh := mustOpen(t, res[0].Path)
		lead, _ := sh.Metadata.Get("glm4moe.leading_dense_block_count")
		nextn, _ := sh.Metadata.Get("glm4moe.nextn_predict_layers")
		if lead != tc.lead || nextn != tc.nextn || glm4moeMRoPE(sh.Metadata, "glm4moe.") != tc.mrope {
			t.Errorf("%v: lead %v nextn %v M-RoPE %v, want %d %d %v", tc.r, lead, nextn, !tc.mrope, tc.lead, tc.nextn, tc.mrope)
		}
		if err := ValidateForLoad(sh); err != nil {
			t.Errorf("%v: %v", tc.r, err)
		}
		if _, err := VerifyShard(ctx, res[0].Path); err != nil {
			t.Errorf("%v: %v", tc.r, err)
		}
	}
	res := splitAndCheck(t, src, []Range{{1, 4}})
	for name, edit := range map[string]func(*Metadata){
		"dense lead":      func(md *Metadata) { md.Set("glm4moe.leading_dense_block_count", uint32(0)) },
		"nextn":           func(md *Metadata) { md.Set("glm4moe.nextn_predict_layers", uint32(1)) },
		"parent nextn":    func(md *Metadata) { md.Set(KeyParentPrefix+"nextn_predict_layers", uint32(2)) },
		"no sections":     func(md *Metadata) { md.Delete("glm4moe.rope.dimension_sections") },
		"other sections":  func(md *Metadata) { md.Set("glm4moe.rope.dimension_sections", []int32{1, 3, 0, 0}) },
		"parent sections": func(md *Metadata) { md.Delete(KeyParentAbsent) },
	} {
		out := filepath.Join(t.TempDir(), "forged.gguf")
		rewriteWith(t, res[0].Path, out, edit, nil)
		if _, err := VerifyShard(ctx, out); !errors.Is(err, ErrFingerprintMismatch) {
			t.Errorf("forged %s: %v, want ErrFingerprintMismatch", name, err)
		}
	}
	// Cut rules at GLM-4.5's real layer count: 92 layers and the MTP
	// layer 92.
	md := Metadata{{KeyArchitecture, "glm4moe"}, {"glm4moe.nextn_predict_layers", uint32(1)}}
	for _, tc := range []struct {
		r     Range
		legal bool
	}{
		{Range{0, 92}, true}, {Range{0, 46}, true}, {Range{46, 92}, true}, {Range{46, 93}, true}, {Range{91, 93}, true}, {Range{0, 93}, true},
		{Range{92, 93}, false}, {Range{30, 93}, true},
	} {
		err := CheckCut(md, tc.r, 93)
		if (err == nil) != tc.legal || (err != nil && !errors.Is(err, ErrIllegalCut)) {
			t.Errorf("%v of 93 layers: %v, legal %v", tc.r, err, tc.legal)
		}
	}
	two := Metadata{{KeyArchitecture, "glm4moe"}, {"glm4moe.nextn_predict_layers", uint32(2)}}
	for _, r := range []Range{{0, 93}, {10, 93}, {92, 94}, {93, 94}} {
		if err := CheckCut(two, r, 94); !errors.Is(err, ErrIllegalCut) || !strings.Contains(err.Error(), "next-token-prediction") {
			t.Errorf("%v of 94 layers, 2 MTP layers: %v, want ErrIllegalCut naming the MTP block", r, err)
		}
	}
	if got := LegalCuts(md, 93); !strings.Contains(got, "ending at layer 92 or before, or at 93") {
		t.Errorf("LegalCuts(93) = %q", got)
	}
	if got, err := LegalSplit(md, 93, 3); err != nil || rangesString(got) != "0-31,31-62,62-93" {
		t.Errorf("LegalSplit(93, 3) = %v, %v", got, err)
	}
	if got, err := LegalSplit(md, 4, 4); !errors.Is(err, ErrIllegalCut) {
		t.Errorf("LegalSplit(4, 4) = %v, %v; want ErrIllegalCut (the MTP layer alone)", got, err)
	}
	if _, err := Split(ctx, src, []Range{{0, 5}, {5, 6}}, t.TempDir(), nil); !errors.Is(err, ErrIllegalCut) || !strings.Contains(err.Error(), "next-token-prediction") {
		t.Errorf("split 0-5, 5-6: %v, want ErrIllegalCut naming the MTP block", err)
	}
	// A self-draft (the first k layers) leaves the MTP block out.
	tr, err := Truncate(ctx, src, 3, filepath.Join(t.TempDir(), "draft.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	if f := mustOpen(t, tr.Path); ValidateForLoad(f) != nil || glm4moeMRoPE(f.Metadata, "glm4moe.") {
		t.Errorf("first 3 layers: %v, M-RoPE %v", ValidateForLoad(f), glm4moeMRoPE(f.Metadata, "glm4moe."))
	}
}
