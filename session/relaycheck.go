package session

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// The relay check (issue 37, docs/trust.md). The tail sends its tokens
// (TokenFrame; WindowResult in speculative sessions) to the head, which
// passes them to the origin; the tail signs the digest of what it sent
// (its statements' out_digest), the head checks those statements against
// what arrived and keeps them, and the tail keeps the messages themselves
// (AUDIT_PART_RING). On every audited generation the origin fetches both,
// keeps the tail's messages that its signed digests cover, and asks
// whether an honest head, given those messages in that order, could have
// passed it the tokens it received. An honest head passes every token
// frame on as it came; of the window results it passes on, whole and in
// order, those of its current speculation generation (the generation
// rises only after a correction, which cannot always be told from the
// result alone: both are tried), checks that each continues the tokens
// before it, and drops those of an older generation; it stops at the end
// of generation, at max_tokens or when the origin closes. When no such
// history gives the origin's tokens, the head changed, dropped or added
// tokens: this origin convicts it (no transferable proof: the tokens the
// origin received are its word). Records missing or not matching the
// tail's signatures are inconclusive, and a one-hop route has no relay.

// relayed is what the origin received from the head in the final epoch.
type relayed struct {
	tokens []int32 // in the order they arrived
	at     int     // the session position of tokens[0]
	eos    bool    // the last one came marked as the end of generation
}

// checkRelay checks what the head of open's epoch passed on (got) against
// what the tail signed it sent: AuditFailed convicts the head, Relayed
// counts the tokens checked.
func (o *Origin) checkRelay(ctx context.Context, open *meshp2pb.SessionOpen, got relayed) AuditReport {
	hops := open.GetRoute().GetHops()
	head := peer.ID(hops[0].GetPeerId())
	rep := AuditReport{Peer: head, Start: int(hops[0].GetStart()), End: int(hops[0].GetEnd()), Epoch: open.GetEpoch()}
	inconclusive := func(format string, args ...any) AuditReport {
		rep.Outcome, rep.Reason = AuditInconclusive, "relay check: "+fmt.Sprintf(format, args...)
		return rep
	}
	tail := len(hops) - 1
	switch {
	case tail == 0:
		rep.Outcome, rep.Reason = AuditSkipped, "a one-hop route: the head relays its own tokens"
		return rep
	case len(got.tokens) == 0:
		rep.Outcome = AuditPassed
		return rep
	}
	recs, _, err := o.fetch(ctx, head, open, meshp2pb.AuditPart_AUDIT_PART_STATEMENTS)
	if err != nil {
		return inconclusive("the tail's statements from the head: %v", err)
	}
	sts, err := checkStatements(open, tail, recs.GetStatements())
	if err != nil {
		return inconclusive("the tail's statements from the head: %v", err)
	}
	ring, msgs, err := o.fetchRing(ctx, peer.ID(hops[tail].GetPeerId()), open)
	if err != nil {
		return inconclusive("the tail's records: %v", err)
	}
	sent, complete, why := verifyRing(sts, msgs, ring.GetTruncated())
	v := judgeRelay(sent, complete, got, speculative(open))
	rep.Relayed = v.checked
	switch {
	case v.convicted:
		rep.Outcome, rep.Reason = AuditFailed, "relay: "+v.reason
	case v.reason != "":
		return inconclusive("%s", v.reason)
	case !v.explained && why != "":
		return inconclusive("%d of the epoch's %d tokens checked: %s", v.checked, len(got.tokens), why)
	case !v.explained:
		return inconclusive("%d of the epoch's %d tokens checked", v.checked, len(got.tokens))
	default:
		rep.Outcome = AuditPassed
	}
	return rep
}

// fetchRing asks the tail p for the tokens and window results it sent
// the head in open's epoch.
func (o *Origin) fetchRing(ctx context.Context, p peer.ID, open *meshp2pb.SessionOpen) (*meshp2pb.AuditRecords, []*meshp2pb.StreamMessage, error) {
	s, r, rec, err := o.fetchStart(ctx, p, open, meshp2pb.AuditPart_AUDIT_PART_RING)
	if err != nil {
		return nil, nil, err
	}
	defer s.Close()
	msgs := make([]*meshp2pb.StreamMessage, 0, min(rec.GetFrames(), 4096))
	for range rec.GetFrames() {
		m, _, err := r.ReadStream()
		if err != nil {
			return nil, nil, fmt.Errorf("ring record from %s: %w", p, err)
		}
		if m.GetToken() == nil && m.GetWindowResult() == nil {
			return nil, nil, fmt.Errorf("ring record from %s: not a token or window result", p)
		}
		msgs = append(msgs, m)
	}
	return rec, msgs, nil
}

// verifyRing returns the prefix of the tail's records msgs that its
// statements sts (checked: its consecutive windows) sign it sent, and
// whether that is all it sent in the epoch (the final statement is among
// them); why says where the records stopped matching ("" when they did
// not). A window sends at most one message per input frame, and digests
// of different prefixes differ, so each window's messages are found by
// length.
func verifyRing(sts []*meshp2pb.Transcript, msgs []*meshp2pb.StreamMessage, truncated bool) (sent []*meshp2pb.StreamMessage, complete bool, why string) {
	at := 0
	for i, st := range sts {
		n, ok := ringWindow(msgs[at:], int(st.GetFrames()), st.GetOutDigest())
		if !ok {
			why = fmt.Sprintf("the tail's records from window %d on are not what it signed it sent", i)
			if truncated {
				why = fmt.Sprintf("the tail kept its records up to its bound only (window %d)", i)
			}
			return msgs[:at], false, why
		}
		at += n
	}
	return msgs[:at], len(sts) > 0 && sts[len(sts)-1].GetFinal(), ""
}

// ringWindow is how many of msgs (at most frames) digest to out.
func ringWindow(msgs []*meshp2pb.StreamMessage, frames int, out []byte) (int, bool) {
	h := sha256.New()
	for n := 0; ; n++ {
		if bytes.Equal(h.Sum(nil), out) {
			return n, true
		}
		if n == min(frames, len(msgs)) {
			return 0, false
		}
		digestRing(h, msgs[n])
	}
}

// relayVerdict is what judgeRelay found.
type relayVerdict struct {
	explained bool   // an honest head's history gives every token the origin received
	convicted bool   // none can: reason says where the histories end
	reason    string // why convicted, or (not convicted) why nothing could be decided
	checked   int    // tokens an honest history explains
}

// judgeRelay asks whether an honest head, given the tail's messages sent
// (in order; complete: all the tail sent), passes the origin got.
func judgeRelay(sent []*meshp2pb.StreamMessage, complete bool, got relayed, spec bool) relayVerdict {
	if !spec {
		return judgePlain(sent, complete, got)
	}
	s := &relaySim{got: got, buckets: map[uint64]map[int]bool{}, best: -1}
	for i, m := range sent {
		if s.explained || (len(s.buckets) == 0 && i > 0) {
			break
		}
		tf, wr := m.GetToken(), m.GetWindowResult()
		switch {
		case i == 0 && tf != nil:
			s.p0 = int(tf.GetPosition())
			if end, ok := s.take(0, []int32{tf.GetToken()}, tf.GetEos()); ok {
				s.add(0, end, false)
			}
		case i == 0:
			// The head fails the session there (a window result before
			// the first token): not a history that ends in a generation.
			return relayVerdict{checked: s.reach(), reason: fmt.Sprintf("the tail's message %d ends the session on an honest head", i)}
		case tf != nil:
			s.token(tf)
		default:
			s.result(wr)
		}
	}
	return s.verdict(complete)
}

// judgePlain is judgeRelay without speculation: the head passes every
// token frame on, in order, until the origin stops.
func judgePlain(sent []*meshp2pb.StreamMessage, complete bool, got relayed) relayVerdict {
	toks := got.tokens
	for i, m := range sent {
		if i == len(toks) {
			break
		}
		tf := m.GetToken()
		switch {
		case tf == nil:
			return relayVerdict{checked: i, reason: fmt.Sprintf("the tail's message %d is a window result in a session without speculation", i)}
		case tf.GetToken() != toks[i]:
			return relayVerdict{convicted: true, checked: i, reason: fmt.Sprintf("the head passed token %d at position %d, the tail signed it sent %d", toks[i], got.at+i, tf.GetToken())}
		case tf.GetEos() && i < len(toks)-1:
			return relayVerdict{convicted: true, checked: i, reason: fmt.Sprintf("the tail ended the generation at position %d, the head passed %d more tokens", got.at+i, len(toks)-1-i)}
		case !tf.GetEos() && i == len(toks)-1 && got.eos:
			return relayVerdict{convicted: true, checked: i, reason: fmt.Sprintf("the head ended the generation at position %d, the tail's token there does not end it", got.at+i)}
		}
	}
	n := min(len(sent), len(toks))
	if n == len(toks) {
		return relayVerdict{explained: true, checked: n}
	}
	if complete {
		return relayVerdict{convicted: true, checked: n, reason: fmt.Sprintf("the head passed %d tokens from position %d on that the tail never sent", len(toks)-n, got.at+n)}
	}
	return relayVerdict{checked: n}
}

// relaySim runs every honest head's history of a speculative session at
// once. A history is the tokens passed so far (off) and the head's
// speculation generation: gen, or gen+1 when the last result it passed
// on may have been a correction. buckets[gen][off] is true for "or
// gen+1". A window result of generation g moves only the histories of
// generations g-1 and g (the others drop it, or are over), and each
// history is moved at most twice, so a session's results cost linear
// time.
type relaySim struct {
	got       relayed
	p0        int // the first token's position: a result at position p continues the history at off p-p0
	buckets   map[uint64]map[int]bool
	explained bool
	best      int    // the furthest off a history ended at
	why       string // why it ended
}

// add records a history.
func (s *relaySim) add(gen uint64, off int, maybeNext bool) {
	b := s.buckets[gen]
	if b == nil {
		b = map[int]bool{}
		s.buckets[gen] = b
	}
	b[off] = b[off] || maybeNext
}

// lost records a history that ended at off, for the reason.
func (s *relaySim) lost(off int, why string) {
	if off > s.best {
		s.best, s.why = off, why
	}
}

// reach is the most tokens a live history explains.
func (s *relaySim) reach() int {
	n := 0
	for _, b := range s.buckets {
		for off := range b {
			n = max(n, off)
		}
	}
	return n
}

// result moves every history by a window result wr of generation g.
func (s *relaySim) result(wr *meshp2pb.WindowResult) {
	g := wr.GetSpecGen()
	var cur, prev map[int]bool
	for gen, b := range s.buckets {
		switch {
		case gen == g:
			cur = b
		case gen+1 == g:
			prev = b
		case gen > g:
			continue // the head drops an older generation's result
		default:
			for off := range b {
				s.lost(off, fmt.Sprintf("the tail's window result of generation %d comes after generation %d", g, gen))
			}
		}
		delete(s.buckets, gen)
	}
	for off, maybeNext := range prev {
		if !maybeNext {
			s.lost(off, fmt.Sprintf("the tail's window result of generation %d comes after generation %d", g, g-1))
			continue
		}
		s.step(g, off, wr)
	}
	for off, maybeNext := range cur {
		if maybeNext {
			s.add(g+1, off, false) // the last result was a correction: the head drops wr
		}
		s.step(g, off, wr)
	}
}

// token moves every history by a later token frame tf: the answer to a
// plain step, which an honest head sends with nothing in flight (K = 0)
// and passes on whole; its generation stays (a head sends one only once
// its hops saw its generation). A head with windows in flight, or whose
// step was at another position, fails the session there.
func (s *relaySim) token(tf *meshp2pb.TokenFrame) {
	old := s.buckets
	s.buckets = map[uint64]map[int]bool{}
	for g, b := range old {
		for off := range b {
			if int(tf.GetPosition())-s.p0 != off {
				s.lost(off, fmt.Sprintf("the tail's token at position %d does not continue the %d tokens passed before it", tf.GetPosition(), off))
				continue
			}
			if end, ok := s.take(off, []int32{tf.GetToken()}, tf.GetEos()); ok {
				s.add(g, end, false)
			}
		}
	}
}

// step passes wr on after the history at off, whose generation is wr's.
func (s *relaySim) step(g uint64, off int, wr *meshp2pb.WindowResult) {
	if int(wr.GetPosition())-s.p0 != off {
		s.lost(off, fmt.Sprintf("the tail's window result at position %d does not continue the %d tokens passed before it", wr.GetPosition(), off))
		return
	}
	if end, ok := s.take(off, wr.GetTokens(), wr.GetEos()); ok {
		s.add(g, end, true)
	}
}

// take passes toks on after the history at off; ok: the history goes on
// (to end), else it explained the origin's tokens or ended.
func (s *relaySim) take(off int, toks []int32, eos bool) (end int, ok bool) {
	got := s.got.tokens
	for j, t := range toks {
		if off+j == len(got) {
			if s.got.eos {
				s.lost(off+j-1, fmt.Sprintf("the head ended the generation at position %d, the tail's token there does not end it", s.got.at+off+j-1))
				return 0, false
			}
			s.explained = true // the origin stopped inside the result
			return 0, false
		}
		if t != got[off+j] {
			s.lost(off+j, fmt.Sprintf("the head passed token %d at position %d, the tail signed it sent %d", got[off+j], s.got.at+off+j, t))
			return 0, false
		}
	}
	end = off + len(toks)
	switch {
	case end == len(got) && (eos || !s.got.eos):
		s.explained = true
	case end == len(got):
		s.lost(end-1, fmt.Sprintf("the head ended the generation at position %d, the tail's token there does not end it", s.got.at+end-1))
	case eos:
		s.lost(end-1, fmt.Sprintf("the tail ended the generation at position %d, the head passed %d more tokens", s.got.at+end-1, len(got)-end))
	default:
		return end, true
	}
	return 0, false
}

// verdict is the simulation's end: explained, convicted when no history
// is left or (complete) none explains the tokens past the tail's.
func (s *relaySim) verdict(complete bool) relayVerdict {
	n := s.reach()
	switch {
	case s.explained:
		return relayVerdict{explained: true, checked: len(s.got.tokens)}
	case len(s.buckets) == 0 && s.why != "":
		return relayVerdict{convicted: true, checked: max(0, s.best), reason: s.why}
	case len(s.buckets) == 0:
		return relayVerdict{} // no message from the tail
	case complete && s.best >= n: // the furthest history ended for a reason
		return relayVerdict{convicted: true, checked: n, reason: s.why}
	case complete:
		return relayVerdict{convicted: true, checked: n, reason: fmt.Sprintf("the head passed %d tokens from position %d on that the tail never sent", len(s.got.tokens)-n, s.got.at+n)}
	}
	return relayVerdict{checked: n}
}
