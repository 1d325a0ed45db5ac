package session

import (
	"fmt"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// TranscriptCloseWait bounds how long the head, at a clean close, waits
// for the tail's final statement (one ring round after the close went
// down the route).
const TranscriptCloseWait = 2 * time.Second

// recordOverhead is what one kept frame's header counts against the
// session's bound besides its payload.
const recordOverhead = 256

// recordBound is what one session may keep on a hop: n_ctx_needed ×
// (n_embd × 4 + 2 × recordOverhead) bytes (f32 rows of every position,
// and headers); a speculative session's windows also carry rows that
// are rejected and sent again, up to its max_draft (DefaultSpecDraft when
// 0) per window, so it may keep 1 + max_draft times that.
func recordBound(open *meshp2pb.SessionOpen, nEmbd int) int64 {
	b := int64(open.GetNCtxNeeded()) * (int64(nEmbd)*4 + 2*recordOverhead)
	if speculative(open) {
		k := int64(open.GetSpeculation().GetMaxDraft())
		if k == 0 || k > MaxSpecDraft {
			k = min(DefaultSpecDraft, MaxSpecDraft)
		}
		b *= 1 + k
	}
	return b
}

// startTranscripts sets hs up to sign, check and keep transcripts.
func (h *HopService) startTranscripts(hs *hopSession) {
	if !hs.head || !hs.tail {
		hs.chk = &checker{}
	}
	hs.kept = h.audits.open(hs.key, hs.idx, recordBound(hs.open, hs.se.info.NEmbd))
	hs.tailFinal = make(chan struct{})
	key := h.host.Peerstore().PrivKey(h.host.ID())
	if key == nil {
		h.log.Warn("no private key in the peerstore: this hop signs no transcripts", "session", hs.key)
		return
	}
	hs.tr = newTranscriber(hs, key, h.cfg.KernelClass)
}

// transcribeInput digests an input frame (the head also keeps it: its
// inputs are its own to show an auditor). It reports false when the head
// is closing and the frame is to be dropped.
func (hs *hopSession) transcribeInput(a *meshp2pb.ActivationHeader, tensors [][]byte) bool {
	if hs.tr == nil {
		return true
	}
	if hs.closing.Load() {
		return false
	}
	var payload []byte
	if len(tensors) == 1 {
		payload = tensors[0]
	}
	hs.tr.input(a, payload)
	if hs.head {
		hs.h.audits.record(hs.kept, true, a, nil, recordOverhead)
	}
	return true
}

// transcribeSent digests (and keeps) an activation sent to the next hop.
func (hs *hopSession) transcribeSent(a *meshp2pb.ActivationHeader, payload []byte) error {
	if hs.tr == nil {
		return nil
	}
	hs.h.audits.record(hs.kept, false, a, payload, recordOverhead)
	return hs.tr.sent(a, payload, hs.se.info.NEmbd)
}

// inputDone ends one input frame: a full window's statement goes where
// this hop's output went (on the down seam: in t; nil: at once).
func (hs *hopSession) inputDone(t *turn) error {
	if hs.tr == nil {
		return nil
	}
	st, err := hs.tr.done()
	if err != nil || st == nil {
		return hs.asTranscriptErr(err)
	}
	return hs.sendStatement(st, t)
}

func (hs *hopSession) asTranscriptErr(err error) error {
	if err == nil {
		return nil
	}
	return codeErr(meshp2pb.ErrorCode_ERROR_CODE_INTERNAL, err.Error(), hs.h.host.ID())
}

// sendStatement sends a signed statement to the next hop, in t (nil: at
// once); the tail sends it to the head over the ring at once, and a
// one-hop route keeps its own.
func (hs *hopSession) sendStatement(st *meshp2pb.SignedTranscript, t *turn) error {
	msg := &meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Transcript{Transcript: st}}
	switch {
	case hs.head && hs.tail:
		hs.kept.keep(st)
		return nil
	case hs.tail:
		if err := hs.ringOut.Send(msg, WriteDeadline(hs.h.cfg.Idle)); err != nil {
			return linkErr("ring to head", err, hs.route[0], hs.h.host.ID())
		}
		return nil
	}
	return t.add(func() error {
		if err := hs.down.Send(msg, WriteDeadline(hs.h.cfg.Idle)); err != nil {
			return linkErr("send to next hop", err, hs.route[hs.idx+1], hs.h.host.ID())
		}
		return nil
	})
}

// received digests a frame from the previous hop (the head: from the
// tail) for the check of its next statement.
func (hs *hopSession) received(msg *meshp2pb.StreamMessage, tensors [][]byte, from peer.ID) error {
	if hs.chk == nil {
		return nil
	}
	if a := msg.GetActivation(); a != nil {
		var payload []byte
		if len(tensors) == 1 {
			payload = tensors[0]
		}
		if err := hs.chk.activation(a, payload, hs.se.info.NEmbd); err != nil {
			return codeErr(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, err.Error(), from)
		}
		return nil
	}
	hs.chk.ring(msg)
	return nil
}

// statement checks and keeps a statement of the hop before this one (the
// head: the tail's); one that does not match what arrived fails the
// session, blaming its sender.
func (hs *hopSession) statement(st *meshp2pb.SignedTranscript, from peer.ID) error {
	if hs.chk == nil {
		return codeErr(meshp2pb.ErrorCode_ERROR_CODE_UNEXPECTED_MESSAGE, "transcript in a session without transcripts", from)
	}
	idx := hs.idx - 1
	if hs.head {
		idx = len(hs.route) - 1
	}
	if err := hs.chk.check(st, hs, from, idx); err != nil {
		return codeErr(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, err.Error(), from)
	}
	hs.kept.keep(st)
	if hs.head && hs.chk.final {
		close(hs.tailFinal)
	}
	return nil
}

// closeTranscripts runs at a clean close from upstream: this hop's final
// statement goes where its output went, and the close goes on down the
// route so every hop does the same; the head then waits (bounded) for
// the tail's final statement on the ring. The head signs its final
// statement under trMu, after every input it took before, and writes it
// and the close in turn after them (turn.go).
func (hs *hopSession) closeTranscripts(c *meshp2pb.SessionClose) error {
	if hs.kept == nil {
		return nil // no transcripts: the route ends as the streams close
	}
	var err error
	if hs.head {
		err = hs.ordered(func(t *turn) error { return hs.closeDown(c, t) })
	} else {
		err = hs.closeDown(c, nil)
	}
	if err != nil {
		return fmt.Errorf("final transcript: %w", err)
	}
	if hs.head && !hs.tail {
		select {
		case <-hs.tailFinal:
		case <-hs.done:
		case <-time.After(TranscriptCloseWait):
			hs.h.log.Info("no final statement from the tail: its last window cannot be audited", "session", hs.key, "tail", hs.route[len(hs.route)-1])
		}
	}
	return nil
}

// closeDown marks the session closing, signs this hop's final statement
// and sends it, then the close, on down the route, in t (nil: at once).
func (hs *hopSession) closeDown(c *meshp2pb.SessionClose, t *turn) error {
	// From here the next hop ending its stream, or reporting, is part of
	// the close (watchDownstream), not a failure.
	hs.closing.Store(true)
	if hs.tr != nil {
		st, err := hs.tr.statement(true)
		if err != nil {
			return err
		}
		if err := hs.sendStatement(st, t); err != nil {
			return err
		}
	}
	if hs.tail {
		return nil
	}
	msg := &meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Close{Close: proto.Clone(c).(*meshp2pb.SessionClose)}}
	return t.add(func() error { return hs.down.Send(msg, WriteDeadline(hs.h.cfg.Idle)) })
}
