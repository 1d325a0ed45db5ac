package gguf

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// WriteTensor is one tensor to write. Data supplies exactly
// TensorBytes(Type, Shape) bytes starting at offset 0; it is read
// sequentially in chunks, so it may be a section of another file or a
// generator (memory use does not depend on the tensor size).
type WriteTensor struct {
	Name  string
	Type  TensorType
	Shape []uint64
	Data  io.ReaderAt
}

// copyChunk is the unit of streaming I/O (and of context checks).
const copyChunk = 1 << 20

// Write writes a GGUF v3 file: header (md in order, then the tensor infos in
// order) and the tensor data, each tensor aligned to general.alignment (or
// 32). progress, if not nil, is called after every chunk with the tensor
// bytes written so far and their total.
func Write(ctx context.Context, w io.Writer, md Metadata, tensors []WriteTensor, progress func(done, total int64)) error {
	align, err := writeAlignment(md)
	if err != nil {
		return err
	}
	hdr := []byte(Magic)
	hdr = binary.LittleEndian.AppendUint32(hdr, 3)
	hdr = binary.LittleEndian.AppendUint64(hdr, uint64(len(tensors)))
	hdr = binary.LittleEndian.AppendUint64(hdr, uint64(len(md)))
	if hdr, err = appendMetadata(hdr, md); err != nil {
		return err
	}
	hdr, sizes, total, err := appendTensorInfos(hdr, tensors, align)
	if err != nil {
		return err
	}
	if len(tensors) > 0 { // as llama.cpp: a file without tensors ends after the header
		hdr = append(hdr, make([]byte, alignUp(uint64(len(hdr)), align)-uint64(len(hdr)))...)
	}
	if _, err := w.Write(hdr); err != nil {
		return fmt.Errorf("gguf: write header: %w", err)
	}
	return writeData(ctx, w, tensors, sizes, align, int64(total), progress)
}

// writeAlignment returns the data alignment md asks for: general.alignment,
// which must be a uint32 power of two, or DefaultAlignment.
func writeAlignment(md Metadata) (uint64, error) {
	align := uint64(DefaultAlignment)
	if v, ok := md.Get(KeyAlignment); ok {
		a, isU32 := v.(uint32)
		if !isU32 || a == 0 || a&(a-1) != 0 {
			return 0, fmt.Errorf("gguf: write: %w: %s must be a uint32 power of two", ErrInvalidMetadata, KeyAlignment)
		}
		align = uint64(a)
	}
	return align, nil
}

// appendMetadata appends md, in order, to hdr; keys must be non-empty and
// unique.
func appendMetadata(hdr []byte, md Metadata) ([]byte, error) {
	keys := make(map[string]struct{}, len(md))
	for _, kv := range md {
		if kv.Key == "" {
			return nil, fmt.Errorf("gguf: write: %w: empty key", ErrInvalidMetadata)
		}
		if _, dup := keys[kv.Key]; dup {
			return nil, fmt.Errorf("gguf: write: %w: duplicate key %q", ErrInvalidMetadata, kv.Key)
		}
		keys[kv.Key] = struct{}{}
		var err error
		if hdr, err = appendKV(hdr, kv); err != nil {
			return nil, fmt.Errorf("gguf: write: %w", err)
		}
	}
	return hdr, nil
}

// appendTensorInfos appends the tensor infos, in order, to hdr, each tensor
// at the next align boundary of the data section. Names must be valid and
// unique, shapes valid for their type, and a non-empty tensor needs a data
// source. It returns each tensor's data size and their total.
func appendTensorInfos(hdr []byte, tensors []WriteTensor, align uint64) (_ []byte, sizes []uint64, total uint64, err error) {
	sizes = make([]uint64, len(tensors))
	names := make(map[string]struct{}, len(tensors))
	var off uint64
	for i, t := range tensors {
		if len(t.Name) == 0 || len(t.Name) > MaxTensorName {
			return nil, nil, 0, fmt.Errorf("gguf: write: %w: tensor name %q (want 1..%d bytes)", ErrInvalidTensor, t.Name, MaxTensorName)
		}
		if _, dup := names[t.Name]; dup {
			return nil, nil, 0, fmt.Errorf("gguf: write: %w: duplicate tensor %q", ErrInvalidTensor, t.Name)
		}
		names[t.Name] = struct{}{}
		n, err := TensorBytes(t.Type, t.Shape)
		if err != nil {
			return nil, nil, 0, fmt.Errorf("gguf: write: tensor %q: %w", t.Name, err)
		}
		if t.Data == nil && n > 0 {
			return nil, nil, 0, fmt.Errorf("gguf: write: tensor %q has no data source", t.Name)
		}
		sizes[i] = n
		hdr = appendString(hdr, t.Name)
		hdr = binary.LittleEndian.AppendUint32(hdr, uint32(len(t.Shape)))
		for _, dim := range t.Shape {
			hdr = binary.LittleEndian.AppendUint64(hdr, dim)
		}
		hdr = binary.LittleEndian.AppendUint32(hdr, uint32(t.Type))
		hdr = binary.LittleEndian.AppendUint64(hdr, off)
		off = alignUp(off+n, align)
		total += n
	}
	return hdr, sizes, total, nil
}

// writeData copies the data of every tensor (sizes[i] bytes of
// tensors[i].Data) to w in copyChunk chunks, checking ctx before each,
// and pads every tensor, the last one too, to align, as llama.cpp's writer
// does (its reader sizes the data section with padded sizes).
func writeData(ctx context.Context, w io.Writer, tensors []WriteTensor, sizes []uint64, align uint64, total int64, progress func(done, total int64)) error {
	buf := make([]byte, copyChunk)
	var done int64
	for i, t := range tensors {
		var err error
		if done, err = copyTensor(ctx, w, t, int64(sizes[i]), buf, done, total, progress); err != nil {
			return err
		}
		if pad := alignUp(sizes[i], align) - sizes[i]; pad > 0 {
			clear(buf[:pad])
			if _, err := w.Write(buf[:pad]); err != nil {
				return fmt.Errorf("gguf: write padding: %w", err)
			}
		}
	}
	return nil
}

// copyTensor copies the n bytes of t.Data to w through buf, reporting
// progress after every chunk; done is the count of bytes written before t,
// and it returns the count after it. A short read is io.ErrUnexpectedEOF.
func copyTensor(ctx context.Context, w io.Writer, t WriteTensor, n int64, buf []byte, done, total int64, progress func(done, total int64)) (int64, error) {
	for pos := int64(0); pos < n; {
		if err := ctx.Err(); err != nil {
			return done, err
		}
		chunk := buf[:min(int64(len(buf)), n-pos)]
		m, err := t.Data.ReadAt(chunk, pos)
		if m < len(chunk) {
			if err == nil || errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return done, fmt.Errorf("gguf: write: reading data of tensor %q at %d: %w", t.Name, pos, err)
		}
		if _, err := w.Write(chunk); err != nil {
			return done, fmt.Errorf("gguf: write data of tensor %q: %w", t.Name, err)
		}
		pos += int64(m)
		done += int64(m)
		if progress != nil {
			progress(done, total)
		}
	}
	return done, nil
}

// WriteFile writes a GGUF file atomically: to a temporary file in the same
// directory, synced, then renamed over path. On any error nothing is left
// behind.
//
// Once synced, the file's pages are dropped from the page cache (Linux):
// a shard is mapped by the engine right after it is written, and the
// pages a buffered write leaves are small ones (mapped 4 KiB at a time),
// while pages the mapping reads back come in readahead's large folios,
// mapped with 2 MiB entries (smaps' FilePmdMapped: 0 against 86% of a
// 303 MB model, docs/performance.md). On the
// 2-vCPU VM of docs/performance.md a single-thread decode streamed the
// weights 1.3-3x slower from written pages than from read-back ones, and
// slower the longer the process ran. It also keeps a split of a large
// model from filling the page cache with a second copy of its bytes.
func WriteFile(ctx context.Context, path string, md Metadata, tensors []WriteTensor, progress func(done, total int64)) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	bw := bufio.NewWriterSize(tmp, copyChunk)
	if err = Write(ctx, bw, md, tensors, progress); err != nil {
		return err
	}
	if err = bw.Flush(); err != nil {
		return err
	}
	if err = tmp.Chmod(0o644); err != nil {
		return err
	}
	if err = tmp.Sync(); err != nil {
		return err
	}
	dropPageCache(tmp)
	if err = tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// fillReaderAt serves a constant byte pattern (used for stand-in tensors).
type fillReaderAt struct {
	pattern []byte // repeated; len divides every offset used
	size    int64
}

func (f fillReaderAt) ReadAt(p []byte, off int64) (int, error) {
	if off >= f.size {
		return 0, io.EOF
	}
	n := 0
	for n < len(p) && off+int64(n) < f.size {
		p[n] = f.pattern[(off+int64(n))%int64(len(f.pattern))]
		n++
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}
