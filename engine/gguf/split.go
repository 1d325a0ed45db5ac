package gguf

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// ErrBadRange reports an invalid layer range or range list.
var ErrBadRange = errors.New("bad layer range")

// Range is a half-open layer range [Start, End).
type Range struct {
	Start int `json:"start"`
	End   int `json:"end"`
}

func (r Range) String() string { return fmt.Sprintf("%d-%d", r.Start, r.End) }

// Len is the number of layers.
func (r Range) Len() int { return r.End - r.Start }

// Role names what a shard of r in an n-layer model holds.
type Role string

// Shard roles.
const (
	RoleWhole  Role = "whole"  // [0,n): everything
	RoleHead   Role = "head"   // [0,b): vocab, token_embd, output_norm; no output.weight
	RoleMiddle Role = "middle" // [a,b): no vocab, 1-row stand-ins
	RoleTail   Role = "tail"   // [a,n): vocab, output_norm, output stored as token_embd
)

// RoleOf returns the role of a shard of r in an n-layer model.
func RoleOf(r Range, n int) Role {
	switch {
	case r.Start == 0 && r.End == n:
		return RoleWhole
	case r.Start == 0:
		return RoleHead
	case r.End == n:
		return RoleTail
	}
	return RoleMiddle
}

// ParseRanges parses "0-3,3-6" (half-open [a,b) each) into ranges. It checks
// syntax and a<b only; see ValidateRanges / ValidateCover.
func ParseRanges(s string) ([]Range, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, fmt.Errorf("%w: empty range list", ErrBadRange)
	}
	var out []Range
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		as, bs, ok := strings.Cut(part, "-")
		a, errA := strconv.Atoi(strings.TrimSpace(as))
		b, errB := strconv.Atoi(strings.TrimSpace(bs))
		if !ok || errA != nil || errB != nil || a < 0 || b < 0 || a > MaxLayers || b > MaxLayers {
			return nil, fmt.Errorf("%w: %q (want START-END, e.g. 0-3)", ErrBadRange, part)
		}
		if a >= b {
			return nil, fmt.Errorf("%w: %q is empty (ranges are half-open [START,END))", ErrBadRange, part)
		}
		out = append(out, Range{a, b})
	}
	return out, nil
}

// ValidateRanges checks that every range is non-empty and inside [0,n) and
// that no two overlap. Gaps are allowed.
func ValidateRanges(ranges []Range, n int) error {
	if len(ranges) == 0 {
		return fmt.Errorf("%w: no ranges", ErrBadRange)
	}
	s := slices.Clone(ranges)
	slices.SortFunc(s, func(a, b Range) int { return a.Start - b.Start })
	for i, r := range s {
		if r.Start < 0 || r.Start >= r.End {
			return fmt.Errorf("%w: %v is empty", ErrBadRange, r)
		}
		if r.End > n {
			return fmt.Errorf("%w: %v goes beyond the model's %d layers", ErrBadRange, r, n)
		}
		if i > 0 && s[i-1].End > r.Start {
			return fmt.Errorf("%w: %v overlaps %v", ErrBadRange, s[i-1], r)
		}
	}
	return nil
}

// ValidateCover checks ValidateRanges and that the ranges, in order, cover
// [0,n) exactly with no gaps (a route).
func ValidateCover(ranges []Range, n int) error {
	if err := ValidateRanges(ranges, n); err != nil {
		return err
	}
	for i := 1; i < len(ranges); i++ {
		if ranges[i].Start < ranges[i-1].Start {
			return fmt.Errorf("%w: %v comes after %v: ranges must be in layer order", ErrBadRange, ranges[i], ranges[i-1])
		}
	}
	next := 0
	for _, r := range ranges {
		if r.Start != next {
			return fmt.Errorf("%w: gap: layers %d-%d are not covered", ErrBadRange, next, r.Start)
		}
		next = r.End
	}
	if next != n {
		return fmt.Errorf("%w: gap: layers %d-%d are not covered", ErrBadRange, next, n)
	}
	return nil
}

// EvenSplit returns k contiguous ranges covering [0,n) as evenly as
// possible; the first n%k ranges get one extra layer. k is clamped to
// [1,n]; n<=0 gives nil.
func EvenSplit(n, k int) []Range {
	if n <= 0 {
		return nil
	}
	k = max(1, min(k, n))
	out := make([]Range, 0, k)
	start := 0
	for i := 0; i < k; i++ {
		size := n / k
		if i < n%k {
			size++
		}
		out = append(out, Range{start, start + size})
		start += size
	}
	return out
}

// SplitResult describes one written shard.
type SplitResult struct {
	Path        string `json:"path"`
	Range       Range  `json:"range"`
	Role        Role   `json:"role"`
	Size        int64  `json:"size"`
	Fingerprint string `json:"fingerprint"` // the parent model's
}

// ShardName returns "<base>.L<a>-<b>.gguf" for a source path.
func ShardName(src string, r Range) string {
	base := strings.TrimSuffix(filepath.Base(src), ".gguf")
	return fmt.Sprintf("%s.L%d-%d.gguf", base, r.Start, r.End)
}

// Split writes one shard GGUF per range into outDir (see RoleOf for what
// each holds). It first fingerprints the source (one streaming pass), then
// streams each shard to a temporary file and renames it into place; data
// copied is re-hashed on the way and must match the first pass. progress,
// if not nil, gets bytes done/total over both passes.
func Split(ctx context.Context, src string, ranges []Range, outDir string, progress func(done, total int64)) ([]SplitResult, error) {
	f, err := Open(src)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if _, ok := f.Metadata.Get(KeyParentFingerprint); ok {
		return nil, fmt.Errorf("gguf: split %s: %w; split the whole model instead", src, ErrIsShard)
	}
	n, err := f.NLayer()
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, fmt.Errorf("gguf: split %s: %w: no layers (block_count missing or 0)", src, ErrInvalidMetadata)
	}
	if err := ValidateRanges(ranges, n); err != nil {
		return nil, err
	}
	// Plan every shard before doing any I/O so bad input fails fast.
	total := f.DataBytes()
	for _, r := range ranges {
		_, ts, err := planShard(f, nil, r, n)
		if err != nil {
			return nil, err
		}
		for _, t := range ts {
			b, _ := TensorBytes(t.Type, t.Shape)
			total += int64(b)
		}
	}
	dg, err := ComputeDigests(ctx, f, func(done, _ int64) {
		if progress != nil {
			progress(done, total)
		}
	})
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return nil, err
	}
	done := f.DataBytes()
	var out []SplitResult
	for _, r := range ranges {
		base := done
		res, err := WriteShard(ctx, f, dg, r, filepath.Join(outDir, ShardName(src, r)), func(d, _ int64) {
			done = base + d
			if progress != nil {
				progress(done, total)
			}
		})
		if err != nil {
			return out, err
		}
		out = append(out, res)
	}
	return out, nil
}

// WriteShard writes the shard of layers r of model f, whose digests are dg,
// to path (atomically). This is the one shard writer: Split uses it on a
// whole model file, a fetch on a header whose tensor data comes from
// verified downloads (File.WithData), so both produce the same bytes. Every
// tensor copied is re-hashed on the way and must match dg (ErrSourceChanged).
func WriteShard(ctx context.Context, f *File, dg *Digests, r Range, path string, progress func(done, total int64)) (SplitResult, error) {
	n := len(dg.Layers)
	if err := ValidateRanges([]Range{r}, n); err != nil {
		return SplitResult{}, err
	}
	md, ts, err := planShard(f, dg, r, n)
	if err != nil {
		return SplitResult{}, err
	}
	if err := WriteFile(ctx, path, md, ts, progress); err != nil {
		return SplitResult{}, fmt.Errorf("gguf: writing shard %v: %w", r, err)
	}
	if err := checkCopied(ts, dg); err != nil {
		os.Remove(path)
		return SplitResult{}, fmt.Errorf("gguf: writing shard %v: %w", r, err)
	}
	st, err := os.Stat(path)
	if err != nil {
		return SplitResult{}, err
	}
	return SplitResult{Path: path, Range: r, Role: RoleOf(r, n), Size: st.Size(), Fingerprint: dg.Fingerprint()}, nil
}

// ShardSources returns the tensors of f whose data the shard of layers r
// copies (in f.Tensors order, each once): what a node that fetches only its
// layers must download.
func ShardSources(f *File, r Range) ([]*TensorInfo, error) {
	n, err := f.NLayer()
	if err != nil {
		return nil, err
	}
	if err := ValidateRanges([]Range{r}, n); err != nil {
		return nil, err
	}
	// With digests the plan reads every copied tensor through a
	// hashingReaderAt that names its source.
	_, ts, err := planShard(f, &Digests{Layers: make([]Digest, n)}, r, n)
	if err != nil {
		return nil, err
	}
	want := map[string]bool{}
	for _, t := range ts {
		if h, ok := t.Data.(*hashingReaderAt); ok {
			want[h.srcName] = true
		}
	}
	var out []*TensorInfo
	for i := range f.Tensors {
		if want[f.Tensors[i].Name] {
			out = append(out, &f.Tensors[i])
		}
	}
	return out, nil
}

// ErrSourceChanged means the source file's data changed while splitting.
var ErrSourceChanged = errors.New("source data changed during split")

func checkCopied(ts []WriteTensor, dg *Digests) error {
	for _, t := range ts {
		h, ok := t.Data.(*hashingReaderAt)
		if !ok {
			continue
		}
		if !h.sequential || Digest(h.h.Sum(nil)) != dg.dataHash[h.srcName] {
			return fmt.Errorf("%w: tensor %q", ErrSourceChanged, h.srcName)
		}
	}
	return nil
}

// hashingReaderAt hashes what the writer reads (sequentially) from a source tensor.
type hashingReaderAt struct {
	r          io.ReaderAt
	srcName    string
	h          hash.Hash
	next       int64
	sequential bool
}

func newHashing(f *File, t *TensorInfo) *hashingReaderAt {
	return &hashingReaderAt{r: f.TensorData(t), srcName: t.Name, h: sha256.New(), sequential: true}
}

func (h *hashingReaderAt) ReadAt(p []byte, off int64) (int, error) {
	n, err := h.r.ReadAt(p, off)
	if off != h.next {
		h.sequential = false
	}
	h.h.Write(p[:n])
	h.next = off + int64(n)
	return n, err
}

// Tensor names with special roles in a shard.
const (
	tokenEmbd  = "token_embd.weight"
	outputNorm = "output_norm.weight"
	output     = "output.weight"
)

// embdLength returns <arch>.embedding_length.
func embdLength(md Metadata) (uint64, error) {
	arch, _ := md.String(KeyArchitecture)
	n, ok := md.Uint(arch + ".embedding_length")
	if !ok || n == 0 || n > 1<<24 {
		return 0, fmt.Errorf("gguf: %w: %s.embedding_length missing or invalid", ErrInvalidMetadata, arch)
	}
	return n, nil
}

func standIn(name string, nEmbd uint64) WriteTensor {
	if name == tokenEmbd || name == output {
		return WriteTensor{Name: name, Type: TypeF32, Shape: []uint64{nEmbd, 1}, Data: fillReaderAt{[]byte{0, 0, 0, 0}, int64(4 * nEmbd)}}
	}
	// float32(1) little-endian
	return WriteTensor{Name: name, Type: TypeF32, Shape: []uint64{nEmbd}, Data: fillReaderAt{[]byte{0, 0, 0x80, 0x3f}, int64(4 * nEmbd)}}
}

// planShard returns the metadata and tensors of the shard r of f. With dg
// nil it only validates (metadata then lacks the proof material).
func planShard(f *File, dg *Digests, r Range, n int) (Metadata, []WriteTensor, error) {
	arch := f.Architecture()
	if arch == "" {
		return nil, nil, fmt.Errorf("gguf: %w: no %s", ErrInvalidMetadata, KeyArchitecture)
	}
	role := RoleOf(r, n)
	nEmbd, err := embdLength(f.Metadata)
	if err != nil {
		return nil, nil, err
	}
	if _, ok := f.Tensor(tokenEmbd); !ok {
		return nil, nil, fmt.Errorf("gguf: %w: model has no %s", ErrInvalidTensor, tokenEmbd)
	}
	if _, ok := f.Tensor(outputNorm); !ok {
		return nil, nil, fmt.Errorf("gguf: %w: model has no %s", ErrInvalidTensor, outputNorm)
	}
	if err := CheckCut(f.Metadata, r, n); err != nil {
		return nil, nil, err
	}
	md := planShardMetadata(f.Metadata, dg, r, n, arch, role)
	p := shardPlan{f: f, dg: dg, r: r, n: n, role: role, nEmbd: nEmbd, outputRequired: archRules[arch].outputRequired}
	ts, err := p.tensors()
	if err != nil {
		return nil, nil, err
	}
	return md, ts, nil
}

// planShardMetadata returns the shard's metadata: the model's without
// meshp2p.* keys, block_count the range's length and what else the
// architecture keys on the layer index rewritten (archRule.shardMetadata),
// no tokenizer in a middle shard (model "none", vocab_size 1), then the
// proof material when dg is set.
func planShardMetadata(src Metadata, dg *Digests, r Range, n int, arch string, role Role) Metadata {
	md := src.Clone()
	md.DeletePrefix("meshp2p.")
	md.Set(arch+".block_count", uint32(r.Len()))
	md = rewriteShardMetadata(md, arch, r, n)
	if role == RoleMiddle {
		md.DeletePrefix("tokenizer.")
		md.Set("tokenizer.ggml.model", "none")
		md.Set(arch+".vocab_size", uint32(1))
	}
	if dg != nil {
		md = append(md, dg.shardMetadata(r)...)
	}
	return md
}

// shardPlan is what planShard's tensor steps share.
type shardPlan struct {
	f     *File
	dg    *Digests // nil: validate only (data is not hashed)
	r     Range
	n     int // the model's block_count
	role  Role
	nEmbd uint64
	// outputRequired: the architecture has no tied fallback for output
	// (archRule): every shard carries one.
	outputRequired bool
}

// src returns t's data written under name, hashed on the way when p.dg is
// set (for checkCopied).
func (p *shardPlan) src(t *TensorInfo, name string) WriteTensor {
	var data io.ReaderAt = p.f.TensorData(t)
	if p.dg != nil {
		data = newHashing(p.f, t)
	}
	return WriteTensor{Name: name, Type: t.Type, Shape: t.Shape, Data: data}
}

// tensors returns the shard's tensors in the model's order: the layers of
// p.r renumbered from 0, and the globals as global decides. A layer at or
// beyond block_count is an error.
func (p *shardPlan) tensors() ([]WriteTensor, error) {
	outT, hasOutput := p.f.Tensor(output)
	var ts []WriteTensor
	for i := range p.f.Tensors {
		t := &p.f.Tensors[i]
		idx, rest, isLayer, err := splitLayerName(t.Name)
		if err != nil {
			return nil, err
		}
		if isLayer {
			if idx >= p.n {
				return nil, fmt.Errorf("gguf: %w: tensor %q is beyond block_count %d", ErrInvalidTensor, t.Name, p.n)
			}
			if idx >= p.r.Start && idx < p.r.End {
				ts = append(ts, p.src(t, layerName(idx-p.r.Start, rest)))
			}
			continue
		}
		ts = p.global(ts, t, outT, hasOutput)
	}
	return ts, nil
}

// global appends what the shard holds for the global tensor t: token_embd
// in a whole or head shard, the 1-row stand-ins of token_embd and
// output_norm in a middle shard, output (when the model has one, outT) as
// token_embd in a tail shard, output only in a whole model, and every other
// global as is.
func (p *shardPlan) global(ts []WriteTensor, t, outT *TensorInfo, hasOutput bool) []WriteTensor {
	switch t.Name {
	case tokenEmbd:
		switch p.role {
		case RoleWhole, RoleHead:
			ts = append(ts, p.src(t, tokenEmbd))
		case RoleMiddle:
			ts = append(ts, standIn(tokenEmbd, p.nEmbd))
		case RoleTail:
			if hasOutput {
				ts = append(ts, p.src(outT, tokenEmbd))
			} else {
				ts = append(ts, p.src(t, tokenEmbd))
			}
		}
	case outputNorm:
		if p.role == RoleMiddle {
			ts = append(ts, standIn(outputNorm, p.nEmbd))
		} else {
			ts = append(ts, p.src(t, outputNorm))
		}
	case output:
		switch {
		case p.role == RoleWhole:
			ts = append(ts, p.src(t, output))
		case !p.outputRequired:
		case p.role == RoleMiddle:
			ts = append(ts, standIn(output, p.nEmbd))
		default: // head (never computes logits: mmap leaves it on disk), tail
			ts = append(ts, p.src(t, output))
		}
	default:
		ts = append(ts, p.src(t, t.Name))
	}
	return ts
}
