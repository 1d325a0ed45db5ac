package session

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/libp2p/go-libp2p/core/peer"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// Failover that recomputes one hop (docs/architecture.md, "Failover").
// When a hop fails, the origin re-routes: a new epoch of the same session
// over a route that replaces the failed hop. The hops that survive keep
// what they computed in the old epoch: the old epoch's engine session
// leaves its prefill's blocks in the prefix cache under the session's own
// scope too (sessionScope), and the new epoch adopts them. The replacement
// holds nothing; it needs the hidden states of every position from the
// hop before it, which has them in its audit records (the frames it sent
// in the old epoch): it re-sends them, and the hops after the replacement,
// which hold those positions, do not recompute them. The origin plans
// where each hop starts (hopStarts) from what the hops answered in their
// accepts (hop_cached, hop_replay) and sends the plan on every prefill
// frame (hop_starts); each hop then starts at its entry, re-sends what the
// next hop needs below it, and forwards only rows from the next hop's
// start on.

// prefillSent is what this hop sent the next hop in the earlier epochs of
// key's session that it still keeps: prefill and plain decode frames in
// dtype wire (usableRows) that run contiguously from position 0, and how
// many positions they cover.
// A later epoch's frames are preferred and an earlier one's fill in below
// them: after one failover a hop that adopted positions sent only the rows
// from there on, and its first epoch's records hold the rest (the same
// rows, bitwise: the same layers over the same inputs, which the prefix
// scope guarantees). Frames are trimmed so that no position is sent twice.
func (s *auditStore) prefillSent(key Key, wire meshp2pb.DType) ([]*meshp2pb.RecordedFrame, int) {
	s.mu.Lock()
	var prev []*kept
	var epochs []uint64
	for k, kp := range s.m {
		if k.Origin == key.Origin && k.ID == key.ID && k.Epoch < key.Epoch {
			prev, epochs = append(prev, kp), append(epochs, k.Epoch)
		}
	}
	s.mu.Unlock()
	var frames [][]*meshp2pb.RecordedFrame // latest epoch first
	for _, i := range latestFirst(epochs) {
		prev[i].mu.Lock()
		frames = append(frames, usableRows(prev[i].sent, wire))
		prev[i].mu.Unlock()
	}
	var out []*meshp2pb.RecordedFrame
	to := 0
	for {
		f := coveringFrame(frames, to)
		if f == nil {
			return out, to
		}
		out = append(out, trimFrame(f, to))
		to = int(f.GetHeader().GetPosStart() + f.GetHeader().GetNRows())
	}
}

// latestFirst is the indices of epochs, latest epoch first.
func latestFirst(epochs []uint64) []int {
	idx := make([]int, len(epochs))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int { return cmp.Compare(epochs[b], epochs[a]) })
	return idx
}

// usableRows are the frames of sent a replay can re-send: prefill and
// plain decode rows (no speculative window's: their proposals may have
// been rejected) of one tensor in dtype wire. A decode row is bitwise the
// row a prefill computes (batch invariance), and its token was committed
// before it was fed, so a re-routed epoch, whose hops adopt every token
// fed but the last (PrefixChain.own), still finds the rows below them.
func usableRows(sent []*meshp2pb.RecordedFrame, wire meshp2pb.DType) []*meshp2pb.RecordedFrame {
	var out []*meshp2pb.RecordedFrame
	for _, f := range sent {
		h := f.GetHeader()
		if ts := h.GetTensors(); !h.GetVerify() && h.GetNRows() > 0 && len(ts) == 1 && ts[0].GetDtype() == wire {
			out = append(out, f)
		}
	}
	return out
}

// coveringFrame is a frame holding position to, from the latest epoch
// that has one; nil when none does.
func coveringFrame(epochs [][]*meshp2pb.RecordedFrame, to int) *meshp2pb.RecordedFrame {
	for _, fs := range epochs {
		for _, f := range fs {
			h := f.GetHeader()
			if int(h.GetPosStart()) <= to && to < int(h.GetPosStart()+h.GetNRows()) {
				return f
			}
		}
	}
	return nil
}

// trimFrame is f from position from on (f itself when it starts there).
func trimFrame(f *meshp2pb.RecordedFrame, from int) *meshp2pb.RecordedFrame {
	h := f.GetHeader()
	cut := from - int(h.GetPosStart())
	if cut == 0 {
		return f
	}
	rowBytes := len(f.GetPayload()) / int(h.GetNRows())
	nh := proto.Clone(h).(*meshp2pb.ActivationHeader)
	nh.PosStart, nh.NRows = uint32(from), h.GetNRows()-uint32(cut)
	return &meshp2pb.RecordedFrame{Header: nh, Payload: f.GetPayload()[cut*rowBytes:]}
}

// findReplay (admission of a later epoch) looks up what this hop can
// re-send the next hop from its records of the previous epoch.
func (hs *hopSession) findReplay() {
	if hs.tail || hs.key.Epoch == 0 || hs.open.GetPrefix() == nil {
		return
	}
	hs.replay, hs.replayTo = hs.h.audits.prefillSent(hs.key, hs.wire)
}

// planStarts takes the epoch's plan from its first frame a: where this hop
// starts (it must hold the positions before: adopted, and re-sendable
// where the next hop starts lower) and the next hop's start. Without a
// plan, this hop starts at a's position and forwards every row.
func (hs *hopSession) planStarts(a *meshp2pb.ActivationHeader, from peer.ID) (int, error) {
	st := a.GetHopStarts()
	pos := int(a.GetPosStart())
	if len(st) == 0 {
		return pos, nil
	}
	if len(st) != len(hs.route) || int(st[hs.idx]) != pos || pos > hs.cached {
		return 0, codeErr(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST,
			fmt.Sprintf("hop starts %v: hop %d of %d holds %d positions, first frame at %d", st, hs.idx, len(hs.route), hs.cached, pos), from)
	}
	if hs.tail {
		return pos, nil
	}
	next := int(st[hs.idx+1])
	if next < pos && hs.replayTo < pos {
		return 0, codeErr(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST,
			fmt.Sprintf("hop starts %v: the next hop starts at %d, this hop's records reach %d of %d", st, next, hs.replayTo, pos), from)
	}
	hs.nextStart.Store(int32(next))
	if next < pos {
		hs.resend = [2]int{next, pos}
	}
	return pos, nil
}

// sendReplay re-sends the next hop the rows [resend[0], resend[1]) from
// this hop's records, before anything of the epoch's first frame a (in
// t). Once.
func (hs *hopSession) sendReplay(a *meshp2pb.ActivationHeader, t *turn) error {
	from, to := hs.resend[0], hs.resend[1]
	if from >= to {
		return nil
	}
	hs.resend = [2]int{}
	for _, f := range recordedRows(hs.replay, from, to, hs.wire, hs.se.info.NEmbd, a) {
		hdr, payload := f.GetHeader(), f.GetPayload()
		hdr.HopStarts = a.GetHopStarts()
		// Each re-sent frame is an input frame of this hop's transcript
		// too, so its statements keep covering one frame per frame sent.
		hs.tx.input(hdr, [][]byte{payload})
		if err := hs.tx.sent(hdr, payload); err != nil {
			return err
		}
		if err := t.add(func() error { return hs.writeDown(hdr, payload) }); err != nil {
			return err
		}
		if err := hs.inputDone(t); err != nil {
			return err
		}
	}
	hs.h.log.Debug("failover: re-sent the previous epoch's rows", "session", hs.key, "from", from, "to", to)
	hs.replay = nil
	return nil
}

// recordedRows is the rows [from, to) of recorded prefill frames fs (in
// dtype wire, rows of nEmbd) as frames of a's session, epoch and step, one
// per recorded frame that holds some (sendReplay, a standby's fill).
func recordedRows(fs []*meshp2pb.RecordedFrame, from, to int, wire meshp2pb.DType, nEmbd int, a *meshp2pb.ActivationHeader) []*meshp2pb.RecordedFrame {
	rowBytes := frame.DTypeSize(wire) * nEmbd
	var out []*meshp2pb.RecordedFrame
	for _, f := range fs {
		h := f.GetHeader()
		lo, hi := max(from, int(h.GetPosStart())), min(to, int(h.GetPosStart()+h.GetNRows()))
		if lo >= hi {
			continue
		}
		off := (lo - int(h.GetPosStart())) * rowBytes
		out = append(out, &meshp2pb.RecordedFrame{Header: &meshp2pb.ActivationHeader{SessionId: a.GetSessionId(), Epoch: a.GetEpoch(), Step: a.GetStep(),
			PosStart: uint32(lo), NRows: uint32(hi - lo), IsPrefill: true,
			Tensors: []*meshp2pb.TensorInfo{{Name: BundleTensor, Dtype: wire, Shape: []int64{int64(hi - lo), int64(nEmbd)}}}},
			Payload: f.GetPayload()[off : off+(hi-lo)*rowBytes]})
	}
	return out
}

// forwarded is the part of a's output (hidden, rows of nEmbd) the next hop
// needs: the rows from its start on (all of them without a plan); ok is
// false when it needs none.
func (hs *hopSession) forwarded(a *meshp2pb.ActivationHeader, hidden []float32, nEmbd int) (*meshp2pb.ActivationHeader, []float32, bool) {
	return forwardFrom(a, hidden, nEmbd, int(hs.nextStart.Load()))
}

// forwardFrom is the part of a's output (hidden, rows of nEmbd) a next hop
// that starts at next needs (forwarded; an audit's replay cuts the same,
// replay.go).
func forwardFrom(a *meshp2pb.ActivationHeader, hidden []float32, nEmbd, next int) (*meshp2pb.ActivationHeader, []float32, bool) {
	pos := int(a.GetPosStart())
	if !a.GetIsPrefill() || next <= pos {
		return a, hidden, true
	}
	cut := next - pos
	if cut >= int(a.GetNRows()) {
		return nil, nil, false
	}
	c := &meshp2pb.ActivationHeader{SessionId: a.GetSessionId(), Epoch: a.GetEpoch(), Step: a.GetStep(), PosStart: uint32(next),
		NRows: a.GetNRows() - uint32(cut), IsPrefill: true, LastChunk: a.GetLastChunk(), HopStarts: a.GetHopStarts(),
		HopUs: a.GetHopUs(), HopTiming: a.GetHopTiming()}
	return c, hidden[cut*nEmbd:], true
}
