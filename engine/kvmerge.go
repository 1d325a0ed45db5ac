package engine

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Restoring a compaction in one piece. llama.cpp restores one sequence's
// saved cells (llama_state_seq_set_data with a sequence id) through a
// micro-batch whose positions it sizes at one per cell, but when the model
// ropes with M-RoPE it reads three per cell from it (apply_ubatch's 2-D
// cell extension): a heap over-read of 8 bytes per restored cell, a crash
// once the buffer sits at the edge of a mapping (docs/architectures.md,
// glm4moe). Its whole-cache restore (sequence id -1) reads no positions
// beyond the saved ones and puts the saved cells at [0, n) in the order
// saved. So an M-RoPE shard's compaction merges the sequences' saved
// blobs into one whole-cache blob, in the same order and with the same
// bytes as the one-by-one restores would lay them out, and restores it in
// one call.

// errStateBlob is a saved state blob this code cannot read (a llama.cpp
// whose layout differs): the compaction falls back to one-by-one
// restores.
var errStateBlob = errors.New("unreadable KV state blob")

// stateReader walks one llama.cpp KV state blob (llama_kv_cache::
// state_write, one stream).
type stateReader struct {
	b   []byte
	off int
	err error
}

func (r *stateReader) take(n uint64) []byte {
	if r.err != nil {
		return nil
	}
	if n > uint64(len(r.b)-r.off) {
		r.err = fmt.Errorf("%w: %d bytes wanted at offset %d of %d", errStateBlob, n, r.off, len(r.b))
		return nil
	}
	p := r.b[r.off : r.off+int(n)]
	r.off += int(n)
	return p
}

func (r *stateReader) u32() uint32 {
	if p := r.take(4); p != nil {
		return binary.LittleEndian.Uint32(p)
	}
	return 0
}

// stateLayer is one layer's K or V section: its header (type and row or
// element sizes) and, per row of V when transposed or once otherwise,
// the cells' bytes.
type stateLayer struct {
	header []byte
	rows   [][]byte
}

// seqState is one sequence's blob, split at the places a merge
// interleaves.
type seqState struct {
	cells  uint32
	meta   []byte
	vTrans uint32
	k, v   []stateLayer
}

// maxStateLayers bounds the layer count a blob may claim (llama.cpp's
// largest models have ~128).
const maxStateLayers = 4096

// maxStateWidth bounds a transposed V section's row count and element
// size (a layer's GQA width is at most a few tens of thousands).
const maxStateWidth = 1 << 20

// parseSeqState splits a blob of one stream.
func parseSeqState(b []byte) (seqState, error) {
	r := &stateReader{b: b}
	var st seqState
	if n := r.u32(); r.err == nil && n != 1 {
		return st, fmt.Errorf("%w: %d streams (the engine runs one)", errStateBlob, n)
	}
	st.cells = r.u32()
	if r.err != nil || st.cells == 0 {
		return st, r.tail()
	}
	metaAt := r.off
	for i := uint32(0); i < st.cells && r.err == nil; i++ {
		r.take(4) // position
		n := r.u32()
		r.take(4 * uint64(n))
	}
	st.meta = b[metaAt:min(r.off, len(b))]
	st.vTrans = r.u32()
	nLayer := r.u32()
	if r.err == nil && nLayer > maxStateLayers {
		return st, fmt.Errorf("%w: %d layers", errStateBlob, nLayer)
	}
	cells := uint64(st.cells)
	for i := uint32(0); i < nLayer && r.err == nil; i++ {
		h := r.take(12) // type, row size
		if h == nil {
			break
		}
		st.k = append(st.k, stateLayer{header: h, rows: [][]byte{r.take(cells * binary.LittleEndian.Uint64(h[4:]))}})
	}
	for i := uint32(0); i < nLayer && r.err == nil; i++ {
		if st.vTrans == 0 {
			h := r.take(12)
			if h == nil {
				break
			}
			st.v = append(st.v, stateLayer{header: h, rows: [][]byte{r.take(cells * binary.LittleEndian.Uint64(h[4:]))}})
			continue
		}
		h := r.take(12) // type, element size, GQA width
		if h == nil {
			break
		}
		el, width := uint64(binary.LittleEndian.Uint32(h[4:])), binary.LittleEndian.Uint32(h[8:])
		if width > maxStateWidth || el > maxStateWidth {
			return st, fmt.Errorf("%w: V rows of %d elements of %d bytes", errStateBlob, width, el)
		}
		l := stateLayer{header: h, rows: make([][]byte, 0, width)}
		for j := uint32(0); j < width && r.err == nil; j++ {
			l.rows = append(l.rows, r.take(cells*el))
		}
		st.v = append(st.v, l)
	}
	return st, r.tail()
}

// tail reports a read error, or bytes left over (a layout this code does
// not know).
func (r *stateReader) tail() error {
	if r.err != nil {
		return r.err
	}
	if r.off != len(r.b) {
		return fmt.Errorf("%w: %d bytes after the last layer", errStateBlob, len(r.b)-r.off)
	}
	return nil
}

// mergeSeqStates writes the blobs (each one sequence's, as
// llama_state_seq_get_data saves it) as one whole-cache blob into dst,
// which must hold the sum of their sizes, and returns the bytes written
// and the cells the blob restores. Every blob must have the layers,
// types and row sizes of the first.
func mergeSeqStates(dst []byte, blobs [][]byte) (int, uint32, error) {
	var sts []seqState
	var cells uint64
	for i, b := range blobs {
		st, err := parseSeqState(b)
		if err != nil {
			return 0, 0, fmt.Errorf("sequence blob %d: %w", i, err)
		}
		if st.cells == 0 {
			continue
		}
		if len(sts) > 0 {
			if err := sameLayout(sts[0], st); err != nil {
				return 0, 0, fmt.Errorf("sequence blob %d: %w", i, err)
			}
		}
		sts = append(sts, st)
		cells += uint64(st.cells)
	}
	w := stateWriter{b: dst}
	w.u32(1)
	w.u32(uint32(cells))
	if len(sts) == 0 || cells > 1<<31 {
		if cells > 1<<31 {
			return 0, 0, fmt.Errorf("%w: %d cells", errStateBlob, cells)
		}
		return w.off, 0, w.err
	}
	for _, st := range sts {
		w.put(st.meta)
	}
	w.u32(sts[0].vTrans)
	w.u32(uint32(len(sts[0].k)))
	for _, part := range []func(seqState) []stateLayer{func(s seqState) []stateLayer { return s.k }, func(s seqState) []stateLayer { return s.v }} {
		for l, first := range part(sts[0]) {
			w.put(first.header)
			for j := range first.rows {
				for _, st := range sts {
					w.put(part(st)[l].rows[j])
				}
			}
		}
	}
	return w.off, uint32(cells), w.err
}

// sameLayout reports how b's layers differ from a's.
func sameLayout(a, b seqState) error {
	if a.vTrans != b.vTrans || len(a.k) != len(b.k) || len(a.v) != len(b.v) {
		return fmt.Errorf("%w: layout differs from the first blob's", errStateBlob)
	}
	for i := range a.k {
		if string(a.k[i].header) != string(b.k[i].header) {
			return fmt.Errorf("%w: layer %d's K differs from the first blob's", errStateBlob, i)
		}
	}
	for i := range a.v {
		if string(a.v[i].header) != string(b.v[i].header) || len(a.v[i].rows) != len(b.v[i].rows) {
			return fmt.Errorf("%w: layer %d's V differs from the first blob's", errStateBlob, i)
		}
	}
	return nil
}

// stateWriter fills a blob.
type stateWriter struct {
	b   []byte
	off int
	err error
}

func (w *stateWriter) put(p []byte) {
	if w.err != nil {
		return
	}
	if len(p) > len(w.b)-w.off {
		w.err = fmt.Errorf("%w: merged blob larger than its parts", errStateBlob)
		return
	}
	w.off += copy(w.b[w.off:], p)
}

func (w *stateWriter) u32(v uint32) {
	w.put(binary.LittleEndian.AppendUint32(nil, v))
}
