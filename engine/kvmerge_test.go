package engine

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

// blobSpec is a sequence's saved state as llama.cpp lays it out
// (llama_kv_cache::state_write): cells at positions pos of sequence seq,
// layers of K rows of kRow bytes, V rows of vRow bytes or, transposed,
// vWidth rows of one element of vEl bytes per cell. Each cell's bytes are
// its sequence id and position, so a merge that misplaces one shows.
type blobSpec struct {
	seq          int32
	pos          []int32
	layers       int
	kRow, vRow   int
	vTrans       bool
	vWidth, vEl  int
	streams      uint32 // 0: 1
	extra        []byte // appended (trailing garbage)
	cut          int    // bytes dropped at the end
	kTypeOfLayer int32  // type of layer 0's K (0: 1)
}

func (b blobSpec) build() []byte {
	le := binary.LittleEndian
	out := le.AppendUint32(nil, max(b.streams, 1))
	out = le.AppendUint32(out, uint32(len(b.pos)))
	if len(b.pos) == 0 {
		return out
	}
	for _, p := range b.pos {
		out = le.AppendUint32(out, uint32(p))
		out = le.AppendUint32(out, 1)
		out = le.AppendUint32(out, uint32(b.seq))
	}
	vt := uint32(0)
	if b.vTrans {
		vt = 1
	}
	out = le.AppendUint32(out, vt)
	out = le.AppendUint32(out, uint32(b.layers))
	cell := func(p int32, l, n int) []byte {
		c := make([]byte, n)
		for i := range c {
			c[i] = byte(int(b.seq)*31 + int(p)*7 + l*3 + i)
		}
		return c
	}
	for l := range b.layers {
		typ := int32(1)
		if l == 0 && b.kTypeOfLayer != 0 {
			typ = b.kTypeOfLayer
		}
		out = le.AppendUint32(out, uint32(typ))
		out = le.AppendUint64(out, uint64(b.kRow))
		for _, p := range b.pos {
			out = append(out, cell(p, l, b.kRow)...)
		}
	}
	for l := range b.layers {
		out = le.AppendUint32(out, 1)
		if !b.vTrans {
			out = le.AppendUint64(out, uint64(b.vRow))
			for _, p := range b.pos {
				out = append(out, cell(p, 100+l, b.vRow)...)
			}
			continue
		}
		out = le.AppendUint32(out, uint32(b.vEl))
		out = le.AppendUint32(out, uint32(b.vWidth))
		for j := range b.vWidth {
			for _, p := range b.pos {
				out = append(out, cell(p, 200+l*b.vWidth+j, b.vEl)...)
			}
		}
	}
	out = append(out, b.extra...)
	return out[:len(out)-b.cut]
}

// whole is the whole-cache blob llama.cpp would write for the sequences'
// cells laid out one sequence after another, in order.
func whole(specs ...blobSpec) []byte {
	var all blobSpec
	var seqOf []int32
	for _, s := range specs {
		if len(s.pos) == 0 {
			continue
		}
		if all.layers == 0 {
			all = s
			all.pos = nil
		}
		all.pos = append(all.pos, s.pos...)
		for range s.pos {
			seqOf = append(seqOf, s.seq)
		}
	}
	if len(all.pos) == 0 {
		return blobSpec{}.build()
	}
	le := binary.LittleEndian
	out := le.AppendUint32(nil, 1)
	out = le.AppendUint32(out, uint32(len(all.pos)))
	for i, p := range all.pos {
		out = le.AppendUint32(out, uint32(p))
		out = le.AppendUint32(out, 1)
		out = le.AppendUint32(out, uint32(seqOf[i]))
	}
	vt := uint32(0)
	if all.vTrans {
		vt = 1
	}
	out = le.AppendUint32(out, vt)
	out = le.AppendUint32(out, uint32(all.layers))
	cell := func(seq, p int32, l, n int) []byte {
		c := make([]byte, n)
		for i := range c {
			c[i] = byte(int(seq)*31 + int(p)*7 + l*3 + i)
		}
		return c
	}
	for l := range all.layers {
		out = le.AppendUint32(out, 1)
		out = le.AppendUint64(out, uint64(all.kRow))
		for i, p := range all.pos {
			out = append(out, cell(seqOf[i], p, l, all.kRow)...)
		}
	}
	for l := range all.layers {
		out = le.AppendUint32(out, 1)
		if !all.vTrans {
			out = le.AppendUint64(out, uint64(all.vRow))
			for i, p := range all.pos {
				out = append(out, cell(seqOf[i], p, 100+l, all.vRow)...)
			}
			continue
		}
		out = le.AppendUint32(out, uint32(all.vEl))
		out = le.AppendUint32(out, uint32(all.vWidth))
		for j := range all.vWidth {
			for i, p := range all.pos {
				out = append(out, cell(seqOf[i], p, 200+l*all.vWidth+j, all.vEl)...)
			}
		}
	}
	return out
}

func TestMergeSeqStates(t *testing.T) {
	a := blobSpec{seq: 2, pos: []int32{0, 1, 2}, layers: 3, kRow: 5, vRow: 6}
	b := blobSpec{seq: 0, pos: []int32{0, 1}, layers: 3, kRow: 5, vRow: 6}
	c := blobSpec{seq: 7, pos: []int32{4, 5, 6, 7}, layers: 3, kRow: 5, vRow: 6}
	ta := blobSpec{seq: 1, pos: []int32{3, 4}, layers: 2, kRow: 4, vTrans: true, vWidth: 3, vEl: 2}
	tb := blobSpec{seq: 4, pos: []int32{0, 1, 2}, layers: 2, kRow: 4, vTrans: true, vWidth: 3, vEl: 2}
	empty := blobSpec{seq: 3}
	for _, tc := range []struct {
		name  string
		in    []blobSpec
		cells uint32
		err   bool
	}{
		{name: "one", in: []blobSpec{a}, cells: 3},
		{name: "three", in: []blobSpec{a, b, c}, cells: 9},
		{name: "an empty one among them", in: []blobSpec{a, empty, b}, cells: 5},
		{name: "all empty", in: []blobSpec{empty, empty}},
		{name: "transposed V", in: []blobSpec{ta, tb}, cells: 5},
		{name: "layer count differs", in: []blobSpec{a, ta}, err: true},
		{name: "row size differs", in: []blobSpec{a, {seq: 1, pos: []int32{0}, layers: 3, kRow: 4, vRow: 6}}, err: true},
		{name: "type differs", in: []blobSpec{a, {seq: 1, pos: []int32{0}, layers: 3, kRow: 5, vRow: 6, kTypeOfLayer: 8}}, err: true},
		{name: "cut short", in: []blobSpec{a, {seq: 1, pos: []int32{0}, layers: 3, kRow: 5, vRow: 6, cut: 3}}, err: true},
		{name: "trailing bytes", in: []blobSpec{{seq: 1, pos: []int32{0}, layers: 3, kRow: 5, vRow: 6, extra: []byte{9}}}, err: true},
		{name: "two streams", in: []blobSpec{{seq: 1, pos: []int32{0}, layers: 1, kRow: 5, vRow: 6, streams: 2}}, err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var blobs [][]byte
			size := 0
			for _, s := range tc.in {
				blobs = append(blobs, s.build())
				size += len(blobs[len(blobs)-1])
			}
			dst := make([]byte, size)
			n, cells, err := mergeSeqStates(dst, blobs)
			if tc.err {
				if !errors.Is(err, errStateBlob) {
					t.Fatalf("err %v, want errStateBlob", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cells != tc.cells {
				t.Fatalf("%d cells, want %d", cells, tc.cells)
			}
			if want := whole(tc.in...); !bytes.Equal(dst[:n], want) {
				t.Fatalf("merged blob (%d bytes) differs from the whole-cache layout (%d bytes)", n, len(want))
			}
		})
	}
}

// FuzzMergeSeqStates: any bytes as saved blobs give an error or a merged
// blob; never a panic or a write past dst. One readable blob merges to
// itself.
func FuzzMergeSeqStates(f *testing.F) {
	f.Add(blobSpec{seq: 2, pos: []int32{0, 1, 2}, layers: 3, kRow: 5, vRow: 6}.build(), []byte{})
	f.Add(blobSpec{seq: 1, pos: []int32{3, 4}, layers: 2, kRow: 4, vTrans: true, vWidth: 3, vEl: 2}.build(),
		blobSpec{seq: 4, pos: []int32{0}, layers: 2, kRow: 4, vTrans: true, vWidth: 3, vEl: 2}.build())
	f.Fuzz(func(t *testing.T, x, y []byte) {
		dst := make([]byte, len(x)+len(y))
		if _, _, err := mergeSeqStates(dst, [][]byte{x, y}); err != nil && !errors.Is(err, errStateBlob) {
			t.Fatalf("error not errStateBlob: %v", err)
		}
		if st, err := parseSeqState(x); err == nil && st.cells > 0 {
			one := make([]byte, len(x))
			n, _, err := mergeSeqStates(one, [][]byte{x})
			if err != nil || !bytes.Equal(one[:n], x) {
				t.Fatalf("a readable blob merged alone: %v, same bytes %v", err, bytes.Equal(one[:n], x))
			}
		}
	})
}
