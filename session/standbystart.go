package session

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// A standby's start (docs/architecture.md, "Hot standby"). A standby
// adopts what its own prefix cache holds of the session's chain (its
// accept's hop_cached[0]), which need not be where the covered hop starts
// in this epoch: a standby named for the first time after a failover holds
// nothing while the route's hops adopted the session's blocks, and one
// named for a conversation's next turn may hold less or more of it than
// the covered hop. The mirror aligns what it sends to the standby: rows
// below the standby's start are cut (it holds them, bitwise), and the rows
// from its start to the covered hop's first frame go first, from this
// hop's records of the session's earlier epochs (failover.go's
// prefillSent, what sendReplay re-sends a replacement). Where the records
// do not reach, the standby cannot follow and is dropped, saying why. The
// copies carry no hop_starts: a standby forwards nothing, and its start is
// its own.

// errCannotFollow: the standby holds fewer positions than the covered
// hop's first frame and no record here fills the gap.
var errCannotFollow = errors.New("the standby cannot follow")

// standbyStart aligns a mirror's frames to its standby's start.
type standbyStart struct {
	from    int                       // positions the standby adopted
	fill    []*meshp2pb.RecordedFrame // this hop's prefill records of earlier epochs, from position 0
	fillTo  int                       // the positions fill covers
	wire    meshp2pb.DType            // the session's wire dtype
	nEmbd   int                       // row width
	aligned bool                      // the first activation went
}

// align is what the standby gets for activation a (payload p) the covered
// hop got: the fill before the first one, then a from the standby's start
// on (nothing when the standby holds all of a's rows).
func (st *standbyStart) align(a *meshp2pb.ActivationHeader, p []byte) ([]*meshp2pb.RecordedFrame, error) {
	var out []*meshp2pb.RecordedFrame
	if !st.aligned {
		st.aligned = true
		if pos := int(a.GetPosStart()); pos > st.from {
			fill, err := st.fillFrames(a, pos)
			if err != nil {
				return nil, err
			}
			out = fill
		}
	}
	pos, end := int(a.GetPosStart()), int(a.GetPosStart()+a.GetNRows())
	switch {
	case a.GetIsPrefill() && end <= st.from:
		return out, nil // the standby holds these rows
	case a.GetIsPrefill() && pos < st.from:
		f, err := cutFrame(a, p, st.from-pos)
		if err != nil {
			return nil, err
		}
		return append(out, f), nil
	case len(a.GetHopStarts()) > 0:
		h := proto.Clone(a).(*meshp2pb.ActivationHeader)
		h.HopStarts = nil
		return append(out, &meshp2pb.RecordedFrame{Header: h, Payload: p}), nil
	}
	return append(out, &meshp2pb.RecordedFrame{Header: a, Payload: p}), nil
}

// fillFrames is the rows [st.from, pos) of the covered hop's input from this
// hop's records, as frames of epoch a.
func (st *standbyStart) fillFrames(a *meshp2pb.ActivationHeader, pos int) ([]*meshp2pb.RecordedFrame, error) {
	if st.fillTo < pos {
		return nil, fmt.Errorf("%w: it holds %d positions, the covered hop starts at %d, and this hop's records reach %d", errCannotFollow, st.from, pos, st.fillTo)
	}
	return recordedRows(st.fill, st.from, pos, st.wire, st.nEmbd, a), nil
}

// cutFrame is prefill frame a (payload p, one tensor) without its first
// cut rows, and without hop_starts.
func cutFrame(a *meshp2pb.ActivationHeader, p []byte, cut int) (*meshp2pb.RecordedFrame, error) {
	n := int(a.GetNRows())
	ts := a.GetTensors()
	if len(ts) != 1 || n == 0 || len(p)%n != 0 {
		return nil, fmt.Errorf("%w: a frame of %d tensors to cut at its row %d", errCannotFollow, len(ts), cut)
	}
	h := proto.Clone(a).(*meshp2pb.ActivationHeader)
	h.HopStarts = nil
	h.PosStart, h.NRows = a.GetPosStart()+uint32(cut), uint32(n-cut)
	if sh := h.Tensors[0].GetShape(); len(sh) > 0 && sh[0] == int64(n) {
		sh[0] = int64(n - cut)
	}
	if len(h.Tokens) == n {
		h.Tokens = h.Tokens[cut:]
	}
	return &meshp2pb.RecordedFrame{Header: h, Payload: p[cut*(len(p)/n):]}, nil
}
