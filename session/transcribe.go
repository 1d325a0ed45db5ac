package session

import (
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

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

// hopTranscripts is the hopAudit (auditseam.go) of a session that asks
// for transcripts: tr signs this hop's statements (nil: the host has no
// key and signs none), chk checks the statements of the hop before it
// (nil on a one-hop route), and kept is what it keeps in store for an
// audit. hs gives the session's fixed facts (open, key, origin, route,
// position); the methods run on the data path's goroutines, serialised
// as it calls them (the head's under trMu).
type hopTranscripts struct {
	hs    *hopSession
	store *auditStore
	tr    *transcriber
	chk   *checker
	kept  *kept
}

// startTranscripts sets hs up to sign, check and keep transcripts.
func (h *HopService) startTranscripts(hs *hopSession) *hopTranscripts {
	t := &hopTranscripts{hs: hs, store: h.audits}
	if !hs.head || !hs.tail {
		t.chk = &checker{}
	}
	t.kept = h.audits.open(hs.key, hs.idx, recordBound(hs.open, hs.se.info.NEmbd))
	key := h.host.Peerstore().PrivKey(h.host.ID())
	if key == nil {
		h.log.Warn("no private key in the peerstore: this hop signs no transcripts", "session", hs.key)
		return t
	}
	t.tr = newTranscriber(hs, key, h.cfg.KernelClass)
	return t
}

func (t *hopTranscripts) signs() bool { return t.tr != nil }

// input digests an input frame; the head also keeps it: its inputs are
// its own to show an auditor.
func (t *hopTranscripts) input(a *meshp2pb.ActivationHeader, tensors [][]byte) {
	if t.tr == nil {
		return
	}
	var payload []byte
	if len(tensors) == 1 {
		payload = tensors[0]
	}
	t.tr.input(a, payload)
	if t.hs.head {
		t.store.record(t.kept, true, a, nil, recordOverhead)
	}
}

// sent digests and keeps an activation sent to the next hop.
func (t *hopTranscripts) sent(a *meshp2pb.ActivationHeader, payload []byte) error {
	if t.tr == nil {
		return nil
	}
	t.store.record(t.kept, false, a, payload, recordOverhead)
	return t.hs.asTranscriptErr(t.tr.sent(a, payload, t.hs.se.info.NEmbd))
}

// ring digests a token or window result the tail sends the head; a tail
// that is not the head keeps it too (a one-hop route relays its own
// tokens: nothing to check).
func (t *hopTranscripts) ring(msg *meshp2pb.StreamMessage) {
	if t.tr == nil {
		return
	}
	t.tr.ring(msg)
	if !t.hs.head {
		t.store.recordRing(t.kept, msg)
	}
}

// done ends one input frame: a full window's statement.
func (t *hopTranscripts) done() (*meshp2pb.SignedTranscript, error) {
	if t.tr == nil {
		return nil, nil
	}
	st, err := t.tr.done()
	if err != nil {
		return nil, t.hs.asTranscriptErr(err)
	}
	return t.own(st), nil
}

// final signs the last window at a clean close.
func (t *hopTranscripts) final() (*meshp2pb.SignedTranscript, error) {
	if t.tr == nil {
		return nil, nil
	}
	st, err := t.tr.statement(true)
	if err != nil {
		return nil, err
	}
	return t.own(st), nil
}

// own is this hop's statement st to send on; a one-hop route has nobody
// to send it to and keeps its own (nil).
func (t *hopTranscripts) own(st *meshp2pb.SignedTranscript) *meshp2pb.SignedTranscript {
	if st != nil && t.hs.head && t.hs.tail {
		t.kept.keep(st)
		return nil
	}
	return st
}

func (hs *hopSession) asTranscriptErr(err error) error {
	if err == nil {
		return nil
	}
	return codeErr(meshp2pb.ErrorCode_ERROR_CODE_INTERNAL, err.Error(), hs.h.host.ID())
}

// received digests a frame from the previous hop (the head: from the
// tail) for the check of its next statement.
func (t *hopTranscripts) received(msg *meshp2pb.StreamMessage, tensors [][]byte, from peer.ID) error {
	if t.chk == nil {
		return nil
	}
	if a := msg.GetActivation(); a != nil {
		var payload []byte
		if len(tensors) == 1 {
			payload = tensors[0]
		}
		if err := t.chk.activation(a, payload, t.hs.se.info.NEmbd); err != nil {
			return codeErr(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, err.Error(), from)
		}
		return nil
	}
	t.chk.ring(msg)
	return nil
}

// statement checks and keeps a statement of the hop before this one (the
// head: the tail's); one that does not match what arrived fails the
// session, blaming its sender.
func (t *hopTranscripts) statement(st *meshp2pb.SignedTranscript, from peer.ID) (bool, error) {
	if t.chk == nil {
		return false, codeErr(meshp2pb.ErrorCode_ERROR_CODE_UNEXPECTED_MESSAGE, "transcript in a session without transcripts", from)
	}
	hs := t.hs
	idx := hs.idx - 1
	if hs.head {
		idx = len(hs.route) - 1
	}
	if err := t.chk.check(st, hs, from, idx); err != nil {
		return false, codeErr(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, err.Error(), from)
	}
	t.kept.keep(st)
	return t.chk.final, nil
}

// end marks the records complete: an audit fetch may read them.
func (t *hopTranscripts) end() { t.store.end(t.kept) }
