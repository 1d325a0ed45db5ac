package session

import (
	"errors"
	"slices"
	"testing"

	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// A mirror aligns what it sends a standby to the standby's start: rows it
// holds are cut, the rows between its start and the covered hop's first
// frame come from the records first, and without records it cannot
// follow. The copies carry no hop_starts; decode rows go as they are.
func TestStandbyStartAligns(t *testing.T) {
	const nEmbd = 2
	wire := meshp2pb.DType_DTYPE_F32
	rowBytes := 4 * nEmbd
	rows := func(lo, hi int) []byte { // row i's bytes are all byte(i)
		var b []byte
		for i := lo; i < hi; i++ {
			for range rowBytes {
				b = append(b, byte(i))
			}
		}
		return b
	}
	frameOf := func(lo, hi int, prefill bool) (*meshp2pb.ActivationHeader, []byte) {
		toks := make([]int32, hi-lo)
		return &meshp2pb.ActivationHeader{PosStart: uint32(lo), NRows: uint32(hi - lo), IsPrefill: prefill, Tokens: toks, HopStarts: []uint32{0, uint32(lo), 0},
			Tensors: []*meshp2pb.TensorInfo{{Name: BundleTensor, Dtype: wire, Shape: []int64{int64(hi - lo), nEmbd}}}}, rows(lo, hi)
	}
	records := func(to int) []*meshp2pb.RecordedFrame {
		var out []*meshp2pb.RecordedFrame
		for lo := 0; lo < to; lo += 4 {
			h, p := frameOf(lo, min(lo+4, to), true)
			out = append(out, &meshp2pb.RecordedFrame{Header: h, Payload: p})
		}
		return out
	}
	cases := []struct {
		name     string
		from     int // the standby's start
		recTo    int // the records reach
		first    [2]int
		want     [][2]int // the rows of each frame sent
		wantFail bool
	}{
		{"same start", 8, 0, [2]int{8, 12}, [][2]int{{8, 12}}, false},
		{"holds more: cut", 10, 0, [2]int{8, 12}, [][2]int{{10, 12}}, false},
		{"holds the whole frame", 12, 0, [2]int{8, 12}, nil, false},
		{"holds less: filled from the records", 2, 8, [2]int{8, 12}, [][2]int{{2, 4}, {4, 8}, {8, 12}}, false},
		{"holds nothing: filled from 0", 0, 10, [2]int{8, 12}, [][2]int{{0, 4}, {4, 8}, {8, 12}}, false},
		{"records short: cannot follow", 0, 6, [2]int{8, 12}, nil, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st := &standbyStart{from: tc.from, fill: records(tc.recTo), fillTo: tc.recTo, wire: wire, nEmbd: nEmbd}
			a, p := frameOf(tc.first[0], tc.first[1], true)
			out, err := st.align(a, p)
			if tc.wantFail {
				if !errors.Is(err, errCannotFollow) {
					t.Fatalf("got %v, want errCannotFollow", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got [][2]int
			for _, f := range out {
				h := f.GetHeader()
				lo, hi := int(h.GetPosStart()), int(h.GetPosStart()+h.GetNRows())
				got = append(got, [2]int{lo, hi})
				if !slices.Equal(f.GetPayload(), rows(lo, hi)) || len(h.GetHopStarts()) != 0 || h.GetTensors()[0].GetShape()[0] != int64(hi-lo) {
					t.Fatalf("frame %v: payload, hop_starts %v or shape %v wrong", [2]int{lo, hi}, h.GetHopStarts(), h.GetTensors()[0].GetShape())
				}
				if len(h.GetTokens()) != 0 && len(h.GetTokens()) != hi-lo {
					t.Fatalf("frame %v has %d tokens", [2]int{lo, hi}, len(h.GetTokens()))
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("sent %v, want %v", got, tc.want)
			}
			if a.GetPosStart() != uint32(tc.first[0]) || len(a.GetHopStarts()) == 0 {
				t.Fatal("the covered hop's own frame was changed")
			}
			// Later frames: decode rows go as they are (no hop_starts).
			d, dp := frameOf(tc.first[1], tc.first[1]+1, false)
			out, err = st.align(d, dp)
			if err != nil || len(out) != 1 || out[0].GetHeader().GetPosStart() != uint32(tc.first[1]) || len(out[0].GetHeader().GetHopStarts()) != 0 {
				t.Fatalf("decode row: %v, %v", out, err)
			}
		})
	}
}
