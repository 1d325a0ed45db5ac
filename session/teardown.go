package session

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// fail ends the session once, telling upstream why (he nil: a clean end).
func (hs *hopSession) fail(he *hopError) {
	hs.once.Do(func() {
		if he != nil {
			hs.err = he
			if len(he.e.GetPeerId()) == 0 {
				he.e.PeerId = []byte(hs.h.host.ID())
			}
			he.e.SessionId, he.e.Epoch = hs.open.GetSessionId(), hs.open.GetEpoch()
			if hs.mirror != nil && hs.mirror.dropped.Load() {
				he.e.StandbyLost = true // the origin must not count on it
			}
			msg := &meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Error{Error: he.e}}
			// A writer blocked on a peer that stopped reading holds the
			// seam; the deadline frees it (and bounds our own write).
			hs.up.Interrupt(FailWriteTimeout)
			_ = hs.up.Send(msg, FailWriteTimeout)
			// The tail also tells the head over the ring, so the head blames
			// the right peer (its ring closing alone would point at us).
			if hs.tail && !hs.head {
				_ = hs.ringOut.Send(msg, FailWriteTimeout)
			}
		}
		close(hs.done)
	})
}

// TranscriptCloseWait bounds how long the head, at a clean close, waits
// for the tail's final statement (one ring round after the close went
// down the route).
const TranscriptCloseWait = 2 * time.Second

// closeTranscripts runs at a clean close from upstream in a session with
// transcripts: this hop's final statement goes where its output went,
// and the close goes on down the route so every hop does the same; the
// head then waits (bounded) for the tail's final statement on the ring.
// The head signs its final statement under trMu, after every input it
// took before, and writes it and the close in turn after them (turn.go).
func (hs *hopSession) closeTranscripts(c *meshp2pb.SessionClose) error {
	if !hs.open.GetTranscripts() {
		// No transcripts: the route ends as the streams close, but a
		// session with a prefix tells every hop what to keep first.
		switch {
		case hs.open.GetPrefix() == nil:
			return nil
		case hs.tail:
			// Closing here too, so the next turn's admission waits for
			// this session's keep (waitClosing).
			hs.closing.Store(true)
			return nil
		}
		return hs.closeDown(c, nil)
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
	st, err := hs.tx.final()
	if err != nil {
		return err
	}
	if st != nil {
		if err := hs.sendStatement(st, t); err != nil {
			return err
		}
	}
	if hs.tail {
		return nil
	}
	msg := &meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Close{Close: proto.Clone(c).(*meshp2pb.SessionClose)}}
	return t.add(func() error {
		if err := hs.down.Send(msg, WriteDeadline(hs.h.cfg.Idle)); err != nil {
			return err
		}
		hs.mirror.message(msg)
		return nil
	})
}

// release frees everything the session holds on this hop.
func (hs *hopSession) release() {
	defer close(hs.released)
	hs.fail(nil)
	h := hs.h
	if next := hs.down.RemotePeer(); next != "" {
		hs.down.Close()
		h.host.Unprotect(next, RouteProtectTag)
	}
	hs.ringOut.Close()
	hs.ringIn.Close()
	select {
	case rs := <-hs.ring:
		_ = rs.Reset()
	default:
	}
	hs.up.Close()
	// Free the engine session (KV cells, slot) before the session leaves
	// the active map: a new epoch that no longer finds it there (supersede)
	// must find its cells free.
	hs.closeEngine()
	hs.dropPendingResumes()
	if hs.admitted { // before it leaves the active map: Sessions() == 0 implies it is counted
		h.cfg.Observer.SessionEnded(errCode(hs.err))
	}
	if hs.sp != nil {
		hs.sp.close() // the in-flight gauge back by what was in flight
	}
	hs.tx.end() // complete: an audit fetch may read its records
	h.mu.Lock()
	delete(h.active, hs.key)
	h.mu.Unlock()
	// A resume that found the session just before it left the map may
	// have queued its stream meanwhile.
	hs.dropPendingResumes()
	hs.logEnd()
}

// logEnd is the session's one summary line on this hop (an admitted one
// at info, every failed one at warn; a refused open only at debug): who
// opened it, what it computed here and for how long, how much
// the prefix cache gave, and how it ended.
func (hs *hopSession) logEnd() {
	args := []any{"session", hs.key, "origin", hs.origin, "hop", hs.idx, "rows", hs.rows.Load(), "cached", hs.cached}
	switch {
	case !hs.admitted:
		hs.h.log.Debug("session released before admission", append(args, "err", hs.err)...)
	case hs.err != nil:
		hs.h.log.Warn("session ended with an error", append(args, "took", time.Since(hs.admittedAt).Round(time.Millisecond), "err", hs.err)...)
	default:
		hs.h.log.Info("session ended", append(args, "took", time.Since(hs.admittedAt).Round(time.Millisecond))...)
	}
}

// dropPendingResumes resets replacement streams a seam move queued but the
// session will never attach, so they do not linger until the peer gives up.
func (hs *hopSession) dropPendingResumes() {
	for _, ch := range []chan network.Stream{hs.resumeUp, hs.resumeRing} {
		select {
		case s := <-ch:
			_ = s.Reset()
		default:
		}
	}
}

// unblock resets the streams this hop writes after the session failed, so
// no goroutine stays blocked writing to a peer that stopped reading.
func (hs *hopSession) unblock() {
	hs.down.Reset()
	hs.ringOut.Reset()
}

// watchDownstream reads the reverse direction of the downstream seam: only
// errors travel there. Any error, or the stream dying, fails the session
// naming the peer to blame.
func (hs *hopSession) watchDownstream(s network.Stream, r *frame.Reader) {
	next := hs.route[hs.idx+1]
	msg, _, err := r.ReadStream()
	select {
	case <-hs.done:
		return // we are closing it ourselves
	default:
	}
	if hs.closing.Load() {
		// A clean close went down the route: the next hop ended with it,
		// and what it reports now cannot change a finished generation.
		if err == nil && msg.GetError() != nil {
			hs.h.log.Debug("report from the next hop after a clean close", "session", hs.key, "err", frame.FromProto(msg.GetError()))
		}
		return
	}
	if !hs.down.Is(s) && err != nil {
		return // the seam moved to another stream; this one just ended
	}
	switch {
	case err == nil && msg.GetError() != nil:
		hs.fail(hs.fromDownstream(msg.GetError(), next, false))
	case err == nil:
		hs.fail(codeErr(meshp2pb.ErrorCode_ERROR_CODE_UNEXPECTED_MESSAGE, "unexpected message from next hop", next))
	default:
		hs.fail(linkErr(fmt.Sprintf("lost next hop %s", next), err, next, hs.h.host.ID()))
	}
}

// fromDownstream accepts an error report that neighbour (the next hop,
// or on the ring the tail) sent us, but lets it blame only what its
// reporter can see: the reporter itself or its direct neighbours on the
// route, and never this hop or one before it (a hop must not be able to
// get an earlier, honest hop excluded). On the ring the reporter is the
// tail itself (nothing is relayed there); on the seam it is the peer the
// report names as reporter if that is a later hop (the next hop relays
// what hops after it report), else the neighbour. A report that blames
// anyone else, or nobody, is blamed on the neighbour that sent it: a hop
// that fails a generation must not escape the re-route. (A relaying hop
// can still forge a later reporter: reports are not signed.)
func (hs *hopSession) fromDownstream(e *meshp2pb.Error, neighbour peer.ID, ring bool) *hopError {
	if v := hs.verdict(e); v != nil {
		return v // a silence blamed on this hop, which knows better
	}
	e = proto.Clone(e).(*meshp2pb.Error)
	at := func(p peer.ID) int { // route index of p after us, -1 if none
		for j := hs.idx + 1; j < len(hs.route); j++ {
			if hs.route[j] == p {
				return j
			}
		}
		return -1
	}
	r := at(neighbour)
	if claimed := at(peer.ID(e.GetPeerId())); !ring && claimed > r {
		r = claimed
	}
	fp := peer.ID(e.GetFailedPeerId())
	if e.GetCode() == meshp2pb.ErrorCode_ERROR_CODE_TICKET_EXPIRED && fp != "" && !slices.Contains(hs.route, fp) {
		return &hopError{e} // names the ticket's tracker, not a hop: a fresh ticket will do
	}
	b := at(fp)
	if r < 0 || b < 0 || b < r-1 || b > r+1 {
		e.FailedPeerId = []byte(neighbour)
	}
	return &hopError{e}
}

// fromUpstream turns the end of readUpstream into the report. An Error
// the previous hop sent down the seam (errors only travel upstream) is
// blamed on that hop whatever it names, and so are frames it sent that
// could not be read; a report this hop made itself stays as it is.
func (hs *hopSession) fromUpstream(err error) *hopError {
	var re *frame.RemoteError
	if errors.As(err, &re) && re.E != nil {
		e := proto.Clone(re.E).(*meshp2pb.Error)
		e.PeerId, e.FailedPeerId = nil, nil
		if p := hs.upstreamPeer(); p != "" {
			e.FailedPeerId = []byte(p)
		}
		return &hopError{e}
	}
	if closedHere(err) {
		return linkErr("lost previous hop", err, hs.upstreamPeer(), hs.h.host.ID())
	}
	return asHopError(err, hs.upstreamPeer())
}
