package session

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// BundleTensor is the name of the one tensor an activation frame carries
// between hops: the hidden states after this hop's last layer.
const BundleTensor = "l_out"

// run processes the session until it ends: it waits for the ring (head),
// reads upstream frames in a goroutine and keeps the idle timer.
func (hs *hopSession) run(r *timedReader) {
	if hs.head && !hs.tail && !hs.standby { // a standby gets no ring
		select {
		case rs := <-hs.ring:
			hs.ringIn.Swap(rs)
			go hs.readRing(rs)
		case <-hs.done:
			return
		case <-time.After(hs.h.cfg.OpenTimeout):
			hs.fail(codeErr(meshp2pb.ErrorCode_ERROR_CODE_NEXT_HOP_UNREACHABLE, "tail never opened the ring", hs.route[len(hs.route)-1]))
			return
		}
	}
	if hs.head && hs.tail && !hs.standby {
		go hs.selfRing()
	}
	upstream := make(chan error, 1)
	go func() { upstream <- hs.readUpstream(r) }()
	// Until the first frame the idle timer is the first-frame timeout: an
	// open that reserved cells along the route and sends nothing is freed
	// soon. Through the prefill it follows the work (waits.go).
	st := idleState{wait: hs.waits.first, first: true}
	idle := time.NewTimer(st.wait)
	defer idle.Stop()
	for {
		select {
		case err := <-upstream:
			hs.h.noteSilence(hs, false)
			if err != nil {
				hs.fail(hs.fromUpstream(err))
			} else {
				hs.fail(nil)
			}
			return
		case <-hs.done:
			if hs.heard.Load() { // else it ended downstream: not the origin's doing
				hs.h.noteSilence(hs, false)
			}
			hs.unblock()
			hs.up.Close()
			<-upstream
			return
		case <-hs.activity:
			st = idleState{wait: hs.idleWait()}
			idle.Reset(st.wait)
		case <-idle.C:
			if d := hs.expired(&st); d > 0 {
				idle.Reset(d)
				continue
			}
			hs.unblock()
			hs.up.Close()
			<-upstream
			return
		}
	}
}

// readUpstream handles frames from upstream until close (nil) or failure.
func (hs *hopSession) readUpstream(r *timedReader) error {
	for {
		msg, tensors, err := r.ReadStream()
		if err != nil {
			if errors.Is(err, io.EOF) {
				// The upstream hop may have moved the seam: it attached
				// the new stream before ending this one.
				select {
				case ns := <-hs.resumeUp:
					if old := hs.up.Swap(ns); old != nil {
						_ = old.Close()
					}
					r = newTimedReader(ns, hs.h.cfg.Limits)
					hs.h.log.Info("seam from previous hop moved", "session", hs.key, "path", pathOf(hs.h.host, ns).String())
					continue
				default:
				}
				return nil
			}
			select {
			case <-hs.done:
				return nil
			default:
			}
			return err
		}
		hs.touch()
		switch k := msg.GetKind().(type) {
		case *meshp2pb.StreamMessage_Activation:
			if err := hs.fromOrigin(k.Activation); err != nil {
				return err
			}
			if !hs.head {
				if err := hs.tx.received(msg, tensors, hs.upstreamPeer()); err != nil {
					return err
				}
			}
			if err := hs.activation(k.Activation, tensors, hs.upstreamPeer(), r.timing()); err != nil {
				return err
			}
		case *meshp2pb.StreamMessage_Transcript:
			if hs.head {
				return codeErr(meshp2pb.ErrorCode_ERROR_CODE_UNEXPECTED_MESSAGE, "transcripts come from hops, not the origin", "")
			}
			if err := hs.statement(k.Transcript, hs.upstreamPeer()); err != nil {
				return err
			}
		case *meshp2pb.StreamMessage_Close:
			if more := k.Close.GetPrefixMore(); len(more) > 0 {
				hs.prefixMore.Store(&more)
			}
			if hs.standby {
				return nil // nothing to sign or relay
			}
			if err := hs.closeTranscripts(k.Close); err != nil {
				hs.h.log.Debug("clean close", "session", hs.key, "err", err)
			}
			return nil
		case *meshp2pb.StreamMessage_Progress:
			if err := hs.progress(msg); err != nil {
				return err
			}
		case *meshp2pb.StreamMessage_Cancel:
			return nil
		case *meshp2pb.StreamMessage_Error:
			// Errors travel upstream; one from upstream blames its sender
			// whatever it says (fromUpstream).
			return frame.FromProto(k.Error)
		default:
			return codeErr(meshp2pb.ErrorCode_ERROR_CODE_UNEXPECTED_MESSAGE, "unexpected message on session stream", hs.upstreamPeer())
		}
	}
}

// fromOrigin (the head) checks a frame from the origin: prompt chunks up
// to the last one, no verification window; to the head's standby the
// origin then sends the committed tokens (headstandby.go).
func (hs *hopSession) fromOrigin(a *meshp2pb.ActivationHeader) error {
	if !hs.head {
		return nil
	}
	if a.GetVerify() {
		return codeErr(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "verification windows start at the head, not the origin", hs.upstreamPeer())
	}
	if hs.standby && hs.prompted && !a.GetIsPrefill() {
		return nil // a standby has no ring: its decode rows come from the origin
	}
	// The origin sends the prompt and nothing after its last chunk:
	// decode steps start at the head (from the ring). A step from the
	// origin would race the ring's for one position (docs/locks.md: a
	// one-hop speculative session then blocked on its own hs.self).
	if !a.GetIsPrefill() || hs.prompted {
		return codeErr(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "the origin sends prompt chunks up to the last one, nothing after it", hs.upstreamPeer())
	}
	hs.prompted = a.GetLastChunk()
	return nil
}

// activation runs one frame through the shard and passes the result on.
// from sent the frame (the previous hop, the tail for the head's decode
// steps, "" for the origin or this hop itself): a frame the hop or its
// engine rejects is blamed on it. rt is how the frame reached this hop.
// With transcripts, the frame and what it made are digested, and every
// TranscriptWindow frames a signed statement follows them; the head does
// that under trMu and writes on the down seam after it, in turn (turn.go).
func (hs *hopSession) activation(a *meshp2pb.ActivationHeader, tensors [][]byte, from peer.ID, rt readTiming) error {
	defer hs.working(a.GetNRows())()
	if !hs.tx.signs() {
		return hs.compute(a, tensors, from, rt, nil)
	}
	if !hs.head {
		return hs.transcribed(a, tensors, from, rt, nil)
	}
	return hs.ordered(func(t *turn) error { return hs.transcribed(a, tensors, from, rt, t) })
}

// transcribed is activation with transcripts; the writes on the down
// seam go in t (nil: written at once).
func (hs *hopSession) transcribed(a *meshp2pb.ActivationHeader, tensors [][]byte, from peer.ID, rt readTiming, t *turn) error {
	if hs.closing.Load() {
		return nil // the head is closing: nothing more goes down
	}
	if err := hs.checkFrame(a, from, t); err != nil { // a re-send goes before a's input digest
		return err
	}
	hs.tx.input(a, tensors)
	if err := hs.compute(a, tensors, from, rt, t); err != nil {
		return err
	}
	return hs.inputDone(t)
}

// inputDone ends one input frame: a full window's statement goes where
// this hop's output went (on the down seam: in t; nil: at once).
func (hs *hopSession) inputDone(t *turn) error {
	st, err := hs.tx.done()
	if err != nil || st == nil {
		return err
	}
	return hs.sendStatement(st, t)
}

// sendStatement sends one of this hop's signed statements to the next
// hop, in t (nil: at once); the tail sends it to the head over the ring
// at once.
func (hs *hopSession) sendStatement(st *meshp2pb.SignedTranscript, t *turn) error {
	msg := &meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Transcript{Transcript: st}}
	if hs.tail {
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

// statement takes a statement of the hop before this one (the head: the
// tail's): checked and kept, or the session fails blaming from. The
// head's close waits for the tail's final one.
func (hs *hopSession) statement(st *meshp2pb.SignedTranscript, from peer.ID) error {
	last, err := hs.tx.statement(st, from)
	if err != nil {
		return err
	}
	if hs.head && last {
		close(hs.tailFinal)
	}
	return nil
}

// compute is activation without transcripts; the write on the down seam
// goes in t (nil: written at once).
func (hs *hopSession) compute(a *meshp2pb.ActivationHeader, tensors [][]byte, from peer.ID, rt readTiming, t *turn) error {
	if err := hs.checkFrame(a, from, t); err != nil {
		return err
	}
	if a.GetVerify() {
		if err := checkWindow(a, speculative(hs.open), hs.spec.gen); err != nil {
			return codeErr(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, err.Error(), from)
		}
	} else if len(a.GetLookahead()) != 0 || a.GetSpecGen() != 0 {
		return codeErr(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "speculation fields on a frame that is not a verification window", from)
	}
	in, err := hs.inputOf(a, tensors, from, &rt)
	if err != nil {
		return err
	}
	sampler := hs.tail && !hs.standby // a standby's output goes nowhere
	if sampler {
		in.Sample = a.GetLastChunk() || !a.GetIsPrefill()
	}
	if a.GetVerify() {
		if skip, err := hs.windowGen(a, from); skip || err != nil {
			return err
		}
		if sampler {
			in.Sample, in.Verify, in.Draft = false, true, append(slices.Clone(a.GetTokens()[1:]), a.GetLookahead()...)
		}
	} else if hs.sp != nil && a.GetIsPrefill() {
		hs.sp.history(a.GetTokens())
	}
	if rows, budget := hs.rows.Add(int64(a.GetNRows())), rowBudget(hs.open); rows > budget {
		return codeErr(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, fmt.Sprintf("%d rows computed for this session, over its budget of %d (its KV reservation, × (1 + max_draft) × max_windows with speculation)", rows, budget), from)
	}
	t0 := time.Now()
	out, err := hs.eng.Forward(context.Background(), in)
	if err != nil {
		return engineErr(err, from, hs.h.host.ID())
	}
	took := time.Since(t0)
	if hs.key.Epoch > 1 && !hs.firstRows.Swap(true) { // a re-routed epoch: where its stall goes (debug)
		hs.h.log.Debug("re-routed epoch's first rows computed", "session", hs.key, "pos", a.GetPosStart(), "rows", a.GetNRows(),
			"took", took.Round(time.Microsecond), "since_admitted", time.Since(hs.admittedAt).Round(time.Microsecond))
	}
	if hs.standby { // only its KV counts
		hs.h.standby.computed(int(a.GetNRows()), took)
		return nil
	}
	hs.h.cfg.Observer.Computed(a.GetIsPrefill(), int(a.GetNRows()), took)
	us := uint32(took.Microseconds())
	if a.GetNRows() == 1 && hs.se.own {
		hs.h.observeDecode(took, hs.se.info.End-hs.se.info.Start)
	}
	own := &meshp2pb.HopTiming{WaitUs: usOf(rt.wait), ReadUs: usOf(rt.read), DecodeUs: usOf(rt.decode), ComputeUs: us,
		WriteUs: uint32(hs.clock.write.Load()), UpUs: uint32(hs.clock.up.Load())}
	timing := ownTiming(a.GetHopTiming(), hs.idx, own)
	if !hs.tail {
		return hs.sendDown(a, out.Hidden, us, timing, own, t)
	}
	if in.Verify {
		return hs.sendResult(a, out.Tokens, us, timing)
	}
	if !in.Sample {
		return nil
	}
	tf := tokenFrame(a, out.Token, hs.se.eng.IsEOG(out.Token))
	tf.HopUs, tf.HopTiming, tf.Logprobs = append(a.GetHopUs(), us), timing, out.Logprobs
	return hs.sendRing(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Token{Token: tf}})
}

// inputOf is frame a's input to the engine: the head's tokens, or the
// hidden states of its one tensor (rt.decode: the conversion's time); a
// frame that does not fit is blamed on from.
func (hs *hopSession) inputOf(a *meshp2pb.ActivationHeader, tensors [][]byte, from peer.ID, rt *readTiming) (Input, error) {
	in := Input{Pos: int(a.GetPosStart())}
	if hs.head {
		if len(a.GetTokens()) != int(a.GetNRows()) || len(tensors) != 0 {
			return in, codeErr(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "head expects token ids only", from)
		}
		in.Tokens = a.GetTokens()
		return in, nil
	}
	nEmbd := hs.se.info.NEmbd
	if len(tensors) != 1 || a.GetTensors()[0].GetName() != BundleTensor {
		return in, codeErr(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "expected one l_out tensor", from)
	}
	ti := a.GetTensors()[0]
	if len(ti.GetShape()) != 2 || ti.GetShape()[0] != int64(a.GetNRows()) || ti.GetShape()[1] != int64(nEmbd) {
		return in, codeErr(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, fmt.Sprintf("tensor shape %v, want [%d %d]", ti.GetShape(), a.GetNRows(), nEmbd), from)
	}
	t0 := time.Now()
	hidden, err := frame.ToF32(ti.GetDtype(), tensors[0], nil)
	if err != nil {
		return in, asHopError(err, from)
	}
	in.Hidden = hidden
	rt.decode = time.Since(t0)
	return in, nil
}

// checkFrame refuses a frame of another session or epoch; the first
// frame also settles the positions this hop reuses (startAt) and has it
// re-send the next hop what it needs from the previous epoch (in t).
func (hs *hopSession) checkFrame(a *meshp2pb.ActivationHeader, from peer.ID, t *turn) error {
	if !bytes.Equal(a.GetSessionId(), hs.open.GetSessionId()) || a.GetEpoch() != hs.key.Epoch {
		return codeErr(meshp2pb.ErrorCode_ERROR_CODE_SESSION_UNKNOWN, "activation for another session or epoch", from)
	}
	if err := hs.startAt(a, from); err != nil {
		return err
	}
	return hs.sendReplay(a, t)
}

// tokenFrame is the tail's answer to a frame it sampled after.
func tokenFrame(a *meshp2pb.ActivationHeader, tok int32, eos bool) *meshp2pb.TokenFrame {
	return &meshp2pb.TokenFrame{SessionId: a.GetSessionId(), Epoch: a.GetEpoch(), Step: a.GetStep(), Token: tok,
		Position: a.GetPosStart() + a.GetNRows(), Eos: eos}
}

// sendRing (tail) sends a token or a window's result to the head.
func (hs *hopSession) sendRing(msg *meshp2pb.StreamMessage) error {
	hs.tx.ring(msg)
	if hs.head {
		select { // to selfRing, which is waiting (it sent the previous step)
		case hs.self <- msg:
		case <-hs.done:
		}
		return nil
	}
	path, t1 := hs.seamPath(hs.ringOut), time.Now()
	if err := hs.ringOut.Send(msg, WriteDeadline(hs.h.cfg.Idle)); err != nil {
		return linkErr("ring to head", err, hs.route[0], hs.h.host.ID())
	}
	d := time.Since(t1)
	hs.h.cfg.Observer.SeamWrite(path, proto.Size(msg), d)
	hs.clock.write.Store(int64(usOf(d)))
	return nil
}

// sendDown writes hidden states to the next hop in the session's wire
// dtype; timing (whose last entry, own, is this hop's) goes with them.
// The frame is digested now and written in t (nil: at once).
func (hs *hopSession) sendDown(a *meshp2pb.ActivationHeader, hidden []float32, us uint32, timing []*meshp2pb.HopTiming, own *meshp2pb.HopTiming, t *turn) error {
	a, hidden, ok := hs.forwarded(a, hidden, hs.se.info.NEmbd)
	if !ok {
		return nil // rows the next hop holds (failover.go)
	}
	t0 := time.Now()
	hdr, payload := downFrame(a, hidden, hs.wire, hs.se.info.NEmbd)
	own.EncodeUs = usOf(time.Since(t0))
	hdr.HopUs, hdr.HopTiming = append(a.GetHopUs(), us), timing
	if err := hs.tx.sent(hdr, payload); err != nil {
		return err
	}
	return t.add(func() error { return hs.writeDown(hdr, payload) })
}

// writeDown writes one activation frame on the down seam.
func (hs *hopSession) writeDown(hdr *meshp2pb.ActivationHeader, payload []byte) error {
	// A next hop that stops reading must not wedge us: the write deadline
	// (WriteDeadline) makes this specific error, which names the next hop,
	// win over our own idle timeout, which could not.
	if p := hs.progressOut.Swap(nil); p != nil {
		if err := hs.down.Send(p, WriteDeadline(hs.h.cfg.Idle)); err != nil {
			return linkErr("send to next hop", err, hs.route[hs.idx+1], hs.h.host.ID())
		}
	}
	path, t1 := hs.seamPath(hs.down), time.Now()
	if err := hs.down.SendActivation(hdr, payload, hs.downDeadline(hdr.GetNRows())); err != nil {
		return linkErr("send to next hop", err, hs.route[hs.idx+1], hs.h.host.ID())
	}
	d := time.Since(t1)
	hs.h.cfg.Observer.SeamWrite(path, len(payload), d)
	hs.clock.write.Store(int64(usOf(d)))
	hs.mirror.activation(hdr, payload) // the covered hop's standby gets the same
	return nil
}

// downFrame is the frame a hop sends on for input a, whose rows gave
// hidden: in the session's wire dtype, with a's tokens on prefill and a
// verification window's fields.
func downFrame(a *meshp2pb.ActivationHeader, hidden []float32, wire meshp2pb.DType, nEmbd int) (*meshp2pb.ActivationHeader, []byte) {
	payload, dt := frame.EncodeWire(wire, hidden)
	rows := len(hidden) / nEmbd
	hdr := &meshp2pb.ActivationHeader{SessionId: a.GetSessionId(), Epoch: a.GetEpoch(), Step: a.GetStep(), PosStart: a.GetPosStart(),
		NRows: uint32(rows), IsPrefill: a.GetIsPrefill(), LastChunk: a.GetLastChunk(),
		Tensors: []*meshp2pb.TensorInfo{{Name: BundleTensor, Dtype: dt, Shape: []int64{int64(rows), int64(nEmbd)}}}}
	if a.GetVerify() {
		hdr.Verify, hdr.SpecGen, hdr.Tokens, hdr.Lookahead = true, a.GetSpecGen(), a.GetTokens(), a.GetLookahead()
	}
	if a.GetIsPrefill() {
		hdr.HopStarts = a.GetHopStarts()
	}
	return hdr, payload
}

// seamPath is how the seam's current stream runs (direct or relayed).
func (hs *hopSession) seamPath(m *Seam) p2p.Path {
	if s := m.stream(); s != nil {
		return pathOf(hs.h.host, s)
	}
	return p2p.PathNone
}

// readRing (head) takes sampled tokens from the tail.
func (hs *hopSession) readRing(rs network.Stream) {
	r := newTimedReader(rs, hs.h.cfg.Limits)
	tail := hs.route[len(hs.route)-1]
	for {
		msg, _, err := r.ReadStream()
		if err != nil {
			if errors.Is(err, io.EOF) {
				// Either the tail moved the ring to a direct connection
				// (the new stream arrives here), or it closed the ring
				// without saying why: the cause is then usually upstream of
				// it, and our downstream watcher will name it. Blame the
				// tail only if nothing else happens.
				select {
				case <-hs.done:
					return
				case ns := <-hs.resumeRing:
					if old := hs.ringIn.Swap(ns); old != nil {
						_ = old.Close()
					}
					r = newTimedReader(ns, hs.h.cfg.Limits)
					hs.h.log.Info("ring from tail moved", "session", hs.key, "path", pathOf(hs.h.host, ns).String())
					continue
				case <-time.After(RingGrace):
				}
			} else {
				// A reset ring too: a tail that fails resets it right after
				// its report, which the reset may drop; the same report
				// comes up the seams.
				select {
				case <-hs.done:
				case <-time.After(RingGrace):
				}
			}
			select {
			case <-hs.done:
			default:
				hs.fail(linkErr(fmt.Sprintf("lost ring from tail %s", tail), err, tail, hs.h.host.ID()))
			}
			return
		}
		hs.touch()
		if msg.GetToken() != nil || msg.GetWindowResult() != nil {
			if err := hs.tx.received(msg, nil, tail); err != nil {
				hs.fail(asHopError(err, ""))
				return
			}
		}
		switch k := msg.GetKind().(type) {
		case *meshp2pb.StreamMessage_Transcript:
			if err := hs.statement(k.Transcript, tail); err != nil {
				hs.fail(asHopError(err, ""))
				return
			}
		case *meshp2pb.StreamMessage_Token:
			if err := hs.token(k.Token, tail, r.timing()); err != nil {
				hs.fail(asHopError(err, ""))
				return
			}
		case *meshp2pb.StreamMessage_WindowResult:
			if err := hs.windowResult(k.WindowResult, tail, r.timing()); err != nil {
				hs.fail(asHopError(err, ""))
				return
			}
		case *meshp2pb.StreamMessage_Error:
			hs.fail(hs.ringReport(k.Error, tail))
			return
		default:
			hs.fail(codeErr(meshp2pb.ErrorCode_ERROR_CODE_UNEXPECTED_MESSAGE, "unexpected message on ring", tail))
			return
		}
	}
}

// token (head) passes a sampled token from the tail (from; "" on a
// one-hop route) to the origin and, unless the session is done, feeds it
// back into the route as the next decode step (rt: how it reached us).
func (hs *hopSession) token(tf *meshp2pb.TokenFrame, from peer.ID, rt readTiming) error {
	hs.touch()
	if hs.closing.Load() {
		return nil // the origin closed the session: digested, not relayed
	}
	if hs.sp != nil {
		return hs.specToken(tf, from, rt)
	}
	if done, err := hs.relay(tf); done || err != nil {
		return err
	}
	a := &meshp2pb.ActivationHeader{SessionId: tf.GetSessionId(), Epoch: tf.GetEpoch(), Step: tf.GetStep() + 1,
		PosStart: tf.GetPosition(), NRows: 1, LastChunk: true, Tokens: []int32{tf.GetToken()}}
	return hs.activation(a, nil, from, rt)
}

// specToken (head of a speculative session) takes a token frame from the
// tail (from): the prefill's, which starts the proposer, or a plain
// step's (K = 0). Each goes to the origin, then the next windows or step
// go out; a token frame no plain step asked for is blamed on from.
func (hs *hopSession) specToken(tf *meshp2pb.TokenFrame, from peer.ID, rt readTiming) error {
	res, begun, err := hs.sp.stepped(tf)
	switch {
	case err != nil:
		return codeErr(meshp2pb.ErrorCode_ERROR_CODE_UNEXPECTED_MESSAGE, err.Error(), from)
	case begun && res.toks == nil:
		return nil // the session ended
	case begun:
		tf.Spec = res.stats
	}
	if done, err := hs.relay(tf); done || err != nil {
		hs.sp.finish() // the origin closes the session
		return err
	}
	if !begun {
		hs.sp.prefilled(tf.GetHopUs())
		if !hs.sp.begin(tf.GetToken(), int(tf.GetPosition()), tf.GetStep()) {
			return codeErr(meshp2pb.ErrorCode_ERROR_CODE_UNEXPECTED_MESSAGE, "token frame in a speculative session that is verifying windows", from)
		}
	}
	return hs.sendWindows(from, rt)
}

// selfRing is the ring of a one-hop route: it feeds each sampled token
// back in, like readRing does with the tail's tokens.
func (hs *hopSession) selfRing() {
	for {
		select {
		case <-hs.done:
			return
		case msg := <-hs.self:
			var err error
			if wr := msg.GetWindowResult(); wr != nil {
				err = hs.windowResult(wr, "", readTiming{})
			} else {
				err = hs.token(msg.GetToken(), "", readTiming{})
			}
			if err != nil {
				hs.fail(asHopError(err, ""))
				return
			}
		}
	}
}

// relay (head) passes a token to the origin and reports whether the
// session is done (end of generation or max_tokens: the origin closes it).
func (hs *hopSession) relay(tf *meshp2pb.TokenFrame) (bool, error) {
	if hs.h.relayTamper != nil {
		hs.h.relayTamper(tf)
	}
	t0 := time.Now()
	if err := hs.up.Send(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Token{Token: tf}}, hs.h.cfg.Idle); err != nil {
		return true, codeErr(meshp2pb.ErrorCode_ERROR_CODE_CANCELLED, "origin gone", "")
	}
	hs.clock.up.Store(int64(usOf(time.Since(t0))))
	hs.h.cfg.Observer.TokenServed()
	hs.produced++
	return tf.GetEos() || (hs.maxTokens > 0 && hs.produced >= hs.maxTokens), nil
}

// windowGen applies a verification window's generation on this hop: a
// new one drops the session's rows from the window's first position on
// (the rejected rows); on the tail, a window of a rejected generation is
// skipped (skip).
func (hs *hopSession) windowGen(a *meshp2pb.ActivationHeader, from peer.ID) (skip bool, err error) {
	if g := a.GetSpecGen(); g > hs.spec.gen {
		hs.spec.gen, hs.spec.rejected = g, false
		if err := hs.eng.Truncate(context.Background(), int(a.GetPosStart())); err != nil {
			return false, engineErr(err, from, hs.h.host.ID())
		}
	}
	return hs.tail && hs.spec.rejected, nil
}

// sendResult (tail) answers a verification window with its targets.
func (hs *hopSession) sendResult(a *meshp2pb.ActivationHeader, toks []int32, us uint32, timing []*meshp2pb.HopTiming) error {
	if len(toks) == 0 {
		return codeErr(meshp2pb.ErrorCode_ERROR_CODE_INTERNAL, "verification sampled nothing", hs.h.host.ID())
	}
	wr, rejected := windowAnswer(a, toks, hs.se.eng.IsEOG)
	// A target that differs from its proposal rejects the rest of this
	// generation's windows.
	hs.spec.rejected = rejected
	wr.HopUs, wr.HopTiming = append(a.GetHopUs(), us), timing
	return hs.sendRing(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_WindowResult{WindowResult: wr}})
}

// windowAnswer is the tail's result of window a whose targets are toks
// (at least one): up to and including the first end-of-generation token;
// rejected when a target differs from its proposal.
func windowAnswer(a *meshp2pb.ActivationHeader, toks []int32, isEOG func(int32) bool) (*meshp2pb.WindowResult, bool) {
	draft := len(a.GetTokens()) - 1 + len(a.GetLookahead())
	n := len(toks)
	rejected := n <= draft && toks[n-1] != proposalAt(a, n-1)
	eos := false
	for i, t := range toks {
		if isEOG(t) {
			toks, eos = toks[:i+1], true
			break
		}
	}
	return &meshp2pb.WindowResult{SessionId: a.GetSessionId(), Epoch: a.GetEpoch(), Step: a.GetStep(), SpecGen: a.GetSpecGen(),
		Position: a.GetPosStart() + 1, Tokens: toks, Eos: eos}, rejected
}

// proposalAt is the token a window proposes after its row i.
func proposalAt(a *meshp2pb.ActivationHeader, i int) int32 {
	if i+1 < len(a.GetTokens()) {
		return a.GetTokens()[i+1]
	}
	return a.GetLookahead()[0]
}

// windowResult (head) passes a window's committed tokens to the origin
// and sends the next windows; from sent it (the tail; "" on a one-hop
// route), and is blamed for a result that does not fit what was sent.
func (hs *hopSession) windowResult(wr *meshp2pb.WindowResult, from peer.ID, rt readTiming) error {
	hs.touch()
	if hs.closing.Load() {
		return nil
	}
	if !bytes.Equal(wr.GetSessionId(), hs.open.GetSessionId()) || wr.GetEpoch() != hs.key.Epoch {
		return codeErr(meshp2pb.ErrorCode_ERROR_CODE_SESSION_UNKNOWN, "window result for another session or epoch", from)
	}
	if hs.sp == nil {
		return codeErr(meshp2pb.ErrorCode_ERROR_CODE_UNEXPECTED_MESSAGE, "window result in a session without speculation", from)
	}
	res, err := hs.sp.result(wr)
	if err != nil {
		return codeErr(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, err.Error(), from)
	}
	toks := res.toks
	if toks == nil {
		return nil // a rejected generation's, or the session ended
	}
	hs.h.cfg.Observer.Verified(res.verified, res.accepted)
	for i, t := range toks {
		tf := &meshp2pb.TokenFrame{SessionId: wr.GetSessionId(), Epoch: wr.GetEpoch(), Step: wr.GetStep(), Token: t,
			Position: wr.GetPosition() + uint32(i), Eos: wr.GetEos() && i == len(toks)-1, Spec: res.stats}
		if i == 0 { // the window's times, once
			tf.HopUs, tf.HopTiming = wr.GetHopUs(), wr.GetHopTiming()
		}
		if done, err := hs.relay(tf); done || err != nil {
			hs.sp.finish() // the origin closes the session
			return err
		}
	}
	return hs.sendWindows(from, rt)
}

// sendWindows (head) sends the windows the proposer has room for through
// this hop's own layers. Their tokens come from the tail's results (from:
// the tail; "" on a one-hop route), which are blamed for one the engine
// refuses; rt is how the result that let them go reached us (the first
// window's HopTiming).
func (hs *hopSession) sendWindows(from peer.ID, rt readTiming) error {
	tokens := math.MaxInt
	if hs.maxTokens > 0 {
		tokens = hs.maxTokens - hs.produced
	}
	ws := hs.sp.windows(hs.open.GetSessionId(), hs.key.Epoch, int(hs.open.GetNCtxNeeded()), tokens)
	if len(ws) == 0 && hs.sp.stalled() {
		return codeErr(meshp2pb.ErrorCode_ERROR_CODE_CONTEXT_FULL, "the session's KV cells are spent", "")
	}
	for _, a := range ws {
		if err := hs.activation(a, nil, from, rt); err != nil {
			return err
		}
		rt = readTiming{}
	}
	hs.sp.afterSend()
	return nil
}
