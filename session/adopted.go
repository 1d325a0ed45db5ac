package session

import (
	"bytes"
	"fmt"
	"slices"

	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// Audits of epochs that reused prefix-cache positions (docs/trust.md,
// "Prefix cache"). A hop that adopted positions [0, n) from its prefix
// cache holds cells no record of the epoch rebuilds; so the cache entry
// keeps the inputs those cells were computed from (the head's tokens;
// elsewhere the rows the engine was fed, EngineParams.KeepInputs), the
// hop signs their count and digest in every statement of the epoch
// (Transcript.adopted, adopted_digest), keeps them for the audit
// (AUDIT_PART_ADOPTED), and a replay feeds them before the epoch's own
// input frames (Replay.Adopted, Proof.adopted).

// InputKeeper is implemented by engine sessions that keep their input rows
// with what they keep in the prefix cache (EngineParams.KeepInputs).
type InputKeeper interface {
	// AdoptedInputs are the input rows of the positions Adopt gave
	// (positions × n_embd): nil when the entry kept none.
	AdoptedInputs() []float32
}

// AdoptedFrames cuts the inputs of n adopted positions into the frames a
// hop digests and a replay feeds: PrefixBlock positions a frame, from 0,
// marked prefill; on the head (nEmbd 0) the tokens toks[:n], elsewhere the
// f32 rows rows[:n·nEmbd]. Nil when the inputs do not cover n positions.
func AdoptedFrames(n int, toks []int32, rows []float32, nEmbd int) []*meshp2pb.RecordedFrame {
	head := nEmbd == 0
	if n <= 0 || (head && len(toks) < n) || (!head && len(rows) < n*nEmbd) {
		return nil
	}
	var out []*meshp2pb.RecordedFrame
	for at := 0; at < n; at += PrefixBlock {
		k := min(PrefixBlock, n-at)
		a := &meshp2pb.ActivationHeader{PosStart: uint32(at), NRows: uint32(k), IsPrefill: true}
		f := &meshp2pb.RecordedFrame{Header: a}
		if head {
			a.Tokens = slices.Clone(toks[at : at+k])
		} else {
			a.Tensors = []*meshp2pb.TensorInfo{{Name: BundleTensor, Dtype: meshp2pb.DType_DTYPE_F32, Shape: []int64{int64(k), int64(nEmbd)}}}
			f.Payload = frame.AppendF32(nil, rows[at*nEmbd:(at+k)*nEmbd])
		}
		out = append(out, f)
	}
	return out
}

// checkAdopted checks frames against what a hop signed of its adopted
// positions (st: its first statement): n positions from 0 in order, plain
// prefill frames (the head's tokens, elsewhere one tensor of nEmbd-wide
// rows), whose digest is the signed one.
func checkAdopted(frames []*meshp2pb.RecordedFrame, st *meshp2pb.Transcript, head bool, nEmbd int) error {
	n := int(st.GetAdopted())
	if n == 0 {
		if len(frames) > 0 {
			return fmt.Errorf("%d adopted input frames for a hop that adopted no positions", len(frames))
		}
		return nil
	}
	if len(st.GetAdoptedDigest()) == 0 {
		return fmt.Errorf("the hop signed no inputs of its %d adopted positions (its cache entry kept none)", n)
	}
	at := 0
	for i, f := range frames {
		a := f.GetHeader()
		rows := int(a.GetNRows())
		switch {
		case int(a.GetPosStart()) != at || rows == 0 || a.GetVerify() || len(a.GetLookahead()) > 0:
			return fmt.Errorf("adopted input frame %d: %d rows at position %d (verify %v), want plain rows from %d", i, rows, a.GetPosStart(), a.GetVerify(), at)
		case head && (len(a.GetTokens()) != rows || len(a.GetTensors()) > 0):
			return fmt.Errorf("adopted input frame %d: %d tokens for %d rows", i, len(a.GetTokens()), rows)
		case !head && (len(a.GetTensors()) != 1 || len(a.GetTokens()) > 0):
			return fmt.Errorf("adopted input frame %d: %d tensors", i, len(a.GetTensors()))
		case !head && len(f.GetPayload()) != rows*nEmbd*frame.DTypeSize(a.GetTensors()[0].GetDtype()):
			return fmt.Errorf("adopted input frame %d: %d bytes for %d rows of %d", i, len(f.GetPayload()), rows, nEmbd)
		}
		at += rows
	}
	if at != n {
		return fmt.Errorf("adopted inputs cover %d positions, the hop signed %d", at, n)
	}
	if !bytes.Equal(InputDigest(frames), st.GetAdoptedDigest()) {
		return fmt.Errorf("the adopted inputs are not those the hop signed")
	}
	return nil
}

// adoptedTokens are the tokens of the head's adopted input frames.
func adoptedTokens(frames []*meshp2pb.RecordedFrame) []int32 {
	var toks []int32
	for _, f := range frames {
		toks = append(toks, f.GetHeader().GetTokens()...)
	}
	return toks
}

// adopted (the epoch's first frame) signs, from now on, the n positions
// this hop adopted and the digest of their inputs (toks on the head, rows
// elsewhere; missing: none signed), and keeps those inputs for an audit.
// The frames and their digest (a copy and a hash of every adopted row:
// megabytes, and fresh memory is slow to touch on some machines) are made
// beside the session, not before its first frame is computed: the first
// statement, TranscriptWindow frames later or at the close, waits for
// them. toks is read only; rows (nil: none) gives the rows.
func (t *hopTranscripts) adopted(n int, toks []int32, rows func() []float32) {
	if t.tr == nil || n == 0 {
		return
	}
	w := t.hs.se.info.NEmbd
	if t.hs.head {
		w = 0
	}
	t.tr.base.Adopted = uint32(n)
	ready := make(chan struct{})
	t.tr.adoptedReady = ready
	sid, epoch := t.hs.open.GetSessionId(), t.hs.key.Epoch
	go func() {
		defer close(ready)
		var in []float32
		if rows != nil && w > 0 {
			in = rows()
		}
		frames := AdoptedFrames(n, toks, in, w)
		if frames == nil {
			return
		}
		t.tr.adoptedDigest = InputDigest(frames)
		for _, f := range frames { // framed like the session's own (not digested)
			f.Header.SessionId, f.Header.Epoch = sid, epoch
		}
		t.store.recordAdopted(t.kept, frames)
	}()
}

// recordAdopted keeps a session's adopted inputs: on top of its bound
// (they are positions its sent frames do not cover) but within the hop's;
// past that they are not kept and the record is not truncated (the
// epoch's own frames still are, for the relay check).
func (s *auditStore) recordAdopted(k *kept, frames []*meshp2pb.RecordedFrame) {
	select {
	case <-k.ended: // made beside a session that ended before any statement: nothing to audit
		return
	default:
	}
	var n int64
	for _, f := range frames {
		n += int64(len(f.GetPayload()) + recordOverhead)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if !s.reserve(n) {
		return
	}
	k.limit += n
	k.bytes.Add(n)
	k.adopted = frames
}

// positions is how many positions frames cover.
func positions(frames []*meshp2pb.RecordedFrame) int {
	n := 0
	for _, f := range frames {
		n += int(f.GetHeader().GetNRows())
	}
	return n
}

// adoptedVerdict is rep ended by the check of the adopted inputs: failed
// (a signed contradiction) or inconclusive (why).
func adoptedVerdict(rep AuditReport, failed, why string) AuditReport {
	rep.Outcome, rep.Reason = AuditInconclusive, why
	if failed != "" {
		rep.Outcome, rep.Reason = AuditFailed, failed
	}
	return rep
}
