package gguf

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Digest is a SHA-256 digest.
type Digest [32]byte

func (d Digest) String() string { return hex.EncodeToString(d[:]) }

// ParseDigest parses a 64-character lowercase hex digest.
func ParseDigest(s string) (Digest, error) {
	var d Digest
	if len(s) != 64 || strings.ToLower(s) != s {
		return d, fmt.Errorf("gguf: bad digest %q", s)
	}
	if _, err := hex.Decode(d[:], []byte(s)); err != nil {
		return d, fmt.Errorf("gguf: bad digest %q: %w", s, err)
	}
	return d, nil
}

// NamedDigest is the digest of one global (non-layer) tensor.
type NamedDigest struct {
	Name   string
	Digest Digest
}

// Digests is the proof material of a model fingerprint: everything the
// fingerprint hashes, so that a shard can carry it and show which parts it
// holds.
//
//	tensor digest  = sha256(name || type || shape || sha256(data))   (layer names use the global index)
//	L[i]           = sha256(sorted tensor digests of blk.i.*)
//	G              = tensor digests of all other tensors, sorted by name
//	H              = sha256(canonical KVs, excluding tokenizer.*, meshp2p.*,
//	                 general.* except general.architecture, <arch>.block_count, <arch>.vocab_size)
//	T              = sha256(canonical tokenizer.* KVs)
//	fingerprint    = sha256("meshp2p-fp-v1" || H || T || n_layer || G || L[0..n))
//
// block_count is bound by the number of layer digests; vocab_size by the
// tokenizer and the embedding shape. Leaving both out of H lets every shard
// of a model recompute the same H from its own metadata.
type Digests struct {
	HParams   Digest
	Tokenizer Digest
	Globals   []NamedDigest // sorted by name
	Layers    []Digest      // index = global layer index

	// dataHash holds sha256(data) per source tensor name (set by
	// ComputeDigests) so Split can check that the data it copies is the data
	// it fingerprinted.
	dataHash map[string]Digest
}

const fingerprintDomain = "meshp2p-fp-v1"

// Fingerprint returns the hex model fingerprint the digests prove.
func (d *Digests) Fingerprint() string {
	h := sha256.New()
	var b []byte
	b = append(b, fingerprintDomain...)
	b = append(b, d.HParams[:]...)
	b = append(b, d.Tokenizer[:]...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(d.Layers)))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(d.Globals)))
	for _, g := range d.Globals {
		b = appendString(b, g.Name)
		b = append(b, g.Digest[:]...)
	}
	for _, l := range d.Layers {
		b = append(b, l[:]...)
	}
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil))
}

// Global returns the digest of global tensor name.
func (d *Digests) Global(name string) (Digest, bool) {
	i := sort.Search(len(d.Globals), func(i int) bool { return d.Globals[i].Name >= name })
	if i < len(d.Globals) && d.Globals[i].Name == name {
		return d.Globals[i].Digest, true
	}
	return Digest{}, false
}

// isHParamKey reports whether key goes into the hyper-parameter digest.
func isHParamKey(key, arch string) bool {
	switch {
	case strings.HasPrefix(key, "tokenizer."), strings.HasPrefix(key, "meshp2p."):
		return false
	case strings.HasPrefix(key, "general."):
		return key == KeyArchitecture
	case key == arch+".block_count", key == arch+".vocab_size":
		return false
	}
	return true
}

// kvDigest hashes the canonical encoding (GGUF binary, sorted by key) of the
// pairs selected by keep.
func kvDigest(domain string, md Metadata, keep func(string) bool) (Digest, error) {
	sel := make(Metadata, 0, len(md))
	for _, kv := range md {
		if keep(kv.Key) {
			sel = append(sel, kv)
		}
	}
	sort.Slice(sel, func(i, j int) bool { return sel[i].Key < sel[j].Key })
	h := sha256.New()
	b := append([]byte(domain), 0)
	b = binary.LittleEndian.AppendUint64(b, uint64(len(sel)))
	for _, kv := range sel {
		var err error
		if b, err = appendKV(b, kv); err != nil {
			return Digest{}, err
		}
		if len(b) > 1<<20 {
			h.Write(b)
			b = b[:0]
		}
	}
	h.Write(b)
	return Digest(h.Sum(nil)), nil
}

func hparamsDigest(md Metadata) (Digest, error) {
	arch, _ := md.String(KeyArchitecture)
	return kvDigest("meshp2p-hparams-v1", md, func(k string) bool { return isHParamKey(k, arch) })
}

func tokenizerDigest(md Metadata) (Digest, error) {
	return kvDigest("meshp2p-tokenizer-v1", md, func(k string) bool { return strings.HasPrefix(k, "tokenizer.") })
}

// tensorDigest = sha256(name || type || shape || dataHash).
func tensorDigest(name string, typ TensorType, shape []uint64, dataHash Digest) Digest {
	b := appendString(nil, name)
	b = binary.LittleEndian.AppendUint32(b, uint32(typ))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(shape)))
	for _, d := range shape {
		b = binary.LittleEndian.AppendUint64(b, d)
	}
	b = append(b, dataHash[:]...)
	return sha256.Sum256(b)
}

// layerDigest hashes the sorted tensor digests of one layer.
func layerDigest(ds []Digest) Digest {
	s := slices.Clone(ds)
	slices.SortFunc(s, func(a, b Digest) int { return strings.Compare(string(a[:]), string(b[:])) })
	h := sha256.New()
	for _, d := range s {
		h.Write(d[:])
	}
	return Digest(h.Sum(nil))
}

// ErrLayerName reports a tensor name that starts with "blk." but has no
// valid layer index.
var ErrLayerName = errors.New("malformed layer tensor name")

// splitLayerName parses "blk.<i>.<rest>". ok is false for names that do not
// start with "blk."; err is set for names that do but are malformed.
func splitLayerName(name string) (idx int, rest string, ok bool, err error) {
	s, found := strings.CutPrefix(name, "blk.")
	if !found {
		return 0, "", false, nil
	}
	num, rest, found := strings.Cut(s, ".")
	if !found || rest == "" || num == "" || (len(num) > 1 && num[0] == '0') || len(num) > 6 {
		return 0, "", false, fmt.Errorf("%w: %q", ErrLayerName, name)
	}
	for _, c := range num {
		if c < '0' || c > '9' {
			return 0, "", false, fmt.Errorf("%w: %q", ErrLayerName, name)
		}
	}
	idx, _ = strconv.Atoi(num)
	return idx, rest, true, nil
}

func layerName(i int, rest string) string { return "blk." + strconv.Itoa(i) + "." + rest }

// NLayer returns <arch>.block_count (0 when absent).
func (f *File) NLayer() (int, error) {
	arch := f.Architecture()
	v, present := f.Metadata.Get(arch + ".block_count")
	if !present {
		return 0, nil
	}
	n, ok := asUint(v)
	if !ok || n > MaxLayers {
		return 0, fmt.Errorf("gguf: %w: %s.block_count = %v", ErrInvalidMetadata, arch, v)
	}
	return int(n), nil
}

// MaxLayers is llama.cpp's LLAMA_MAX_LAYERS.
const MaxLayers = 512

// hashData streams the data of t through sha256.
func hashData(ctx context.Context, r io.ReaderAt, size int64, buf []byte, progress func(int64)) (Digest, error) {
	h := sha256.New()
	for pos := int64(0); pos < size; {
		if err := ctx.Err(); err != nil {
			return Digest{}, err
		}
		chunk := buf[:min(int64(len(buf)), size-pos)]
		n, err := r.ReadAt(chunk, pos)
		if n < len(chunk) {
			if err == nil || errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return Digest{}, err
		}
		h.Write(chunk)
		pos += int64(n)
		if progress != nil {
			progress(int64(n))
		}
	}
	return Digest(h.Sum(nil)), nil
}

// DataBytes returns the total tensor data bytes of f.
func (f *File) DataBytes() int64 {
	var n int64
	for i := range f.Tensors {
		n += int64(f.Tensors[i].Bytes)
	}
	return n
}

// ComputeDigests hashes the metadata and streams every tensor's data (one
// pass, constant memory). progress, if not nil, gets data bytes done/total.
// It fails on files that are shards (they carry their parent's digests; see
// VerifyShard) and on layer tensors outside [0, block_count).
func ComputeDigests(ctx context.Context, f *File, progress func(done, total int64)) (*Digests, error) {
	// Check everything but the data first, so bad input fails fast.
	if _, err := DigestsFromHashes(f, make([]Digest, len(f.Tensors))); err != nil {
		return nil, err
	}
	hashes := make([]Digest, len(f.Tensors))
	total, done := f.DataBytes(), int64(0)
	buf := make([]byte, copyChunk)
	for i := range f.Tensors {
		t := &f.Tensors[i]
		dh, err := hashData(ctx, f.TensorData(t), int64(t.Bytes), buf, func(k int64) {
			done += k
			if progress != nil {
				progress(done, total)
			}
		})
		if err != nil {
			return nil, fmt.Errorf("gguf: hashing tensor %q: %w", t.Name, err)
		}
		hashes[i] = dh
	}
	return DigestsFromHashes(f, hashes)
}

// DataHashes returns sha256(data) of every tensor, in f.Tensors order, as
// ComputeDigests or DigestsFromHashes saw them.
func (d *Digests) DataHashes(f *File) []Digest {
	out := make([]Digest, len(f.Tensors))
	for i := range f.Tensors {
		out[i] = d.dataHash[f.Tensors[i].Name]
	}
	return out
}

// DigestsFromHashes computes the digests of f from its metadata and the
// sha256 of each tensor's data (hashes[i] for f.Tensors[i]) without reading
// any data: the fingerprint of a model known only by its header and tensor
// hashes (a Manifest). Its work is linear in the header (plus a sort).
func DigestsFromHashes(f *File, hashes []Digest) (*Digests, error) {
	if len(hashes) != len(f.Tensors) {
		return nil, fmt.Errorf("gguf: %w: %d tensor hashes for %d tensors", ErrInvalidTensor, len(hashes), len(f.Tensors))
	}
	if _, ok := f.Metadata.Get(KeyParentFingerprint); ok {
		return nil, fmt.Errorf("gguf: %w: file is a shard; verify it with VerifyShard", ErrIsShard)
	}
	if _, ok := f.Metadata.Get(KeyVocabFingerprint); ok {
		return nil, fmt.Errorf("gguf: %w: file is a vocabulary; verify it with CheckVocab", ErrIsShard)
	}
	n, err := f.NLayer()
	if err != nil {
		return nil, err
	}
	d := &Digests{Layers: make([]Digest, n), dataHash: make(map[string]Digest, len(f.Tensors))}
	if d.HParams, err = hparamsDigest(f.Metadata); err != nil {
		return nil, err
	}
	if d.Tokenizer, err = tokenizerDigest(f.Metadata); err != nil {
		return nil, err
	}
	layers := make([][]Digest, n)
	for i := range f.Tensors {
		t := &f.Tensors[i]
		idx, _, isLayer, err := splitLayerName(t.Name)
		if err != nil {
			return nil, err
		}
		if isLayer && idx >= n {
			return nil, fmt.Errorf("gguf: %w: tensor %q is beyond block_count %d", ErrInvalidTensor, t.Name, n)
		}
		d.dataHash[t.Name] = hashes[i]
		td := tensorDigest(t.Name, t.Type, t.Shape, hashes[i])
		if isLayer {
			layers[idx] = append(layers[idx], td)
		} else {
			d.Globals = append(d.Globals, NamedDigest{t.Name, td})
		}
	}
	for i, l := range layers {
		if len(l) == 0 {
			return nil, fmt.Errorf("gguf: %w: layer %d has no tensors", ErrInvalidTensor, i)
		}
		d.Layers[i] = layerDigest(l)
	}
	sort.Slice(d.Globals, func(i, j int) bool { return d.Globals[i].Name < d.Globals[j].Name })
	return d, nil
}

// Fingerprint computes the model fingerprint of f (streaming).
func Fingerprint(ctx context.Context, f *File) (string, error) {
	d, err := ComputeDigests(ctx, f, nil)
	if err != nil {
		return "", err
	}
	return d.Fingerprint(), nil
}

// Shard metadata keys.
const (
	KeyParentFingerprint = "meshp2p.parent.fingerprint"
	KeyParentNLayer      = "meshp2p.parent.n_layer"
	KeyRangeStart        = "meshp2p.range.start"
	KeyRangeEnd          = "meshp2p.range.end"
	KeyParentHParams     = "meshp2p.parent.hparams_digest"
	KeyParentTokenizer   = "meshp2p.parent.tokenizer_digest"
	KeyParentGlobalNames = "meshp2p.parent.global_names"
	KeyParentGlobals     = "meshp2p.parent.global_digests"
	KeyParentLayers      = "meshp2p.parent.layer_digests"
)

// ErrIsShard is returned when a whole model was expected but the file is a shard.
var ErrIsShard = errors.New("file is a shard")

// shardMetadata is the proof material a shard of [r.Start, r.End) stores.
func (d *Digests) shardMetadata(r Range) Metadata {
	names := make([]string, len(d.Globals))
	gds := make([]string, len(d.Globals))
	for i, g := range d.Globals {
		names[i], gds[i] = g.Name, g.Digest.String()
	}
	lds := make([]string, len(d.Layers))
	for i, l := range d.Layers {
		lds[i] = l.String()
	}
	return Metadata{
		{KeyParentFingerprint, d.Fingerprint()},
		{KeyParentNLayer, uint32(len(d.Layers))},
		{KeyRangeStart, uint32(r.Start)},
		{KeyRangeEnd, uint32(r.End)},
		{KeyParentHParams, d.HParams.String()},
		{KeyParentTokenizer, d.Tokenizer.String()},
		{KeyParentGlobalNames, names},
		{KeyParentGlobals, gds},
		{KeyParentLayers, lds},
	}
}

// digestsFromMetadata parses the proof material stored in a shard.
func digestsFromMetadata(md Metadata) (*Digests, error) {
	bad := func(key string) error { return fmt.Errorf("%w: bad or missing %s", ErrNotShard, key) }
	var d Digests
	var err error
	s, _ := md.String(KeyParentHParams)
	if d.HParams, err = ParseDigest(s); err != nil {
		return nil, bad(KeyParentHParams)
	}
	s, _ = md.String(KeyParentTokenizer)
	if d.Tokenizer, err = ParseDigest(s); err != nil {
		return nil, bad(KeyParentTokenizer)
	}
	v, _ := md.Get(KeyParentGlobalNames)
	names, ok := v.([]string)
	if !ok {
		return nil, bad(KeyParentGlobalNames)
	}
	v, _ = md.Get(KeyParentGlobals)
	gds, ok := v.([]string)
	if !ok || len(gds) != len(names) {
		return nil, bad(KeyParentGlobals)
	}
	for i := range names {
		g, err := ParseDigest(gds[i])
		if err != nil || (i > 0 && names[i-1] >= names[i]) {
			return nil, bad(KeyParentGlobals)
		}
		d.Globals = append(d.Globals, NamedDigest{names[i], g})
	}
	v, _ = md.Get(KeyParentLayers)
	lds, ok := v.([]string)
	if !ok || len(lds) > MaxLayers {
		return nil, bad(KeyParentLayers)
	}
	for _, s := range lds {
		l, err := ParseDigest(s)
		if err != nil {
			return nil, bad(KeyParentLayers)
		}
		d.Layers = append(d.Layers, l)
	}
	return &d, nil
}
