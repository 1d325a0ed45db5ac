package gguf

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
)

// A Manifest describes a whole model without its weights: the GGUF header
// (metadata and tensor infos, exactly as in the file) and the sha256 of
// every tensor's data. From it DigestsFromHashes recomputes H, T, the global
// digests and every layer digest, so a manifest hashes to the model
// fingerprint: a node that knows only the fingerprint checks a manifest
// before trusting anything in it, then checks each tensor it downloads
// against the manifest's hash, and writes its shard with WriteShard from
// the header and the downloaded data (the same bytes Split writes).
//
// Encoding (little-endian):
//
//	"meshp2p-manifest-v1\n"  u64 file size  u64 header length  header
//	u32 tensor count (= the header's)  count × 32-byte sha256(data), header order
type Manifest struct {
	File    *File  // the parsed header; no data (see File.WithData)
	Header  []byte // GGUF header bytes: magic through the last tensor info
	Digests *Digests
}

const manifestMagic = "meshp2p-manifest-v1\n"

// MaxManifestHeader bounds the GGUF header a manifest may carry (a 256k-token
// vocabulary with merges is about 20 MiB).
const MaxManifestHeader = 64 << 20

// MaxManifestBytes bounds an encoded manifest: the header, plus at most one
// 32-byte hash per 24 header bytes (the smallest tensor info).
const MaxManifestBytes = len(manifestMagic) + 20 + MaxManifestHeader + MaxManifestHeader/24*32

// ErrManifest reports a malformed manifest (wrapped with the reason).
var ErrManifest = errors.New("malformed manifest")

// NewManifest builds the manifest of f, whose header bytes are hdr and whose
// digests (with data hashes) are dg.
func NewManifest(f *File, hdr []byte, dg *Digests) (*Manifest, error) {
	if int64(len(hdr)) != f.HeaderSize {
		return nil, fmt.Errorf("gguf: manifest: header of %d bytes, file's is %d", len(hdr), f.HeaderSize)
	}
	if len(hdr) > MaxManifestHeader {
		return nil, fmt.Errorf("gguf: manifest: %w: header of %d bytes over the %d limit", ErrTooLarge, len(hdr), MaxManifestHeader)
	}
	for i := range f.Tensors {
		if _, ok := dg.dataHash[f.Tensors[i].Name]; !ok {
			return nil, fmt.Errorf("gguf: manifest: no data hash for %q", f.Tensors[i].Name)
		}
	}
	c := *f
	c.r, c.closer = nil, nil
	return &Manifest{File: &c, Header: bytes.Clone(hdr), Digests: dg}, nil
}

// BuildManifest fingerprints the whole model at path (one streaming pass)
// and returns its manifest.
func BuildManifest(ctx context.Context, path string, progress func(done, total int64)) (*Manifest, error) {
	f, err := Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if f.HeaderSize > MaxManifestHeader {
		return nil, fmt.Errorf("gguf: %s: %w: header of %d bytes over the manifest's %d limit", path, ErrTooLarge, f.HeaderSize, MaxManifestHeader)
	}
	hdr := make([]byte, f.HeaderSize)
	if _, err := f.r.ReadAt(hdr, 0); err != nil {
		return nil, err
	}
	dg, err := ComputeDigests(ctx, f, progress)
	if err != nil {
		return nil, err
	}
	return NewManifest(f, hdr, dg)
}

// Fingerprint is the model fingerprint the manifest proves.
func (m *Manifest) Fingerprint() string { return m.Digests.Fingerprint() }

// DataHash is the sha256 of tensor t's data.
func (m *Manifest) DataHash(t *TensorInfo) Digest { return m.Digests.dataHash[t.Name] }

// Marshal encodes the manifest.
func (m *Manifest) Marshal() []byte {
	b := make([]byte, 0, len(manifestMagic)+20+len(m.Header)+32*len(m.File.Tensors))
	b = append(b, manifestMagic...)
	b = binary.LittleEndian.AppendUint64(b, uint64(m.File.Size))
	b = binary.LittleEndian.AppendUint64(b, uint64(len(m.Header)))
	b = append(b, m.Header...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(m.File.Tensors)))
	for i := range m.File.Tensors {
		h := m.DataHash(&m.File.Tensors[i])
		b = append(b, h[:]...)
	}
	return b
}

// ParseManifest decodes and checks a manifest. Its time and memory are
// linear in len(b): the header is parsed by ReadHeader against its own
// bytes (a claimed file size or count allocates nothing), the hash count
// must equal the header's tensor count and fill the rest exactly, and no
// buffer is sized from a number in the input before the bytes it claims are
// known to be present. It does not know which model to expect: compare
// Fingerprint with it (CheckManifest).
func ParseManifest(b []byte) (*Manifest, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("gguf: %w: %s", ErrManifest, fmt.Sprintf(format, args...))
	}
	if len(b) > MaxManifestBytes {
		return nil, bad("%d bytes, over the %d limit", len(b), MaxManifestBytes)
	}
	if len(b) < len(manifestMagic)+16 || string(b[:len(manifestMagic)]) != manifestMagic {
		return nil, bad("no manifest magic")
	}
	b = b[len(manifestMagic):]
	fileSize := binary.LittleEndian.Uint64(b)
	hdrLen := binary.LittleEndian.Uint64(b[8:])
	b = b[16:]
	if hdrLen > MaxManifestHeader || hdrLen > uint64(len(b)) {
		return nil, bad("header of %d bytes, %d present", hdrLen, len(b))
	}
	if fileSize > 1<<50 {
		return nil, bad("file size %d", fileSize)
	}
	hdr, rest := b[:hdrLen], b[hdrLen:]
	f, err := ReadHeader(hdr, int64(fileSize))
	if err != nil {
		return nil, fmt.Errorf("gguf: %w: header: %w", ErrManifest, err)
	}
	if f.HeaderSize != int64(len(hdr)) {
		return nil, bad("header has %d bytes after its last tensor info", int64(len(hdr))-f.HeaderSize)
	}
	if len(rest) < 4 {
		return nil, bad("no tensor count")
	}
	n := binary.LittleEndian.Uint32(rest)
	rest = rest[4:]
	if uint64(n) != uint64(len(f.Tensors)) || uint64(len(rest)) != 32*uint64(n) {
		return nil, bad("%d tensor hashes in %d bytes for %d tensors", n, len(rest), len(f.Tensors))
	}
	hashes := make([]Digest, n)
	for i := range hashes {
		copy(hashes[i][:], rest[32*i:])
	}
	dg, err := DigestsFromHashes(f, hashes)
	if err != nil {
		return nil, fmt.Errorf("gguf: %w: %w", ErrManifest, err)
	}
	if len(dg.Layers) == 0 {
		return nil, bad("model has no layers")
	}
	return &Manifest{File: f, Header: bytes.Clone(hdr), Digests: dg}, nil
}

// CheckManifest parses b and checks it proves model fingerprint fp
// (ErrWrongModel otherwise).
func CheckManifest(b []byte, fp string) (*Manifest, error) {
	m, err := ParseManifest(b)
	if err != nil {
		return nil, err
	}
	if got := m.Fingerprint(); got != fp {
		return nil, fmt.Errorf("gguf: manifest: %w: it hashes to %.16s…, want %.16s…", ErrWrongModel, got, fp)
	}
	return m, nil
}

// ReadManifestFile reads and checks a manifest file against fp.
func ReadManifestFile(path, fp string) (*Manifest, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	b, err := io.ReadAll(io.LimitReader(fh, int64(MaxManifestBytes)+1))
	if err != nil {
		return nil, err
	}
	return CheckManifest(b, fp)
}

// ShardSourceNames maps each tensor of shard file f whose data is a copy of
// a tensor of the parent model to that parent tensor's name (blk.j of a
// shard of [a,b) is the parent's blk.(a+j); a tail's token_embd is the
// parent's output.weight when it has one). The middle shard's stand-ins map
// to nothing. It reads the shard's claims (ReadShardInfo) without checking
// them; serve only verified shards.
func ShardSourceNames(f *File) (map[string]string, *ShardInfo, error) {
	si, err := ReadShardInfo(f.Metadata)
	if err != nil {
		return nil, nil, err
	}
	untied := false
	if v, ok := f.Metadata.Get(KeyParentGlobalNames); ok {
		names, _ := v.([]string)
		untied = slices.Contains(names, output)
	}
	out := map[string]string{}
	for i := range f.Tensors {
		name := f.Tensors[i].Name
		idx, rest, isLayer, err := splitLayerName(name)
		if err != nil {
			return nil, nil, err
		}
		switch {
		case isLayer:
			out[layerName(si.Range.Start+idx, rest)] = name
		case name == tokenEmbd:
			switch {
			case si.Role == RoleMiddle:
			case si.Role == RoleTail && untied:
				out[output] = name
			default:
				out[tokenEmbd] = name
			}
		case name == outputNorm:
			if si.Role != RoleMiddle {
				out[name] = name
			}
		default:
			out[name] = name
		}
	}
	return out, si, nil
}
