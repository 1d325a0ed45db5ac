package gguf

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
)

// Errors returned (wrapped in *FormatError) for malformed files.
var (
	ErrBadMagic           = errors.New("not a GGUF file (bad magic)")
	ErrUnsupportedVersion = errors.New("unsupported GGUF version")
	// ErrTruncated: the file ends before what the header declares.
	ErrTruncated = errors.New("file is truncated")
	// ErrTooLarge: a count, length or offset that cannot fit (more than
	// 1 TiB beyond the end of the file, or over MaxMetadataBytes).
	ErrTooLarge          = errors.New("count or length exceeds the file")
	ErrInvalidMetadata   = errors.New("invalid metadata")
	ErrInvalidTensor     = errors.New("invalid tensor info")
	ErrUnknownTensorType = errors.New("unknown tensor type")
)

// FormatError reports a malformed GGUF file: where the problem was found and
// which kind (errors.Is with the Err* sentinels above).
type FormatError struct {
	Offset int64 // byte offset in the file, -1 when not tied to one place
	Err    error
}

func (e *FormatError) Error() string {
	if e.Offset < 0 {
		return "gguf: " + e.Err.Error()
	}
	return fmt.Sprintf("gguf: at byte %d: %v", e.Offset, e.Err)
}

func (e *FormatError) Unwrap() error { return e.Err }

const (
	// Magic is the first four bytes of every GGUF file.
	Magic = "GGUF"
	// DefaultAlignment is the tensor data alignment when general.alignment is absent.
	DefaultAlignment = 32
	// MaxDims is ggml's GGML_MAX_DIMS.
	MaxDims = 4
	// MaxTensorName is the longest tensor name llama.cpp accepts (GGML_MAX_NAME-1).
	MaxTensorName = 63
	// MaxMetadataBytes bounds the header (metadata + tensor infos) this
	// reader will hold in memory, whatever the file size.
	MaxMetadataBytes = 512 << 20
	// KeyAlignment is the metadata key of the data alignment.
	KeyAlignment = "general.alignment"
	// KeyArchitecture is the metadata key of the model architecture.
	KeyArchitecture = "general.architecture"
)

// TensorInfo describes one tensor; Offset is relative to File.DataOffset.
type TensorInfo struct {
	Name   string
	Type   TensorType
	Shape  []uint64 // ggml order: ne0 (row length) first
	Offset uint64
	Bytes  uint64
}

// Elements returns the number of elements.
func (t *TensorInfo) Elements() uint64 {
	n := uint64(1)
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// File is a parsed GGUF file. Tensor data is not read until asked for.
type File struct {
	Version    uint32
	Metadata   Metadata
	Tensors    []TensorInfo // file order
	Alignment  uint64
	DataOffset int64 // absolute offset of the tensor data section
	Size       int64 // file size
	// HeaderSize is the end of the last tensor info: the bytes a Manifest
	// carries (the data section starts at the next alignment boundary).
	HeaderSize int64

	r      io.ReaderAt
	closer io.Closer
}

// Open opens and parses the GGUF file at path. Close it when done.
func Open(path string) (*File, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	st, err := fh.Stat()
	if err != nil {
		fh.Close()
		return nil, err
	}
	f, err := Read(fh, st.Size())
	if err != nil {
		fh.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	f.closer = fh
	return f, nil
}

// Close releases the underlying file when the File came from Open.
func (f *File) Close() error {
	if f.closer != nil {
		return f.closer.Close()
	}
	return nil
}

// Tensor returns the tensor named name.
func (f *File) Tensor(name string) (*TensorInfo, bool) {
	for i := range f.Tensors {
		if f.Tensors[i].Name == name {
			return &f.Tensors[i], true
		}
	}
	return nil, false
}

// TensorData returns a reader over the data of t (one of f.Tensors).
func (f *File) TensorData(t *TensorInfo) *io.SectionReader {
	return io.NewSectionReader(f.r, f.DataOffset+int64(t.Offset), int64(t.Bytes))
}

// Architecture returns general.architecture ("" when absent).
func (f *File) Architecture() string {
	s, _ := f.Metadata.String(KeyArchitecture)
	return s
}

// Read parses a GGUF v2/v3 file (little-endian) of the given size from r.
// Every count and length is checked against the bytes left in the file (and
// MaxMetadataBytes) before anything is allocated, so corrupt or hostile input
// yields a *FormatError, never a panic or an allocation larger than the file.
func Read(r io.ReaderAt, size int64) (*File, error) {
	if size < 0 {
		return nil, &FormatError{-1, fmt.Errorf("%w: negative size", ErrTruncated)}
	}
	d := &decoder{
		br:       bufio.NewReaderSize(io.NewSectionReader(r, 0, size), 64<<10),
		size:     size,
		fileSize: size,
		budget:   MaxMetadataBytes,
	}
	f, err := d.file()
	if err != nil {
		var fe *FormatError
		if !errors.As(err, &fe) {
			err = &FormatError{d.pos, err}
		}
		return nil, err
	}
	f.r = r
	return f, nil
}

// ReadHeader parses a GGUF header given as bytes (magic through the last
// tensor info, as File.HeaderSize counts them) of a file of fileSize bytes
// whose data is not present. Every count and length is checked against
// len(hdr), not fileSize, so the work and memory are bounded by the bytes
// actually given, whatever the claimed file size. The returned File has no
// data until WithData. A header cut short returns ErrTruncated.
func ReadHeader(hdr []byte, fileSize int64) (*File, error) {
	if fileSize < int64(len(hdr)) {
		return nil, &FormatError{-1, fmt.Errorf("%w: file size %d is below the header's %d bytes", ErrTruncated, fileSize, len(hdr))}
	}
	d := &decoder{
		br:       bufio.NewReaderSize(bytes.NewReader(hdr), 64<<10),
		size:     int64(len(hdr)),
		fileSize: fileSize,
		budget:   MaxMetadataBytes,
	}
	f, err := d.file()
	if err != nil {
		var fe *FormatError
		if !errors.As(err, &fe) {
			err = &FormatError{d.pos, err}
		}
		return nil, err
	}
	return f, nil
}

// WithData returns a copy of f whose tensor data is read from r, at the
// absolute file offsets of f (DataOffset + TensorInfo.Offset).
func (f *File) WithData(r io.ReaderAt) *File {
	c := *f
	c.r, c.closer = r, nil
	return &c
}

type decoder struct {
	br   *bufio.Reader
	pos  int64
	size int64 // bytes present: every count and length is checked against it
	// fileSize is the size of the whole file the tensors must fit in
	// (size, unless only the header is present: ReadHeader).
	fileSize int64
	budget   int64
	scr      [8]byte
}

func (d *decoder) fail(err error) error { return &FormatError{d.pos, err} }

// need checks that n more bytes can exist (in the file and the header budget).
func (d *decoder) need(n uint64, what string, args ...any) error {
	left := uint64(d.size - d.pos)
	if n <= left && n <= uint64(d.budget) {
		return nil
	}
	if len(args) > 0 {
		what = fmt.Sprintf(what, args...)
	}
	if n > left {
		if n > 1<<40 {
			return d.fail(fmt.Errorf("%w: %s needs %d bytes, %d left", ErrTooLarge, what, n, left))
		}
		return d.fail(fmt.Errorf("%w: %s needs %d bytes, %d left", ErrTruncated, what, n, left))
	}
	if n > uint64(d.budget) {
		return d.fail(fmt.Errorf("%w: %s needs %d bytes, over the %d-byte header limit", ErrTooLarge, what, n, MaxMetadataBytes))
	}
	return nil
}

func (d *decoder) read(p []byte, what string) error {
	if err := d.need(uint64(len(p)), what); err != nil {
		return err
	}
	if _, err := io.ReadFull(d.br, p); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return d.fail(fmt.Errorf("%w: reading %s", ErrTruncated, what))
		}
		return d.fail(fmt.Errorf("reading %s: %w", what, err))
	}
	d.pos += int64(len(p))
	d.budget -= int64(len(p))
	return nil
}

func (d *decoder) u8(what string) (uint8, error) {
	err := d.read(d.scr[:1], what)
	return d.scr[0], err
}

func (d *decoder) u16(what string) (uint16, error) {
	err := d.read(d.scr[:2], what)
	return binary.LittleEndian.Uint16(d.scr[:2]), err
}

func (d *decoder) u32(what string) (uint32, error) {
	err := d.read(d.scr[:4], what)
	return binary.LittleEndian.Uint32(d.scr[:4]), err
}

func (d *decoder) u64(what string) (uint64, error) {
	err := d.read(d.scr[:8], what)
	return binary.LittleEndian.Uint64(d.scr[:8]), err
}

func (d *decoder) str(what string) (string, error) {
	n, err := d.u64(what)
	if err != nil {
		return "", err
	}
	if err := d.need(n, what); err != nil {
		return "", err
	}
	b := make([]byte, n)
	if err := d.read(b, what); err != nil {
		return "", err
	}
	return string(b), nil
}

// file decodes a whole header: the counts, the metadata, then the tensor
// infos, and checks the last tensor ends inside the file.
func (d *decoder) file() (*File, error) {
	version, nTensors, nKV, err := d.header()
	if err != nil {
		return nil, err
	}
	f := &File{Version: version, Size: d.fileSize, Alignment: DefaultAlignment}
	if f.Metadata, err = d.metadata(nKV); err != nil {
		return nil, err
	}
	if v, ok := f.Metadata.Get(KeyAlignment); ok {
		a, isU32 := v.(uint32)
		if !isU32 || a == 0 || a&(a-1) != 0 {
			return nil, &FormatError{-1, fmt.Errorf("%w: %s must be a uint32 power of two, got %T %v", ErrInvalidMetadata, KeyAlignment, v, v)}
		}
		f.Alignment = uint64(a)
	}
	if f.Tensors, err = d.tensorInfos(nTensors, f.Alignment); err != nil {
		return nil, err
	}
	f.HeaderSize = d.pos
	f.DataOffset = int64(alignUp(uint64(d.pos), f.Alignment))
	if len(f.Tensors) > 0 {
		last := f.Tensors[len(f.Tensors)-1]
		end := uint64(f.DataOffset) + last.Offset + last.Bytes
		if end > uint64(d.fileSize) {
			return nil, &FormatError{-1, fmt.Errorf("%w: tensor %q ends at byte %d, file has %d", ErrTruncated, last.Name, end, d.fileSize)}
		}
	}
	return f, nil
}

// header decodes the magic, the version and the two counts, and checks the
// counts against the bytes left (at their minimal encodings) before anything
// is allocated for them.
func (d *decoder) header() (version uint32, nTensors, nKV uint64, err error) {
	var magic [4]byte
	if err := d.read(magic[:], "magic"); err != nil {
		return 0, 0, 0, err
	}
	if string(magic[:]) != Magic {
		return 0, 0, 0, &FormatError{0, fmt.Errorf("%w: %q", ErrBadMagic, magic[:])}
	}
	if version, err = d.u32("version"); err != nil {
		return 0, 0, 0, err
	}
	if version != 2 && version != 3 {
		return 0, 0, 0, &FormatError{4, fmt.Errorf("%w: %d (want 2 or 3, little-endian)", ErrUnsupportedVersion, version)}
	}
	if nTensors, err = d.u64("tensor count"); err != nil {
		return 0, 0, 0, err
	}
	if nKV, err = d.u64("metadata count"); err != nil {
		return 0, 0, 0, err
	}
	// Minimal encodings: a KV is at least key length (8) + type (4) + 1
	// byte; a tensor info at least name length (8) + n_dims (4) + type (4)
	// + offset (8).
	if nKV > math.MaxUint64/13 {
		return 0, 0, 0, d.fail(fmt.Errorf("%w: %d metadata pairs", ErrTooLarge, nKV))
	}
	if err := d.need(nKV*13, "%d metadata pairs", nKV); err != nil {
		return 0, 0, 0, err
	}
	if nTensors > math.MaxUint64/24 {
		return 0, 0, 0, d.fail(fmt.Errorf("%w: %d tensors", ErrTooLarge, nTensors))
	}
	if err := d.need(nTensors*24, "%d tensor infos", nTensors); err != nil {
		return 0, 0, 0, err
	}
	// Both products are now below the file size, so the sum cannot overflow.
	if err := d.need(nKV*13+nTensors*24, "%d metadata pairs and %d tensor infos", nKV, nTensors); err != nil {
		return 0, 0, 0, err
	}
	return version, nTensors, nKV, nil
}

// metadata decodes nKV key-value pairs (nKV checked by header); keys must be
// unique.
func (d *decoder) metadata(nKV uint64) (Metadata, error) {
	md := make(Metadata, 0, nKV)
	seen := make(map[string]struct{}, nKV)
	for i := uint64(0); i < nKV; i++ {
		kv, err := d.kv()
		if err != nil {
			return nil, err
		}
		if _, dup := seen[kv.Key]; dup {
			return nil, d.fail(fmt.Errorf("%w: duplicate key %q", ErrInvalidMetadata, kv.Key))
		}
		seen[kv.Key] = struct{}{}
		md = append(md, kv)
	}
	return md, nil
}

// tensorInfos decodes nTensors tensor infos (nTensors checked by header):
// names must be unique, and each tensor must start exactly where the one
// before ends, aligned to align (llama.cpp requires exact packing).
func (d *decoder) tensorInfos(nTensors, align uint64) ([]TensorInfo, error) {
	ts := make([]TensorInfo, 0, nTensors)
	names := make(map[string]struct{}, nTensors)
	var want uint64 // expected offset of the next tensor
	for i := uint64(0); i < nTensors; i++ {
		at := d.pos
		t, err := d.tensorInfo()
		if err != nil {
			return nil, err
		}
		if _, dup := names[t.Name]; dup {
			return nil, &FormatError{at, fmt.Errorf("%w: duplicate tensor %q", ErrInvalidTensor, t.Name)}
		}
		names[t.Name] = struct{}{}
		if t.Offset != want {
			return nil, &FormatError{at, fmt.Errorf("%w: tensor %q at data offset %d, expected %d", ErrInvalidTensor, t.Name, t.Offset, want)}
		}
		want = alignUp(t.Offset+t.Bytes, align)
		ts = append(ts, t)
	}
	return ts, nil
}

func alignUp(n, a uint64) uint64 { return (n + a - 1) / a * a }

func (d *decoder) tensorInfo() (TensorInfo, error) {
	var t TensorInfo
	name, err := d.str("tensor name")
	if err != nil {
		return t, err
	}
	if len(name) == 0 || len(name) > MaxTensorName {
		return t, d.fail(fmt.Errorf("%w: tensor name of %d bytes (want 1..%d)", ErrInvalidTensor, len(name), MaxTensorName))
	}
	t.Name = name
	nd, err := d.u32("tensor n_dims")
	if err != nil {
		return t, err
	}
	if nd > MaxDims {
		return t, d.fail(fmt.Errorf("%w: tensor %q has %d dimensions (max %d)", ErrInvalidTensor, name, nd, MaxDims))
	}
	t.Shape = make([]uint64, nd)
	for j := range t.Shape {
		if t.Shape[j], err = d.u64("tensor dimension"); err != nil {
			return t, err
		}
		if t.Shape[j] > math.MaxInt64 {
			return t, d.fail(fmt.Errorf("%w: tensor %q dimension %d is negative", ErrInvalidTensor, name, j))
		}
	}
	typ, err := d.u32("tensor type")
	if err != nil {
		return t, err
	}
	t.Type = TensorType(typ)
	if !t.Type.Known() {
		return t, d.fail(fmt.Errorf("%w: tensor %q has type %d", ErrUnknownTensorType, name, typ))
	}
	if t.Bytes, err = TensorBytes(t.Type, t.Shape); err != nil {
		return t, d.fail(fmt.Errorf("tensor %q: %w", name, err))
	}
	if t.Offset, err = d.u64("tensor offset"); err != nil {
		return t, err
	}
	// Both are bounded by maxElements*8 and the file size check happens
	// against the whole data section, so no sum below can overflow once
	// this holds.
	if t.Offset > math.MaxInt64/2 {
		return t, d.fail(fmt.Errorf("%w: tensor %q offset %d", ErrTooLarge, name, t.Offset))
	}
	return t, nil
}

func (d *decoder) kv() (KV, error) {
	key, err := d.str("metadata key")
	if err != nil {
		return KV{}, err
	}
	if key == "" {
		return KV{}, d.fail(fmt.Errorf("%w: empty key", ErrInvalidMetadata))
	}
	t, err := d.u32("value type")
	if err != nil {
		return KV{}, err
	}
	typ := ValueType(t)
	if typ != ValArray {
		if typ.fixedSize() < 0 {
			return KV{}, d.fail(fmt.Errorf("%w: key %q has unknown value type %d", ErrInvalidMetadata, key, t))
		}
		v, err := d.scalar(typ, key)
		return KV{key, v}, err
	}
	et, err := d.u32("array element type")
	if err != nil {
		return KV{}, err
	}
	elem := ValueType(et)
	if elem == ValArray || elem.fixedSize() < 0 {
		return KV{}, d.fail(fmt.Errorf("%w: key %q has array element type %d", ErrInvalidMetadata, key, et))
	}
	n, err := d.u64("array length")
	if err != nil {
		return KV{}, err
	}
	min := uint64(elem.fixedSize())
	if elem == ValString {
		min = 8
	}
	if n > math.MaxInt64/min {
		return KV{}, d.fail(fmt.Errorf("%w: key %q array of %d", ErrTooLarge, key, n))
	}
	if err := d.need(n*min, "key %q array of %d %s", key, n, elem); err != nil {
		return KV{}, err
	}
	v, err := d.array(elem, int(n), key)
	return KV{key, v}, err
}

func (d *decoder) scalar(typ ValueType, key string) (any, error) {
	switch typ {
	case ValUint8:
		return d.u8(key)
	case ValInt8:
		v, err := d.u8(key)
		return int8(v), err
	case ValUint16:
		return d.u16(key)
	case ValInt16:
		v, err := d.u16(key)
		return int16(v), err
	case ValUint32:
		return d.u32(key)
	case ValInt32:
		v, err := d.u32(key)
		return int32(v), err
	case ValFloat32:
		v, err := d.u32(key)
		return math.Float32frombits(v), err
	case ValBool:
		v, err := d.u8(key)
		if err == nil && v > 1 {
			return nil, d.fail(fmt.Errorf("%w: key %q bool value %d", ErrInvalidMetadata, key, v))
		}
		return v == 1, err
	case ValString:
		return d.str(key)
	case ValUint64:
		return d.u64(key)
	case ValInt64:
		v, err := d.u64(key)
		return int64(v), err
	case ValFloat64:
		v, err := d.u64(key)
		return math.Float64frombits(v), err
	}
	return nil, d.fail(fmt.Errorf("%w: key %q has value type %d", ErrInvalidMetadata, key, typ))
}

// array reads n elements; the caller has checked n*minsize against the file.
func (d *decoder) array(elem ValueType, n int, key string) (any, error) {
	if elem == ValString {
		out, err := d.stringArray(n, key)
		if err != nil {
			return nil, err
		}
		return out, nil
	}
	raw := make([]byte, n*elem.fixedSize())
	if err := d.read(raw, key); err != nil {
		return nil, err
	}
	switch elem {
	case ValUint8:
		return raw, nil
	case ValInt8:
		out := make([]int8, n)
		for i := range out {
			out[i] = int8(raw[i])
		}
		return out, nil
	case ValBool:
		out := make([]bool, n)
		for i := range out {
			if raw[i] > 1 {
				return nil, d.fail(fmt.Errorf("%w: key %q bool value %d", ErrInvalidMetadata, key, raw[i]))
			}
			out[i] = raw[i] == 1
		}
		return out, nil
	case ValUint16, ValInt16, ValUint32, ValInt32, ValFloat32:
		return decodeWords(elem, raw, n), nil
	case ValUint64, ValInt64, ValFloat64:
		return decodeLongs(elem, raw, n), nil
	}
	return nil, d.fail(fmt.Errorf("%w: key %q element type %d", ErrInvalidMetadata, key, elem))
}

// stringArray reads n strings.
func (d *decoder) stringArray(n int, key string) ([]string, error) {
	out := make([]string, n)
	for i := range out {
		s, err := d.str(key)
		if err != nil {
			return nil, err
		}
		out[i] = s
	}
	return out, nil
}

// decodeWords decodes n little-endian 16- or 32-bit elements of type elem
// (one of ValUint16, ValInt16, ValUint32, ValInt32, ValFloat32) from raw,
// which holds exactly n of them.
func decodeWords(elem ValueType, raw []byte, n int) any {
	le := binary.LittleEndian
	switch elem {
	case ValUint16:
		out := make([]uint16, n)
		for i := range out {
			out[i] = le.Uint16(raw[2*i:])
		}
		return out
	case ValInt16:
		out := make([]int16, n)
		for i := range out {
			out[i] = int16(le.Uint16(raw[2*i:]))
		}
		return out
	case ValUint32:
		out := make([]uint32, n)
		for i := range out {
			out[i] = le.Uint32(raw[4*i:])
		}
		return out
	case ValInt32:
		out := make([]int32, n)
		for i := range out {
			out[i] = int32(le.Uint32(raw[4*i:]))
		}
		return out
	}
	out := make([]float32, n) // ValFloat32
	for i := range out {
		out[i] = math.Float32frombits(le.Uint32(raw[4*i:]))
	}
	return out
}

// decodeLongs decodes n little-endian 64-bit elements of type elem (one of
// ValUint64, ValInt64, ValFloat64) from raw, which holds exactly n of them.
func decodeLongs(elem ValueType, raw []byte, n int) any {
	le := binary.LittleEndian
	switch elem {
	case ValUint64:
		out := make([]uint64, n)
		for i := range out {
			out[i] = le.Uint64(raw[8*i:])
		}
		return out
	case ValInt64:
		out := make([]int64, n)
		for i := range out {
			out[i] = int64(le.Uint64(raw[8*i:]))
		}
		return out
	}
	out := make([]float64, n) // ValFloat64
	for i := range out {
		out[i] = math.Float64frombits(le.Uint64(raw[8*i:]))
	}
	return out
}
