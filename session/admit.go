package session

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// admit checks that the open names this hop with exactly this model and
// range, in a route that covers the model, sent by the right peer and
// signed by its origin, which it returns.
func (h *HopService) admit(open *meshp2pb.SessionOpen, from peer.ID) (int, *servedEngine, peer.ID, *hopError) {
	me := h.host.ID()
	rt := open.GetRoute()
	idx := int(open.GetHopIndex())
	switch {
	case len(open.GetSessionId()) != frame.SessionIDLen:
		return 0, nil, "", codeErr(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "session id must be 16 bytes", "")
	case rt == nil || idx >= len(rt.GetHops()):
		return 0, nil, "", codeErr(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "hop index outside the route", "")
	case rt.GetModelFingerprint() != open.GetModelFingerprint():
		return 0, nil, "", codeErr(meshp2pb.ErrorCode_ERROR_CODE_MODEL_MISMATCH, fmt.Sprintf("session names model %.16s, its route %.16s", open.GetModelFingerprint(), rt.GetModelFingerprint()), me)
	case open.GetEpoch() != rt.GetEpoch():
		return 0, nil, "", codeErr(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "session epoch differs from route epoch", "")
	case !frame.WireDTypeSupported(open.GetWireDtype()):
		return 0, nil, "", codeErr(meshp2pb.ErrorCode_ERROR_CODE_UNSUPPORTED_DTYPE, "wire dtype must be one of "+frame.WireDTypeNames(), me)
	}
	if err := checkSpeculation(open.GetSpeculation()); err != nil {
		return 0, nil, "", codeErr(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, err.Error(), "")
	}
	hop := rt.GetHops()[idx]
	sb, he := standbyHop(open, me)
	if he != nil {
		return 0, nil, "", he
	}
	if sb != nil { // this peer is the standby of hop idx (standby.go)
		hop = sb
	}
	if peer.ID(hop.GetPeerId()) != me {
		return 0, nil, "", codeErr(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "route hop names another peer", "")
	}
	// Only the previous hop of the route may extend a session to us: a
	// stranger cannot splice itself into someone's route.
	if idx > 0 && peer.ID(rt.GetHops()[idx-1].GetPeerId()) != from {
		return 0, nil, "", codeErr(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "session open must come from the previous hop of the route", "")
	}
	if nl, ok := h.layersOf(open.GetModelFingerprint()); ok && int(rt.GetNLayer()) != nl {
		return 0, nil, "", codeErr(meshp2pb.ErrorCode_ERROR_CODE_MODEL_MISMATCH, fmt.Sprintf("model has %d layers, route says %d", nl, rt.GetNLayer()), me)
	}
	se, he := h.engineFor(open.GetModelFingerprint(), int(hop.GetStart()), int(hop.GetEnd()))
	if he != nil {
		return 0, nil, "", he
	}
	if int(rt.GetNLayer()) != se.info.ParentNLayer {
		return 0, nil, "", codeErr(meshp2pb.ErrorCode_ERROR_CODE_MODEL_MISMATCH, fmt.Sprintf("model has %d layers, route says %d", se.info.ParentNLayer, rt.GetNLayer()), me)
	}
	// The route must be a contiguous cover, or some hop would run the
	// wrong layers on the hidden states it receives.
	at := uint32(0)
	for _, x := range rt.GetHops() {
		if x.GetStart() != at || x.GetEnd() <= x.GetStart() {
			return 0, nil, "", codeErr(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "route hops do not join end to start", "")
		}
		at = x.GetEnd()
	}
	if at != rt.GetNLayer() {
		return 0, nil, "", codeErr(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "route does not cover all layers", "")
	}
	// Who asked for this session, proven by its signature: what it may
	// hold here is counted against that origin, whoever forwards it.
	origin, err := h.guard.check(open, idx, from)
	if err != nil {
		return 0, nil, "", codeErr(meshp2pb.ErrorCode_ERROR_CODE_ORIGIN_UNAUTHENTICATED, err.Error(), "")
	}
	if h.cfg.Admit != nil {
		if e := h.cfg.Admit(open, idx, from); e != nil {
			if len(e.GetFailedPeerId()) == 0 && frame.Retryable(e.GetCode()) {
				e.FailedPeerId = []byte(me)
			}
			return 0, nil, "", &hopError{e}
		}
	}
	// Pinned until the admission ends (handleSession unpins): a drain
	// waits for it, so the engine is not closed under a session being
	// admitted on it.
	if he := h.pin(se); he != nil {
		return 0, nil, "", he
	}
	return idx, se, origin, nil
}

// refusal is the SessionAccept{ok: false} that answers open with he.
func (h *HopService) refusal(open *meshp2pb.SessionOpen, he *hopError) *meshp2pb.StreamMessage {
	if len(he.e.GetPeerId()) == 0 { // a relayed refusal keeps its reporter
		he.e.PeerId = []byte(h.host.ID())
	}
	he.e.SessionId, he.e.Epoch = open.GetSessionId(), open.GetEpoch()
	return &meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Accept{Accept: &meshp2pb.SessionAccept{
		SessionId: open.GetSessionId(), Epoch: open.GetEpoch(), Ok: false, Error: he.e}}}
}

func acceptance(open *meshp2pb.SessionOpen) *meshp2pb.StreamMessage {
	return &meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Accept{Accept: &meshp2pb.SessionAccept{
		SessionId: open.GetSessionId(), Epoch: open.GetEpoch(), Ok: true}}}
}

// admissionBudget is how long hop idx of n waits for the rest of the route
// to admit: deeper hops give up first, so a hang further down is reported
// by the hop next to it, not blamed on an innocent hop by an impatient head.
func admissionBudget(open time.Duration, idx, n int) time.Duration {
	return open - time.Duration(idx)*open/time.Duration(2*n)
}

// readFirst reads the first message of a session or ring stream with the
// header limit and no payload: the open's kind and sender are checked
// before this hop reads any activation-sized frame.
func readFirst(s io.Reader, lim frame.Limits) (*meshp2pb.StreamMessage, error) {
	msg := new(meshp2pb.StreamMessage)
	first := frame.Limits{MaxHeader: lim.MaxHeader, MaxPayload: FirstFrameMaxPayload}
	if err := frame.NewReader(s, first).ReadMessage(msg); err != nil {
		return nil, err
	}
	return msg, nil
}

// handleSession serves one incoming session stream: admission, the rest of
// the route, then the data plane until the session ends. The checks run in
// this order: the open itself, its sender, its origin's signature and that
// it is no replay (admit, checkSessionKV), then the supersede of the
// origin's older epochs, the origin's silence backoff, quota and the
// engine slot (reserve), the replay memory (useOpen), the hop's state
// (register), and last the rest of the route (serveAdmitted).
func (h *HopService) handleSession(s network.Stream) {
	lim := h.cfg.Limits
	w := frame.NewWriter(s, lim)
	open, r := h.readOpen(s, w)
	if open == nil {
		return
	}
	openedAt := time.Now()
	if open.GetResume() {
		h.resume(s, w, open)
		return
	}
	refuse := func(he *hopError) {
		h.cfg.Observer.SessionRefused(he.e.GetCode())
		_ = w.WriteStream(h.refusal(open, he))
		_ = s.Close()
	}
	from := s.Conn().RemotePeer()
	idx, se, origin, he := h.admit(open, from)
	if se != nil {
		defer h.unpin(se)
	}
	if he == nil {
		he = h.checkSessionKV(open, se.info)
	}
	if he != nil {
		refuse(he)
		return
	}
	hs := h.newHopSession(s, open, se, idx, from, origin)
	// Only now, with the open admitted and its origin proven, may it end
	// an older epoch of the same session (from the same origin).
	h.supersede(hs.key, idx)
	hs.superseded = time.Now()
	h.waitClosing(hs.key, open.GetFollows())
	hs.closingWaited = time.Since(hs.superseded)
	if he := h.reserve(hs); he != nil {
		refuse(he)
		return
	}
	hs.reserved = time.Now()
	// Remembered against replay only once it holds something here: opens
	// refused above cost the hop no memory.
	if he := h.useOpen(hs); he != nil {
		hs.closeEngine()
		refuse(he)
		return
	}
	if he := h.register(hs); he != nil {
		refuse(he)
		return
	}
	if open.GetTranscripts() && !hs.standby { // only now: a refused open keeps nothing here
		hs.tx, hs.tailFinal = h.startTranscripts(hs), make(chan struct{})
	}
	hs.openedAt, hs.localAt = openedAt, time.Now()
	h.serveAdmitted(s, r, hs)
}

// readOpen reads the first message of session stream s within the open
// timeout and returns it with the reader for the rest of the stream. When
// that message is unreadable or not a SessionOpen it says why on w,
// closes s and returns nil.
func (h *HopService) readOpen(s network.Stream, w *frame.Writer) (*meshp2pb.SessionOpen, *timedReader) {
	lim := h.cfg.Limits
	_ = s.SetReadDeadline(time.Now().Add(h.cfg.OpenTimeout))
	msg, err := readFirst(s, lim)
	if err != nil {
		h.log.Debug("session stream: bad open", "peer", s.Conn().RemotePeer(), "err", err)
		// Say why, then close (a reset could drop the error in flight).
		_ = w.WriteStream(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Error{Error: frame.ToProto(err)}})
		_ = s.Close()
		return nil, nil
	}
	// The reader does no read-ahead: the rest of the stream is read with
	// the full limits.
	r := newTimedReader(s, lim)
	open := msg.GetOpen()
	if open == nil {
		_ = w.WriteStream(h.refusal(&meshp2pb.SessionOpen{}, codeErr(meshp2pb.ErrorCode_ERROR_CODE_UNEXPECTED_MESSAGE, "first message must be SessionOpen", "")))
		_ = s.Close()
		return nil, nil
	}
	return open, r
}

// useOpen records hs's open as admitted here, or refuses a replay of an
// open this hop admitted before (and, with its memory full of fresh opens
// or of this origin's, any new one: NO_CAPACITY).
func (h *HopService) useOpen(hs *hopSession) *hopError {
	err := h.guard.use(hs.key, time.UnixMilli(hs.open.GetIssuedAtMs()), !h.cfg.TrustedOrigins[hs.origin])
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errOpenMemoryFull):
		return codeErr(meshp2pb.ErrorCode_ERROR_CODE_NO_CAPACITY, err.Error(), h.host.ID())
	}
	return codeErr(meshp2pb.ErrorCode_ERROR_CODE_ORIGIN_UNAUTHENTICATED, err.Error(), "")
}

// newHopSession is the state of the admitted open (hop idx of its route,
// served by se, sent by from, signed by origin) whose upstream is s; it
// holds no engine slot yet.
func (h *HopService) newHopSession(s network.Stream, open *meshp2pb.SessionOpen, se *servedEngine, idx int, from, origin peer.ID) *hopSession {
	lim := h.cfg.Limits
	n := len(open.GetRoute().GetHops())
	hs := &hopSession{h: h, se: se, key: keyOf(open), open: open, idx: idx, head: idx == 0, tail: idx == n-1, wire: open.GetWireDtype(), from: from, origin: origin,
		up: NewSeam(s, lim), down: NewSeam(nil, lim), ringOut: NewSeam(nil, lim), ringIn: NewSeam(nil, lim),
		ring: make(chan network.Stream, 1), self: make(chan *meshp2pb.StreamMessage, 1), activity: make(chan struct{}, 1),
		done: make(chan struct{}), released: make(chan struct{}), engFreed: make(chan struct{}),
		resumeUp: make(chan network.Stream, 1), resumeRing: make(chan network.Stream, 1),
		maxTokens: int(open.GetMaxTokens()), tx: noAudit{}}
	if sb, _ := standbyHop(open, h.host.ID()); sb != nil {
		hs.standby = true
		h.standby.sessions.Add(1)
	}
	for _, x := range open.GetRoute().GetHops() {
		hs.route = append(hs.route, peer.ID(x.GetPeerId()))
	}
	if hs.head && speculative(open) && !hs.standby { // a standby proposes nothing
		hs.sp = newSpecHead(open, hs.tail, h.cfg.Proposer, h.cfg.Observer.WindowsInFlight)
	}
	hs.waits = planWaits(open, idx, h.firstFrame(idx), h.cfg.Idle)
	return hs
}

// reserve counts hs against its origin's silence backoff and quota and
// opens its engine session (slot and KV cells), or refuses it with nothing
// held.
func (h *HopService) reserve(hs *hopSession) *hopError {
	open := hs.open
	if he := h.checkSilence(hs); he != nil {
		return he
	}
	if he := h.checkGrammarBudget(hs); he != nil {
		return he
	}
	if he := h.takeQuota(hs, int(open.GetNCtxNeeded())); he != nil {
		return he
	}
	eng, err := hs.se.eng.OpenSession(hs.key, EngineParams{KVTokens: int(open.GetNCtxNeeded()), Sampling: open.GetSampling(), Generated: open.GetGenerated(),
		KeepInputs: open.GetTranscripts()})
	if err != nil {
		h.giveQuota(hs)
		code := meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST
		if errors.Is(err, ErrNoCapacity) {
			code = meshp2pb.ErrorCode_ERROR_CODE_NO_CAPACITY
		}
		return codeErr(code, err.Error(), h.host.ID())
	}
	hs.eng = eng
	hs.adoptPrefix()
	hs.findReplay()
	return nil
}

// register makes hs one of the hop's active sessions and counts it in
// h.wg (serveAdmitted's caller must call h.wg.Done), or, when the hop is
// shutting down or the session is already open, frees its engine slot
// (outside h.mu: lock order, doc.go) and refuses it.
func (h *HopService) register(hs *hopSession) *hopError {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		hs.closeEngine()
		return codeErr(meshp2pb.ErrorCode_ERROR_CODE_SHUTTING_DOWN, "hop shutting down", h.host.ID())
	}
	if old := h.active[hs.key]; old != nil {
		h.mu.Unlock()
		hs.closeEngine()
		return codeErr(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "session already open", "")
	}
	if !hs.se.admitting {
		// The range started draining while this session was admitted:
		// another route takes it (its engine stays open: pinned).
		h.mu.Unlock()
		hs.closeEngine()
		return codeErr(meshp2pb.ErrorCode_ERROR_CODE_NO_CAPACITY, fmt.Sprintf("this hop is moving away from layers %d-%d", hs.se.info.Start, hs.se.info.End), h.host.ID())
	}
	h.active[hs.key] = hs
	h.wg.Add(1)
	h.mu.Unlock()
	return nil
}

// serveAdmitted runs a registered session to its end: the rest of the
// route within the admission budget, the accept (or the refusal) on the
// upstream s, then the data plane reading r. It releases the session and
// the h.wg count register took.
func (h *HopService) serveAdmitted(s network.Stream, r *timedReader, hs *hopSession) {
	defer h.wg.Done()
	defer hs.release()

	open, idx := hs.open, hs.idx
	n := len(open.GetRoute().GetHops())
	// From here on a concurrent HopService.Close may report on the
	// upstream too: every write goes through the seam.
	ctx, cancel := context.WithTimeout(context.Background(), admissionBudget(h.cfg.OpenTimeout, idx, n))
	he := hs.connect(ctx)
	cancel()
	if he != nil {
		h.cfg.Observer.SessionRefused(he.e.GetCode())
		_ = hs.up.Send(h.refusal(open, he), 0)
		_ = s.Close()
		return
	}
	_ = s.SetReadDeadline(time.Time{})
	acc := hs.accepted()
	if err := hs.up.Send(acc, 0); err != nil {
		return
	}
	hs.admitted, hs.admittedAt = true, time.Now()
	hs.clk.admitted.Store(hs.admittedAt.UnixNano())
	si := sessionInfo(open, idx)
	si.Cached = int(min(uint32(hs.cached), acc.GetAccept().GetCachedTokens()))
	h.cfg.Observer.SessionAdmitted(si)
	h.log.Debug("session open", "session", hs.key, "hop", idx, "of", n, "cached", hs.cached,
		"here", hs.localAt.Sub(hs.openedAt).Round(time.Microsecond), "supersede", hs.superseded.Sub(hs.openedAt).Round(time.Microsecond),
		"closing", hs.closingWaited.Round(time.Microsecond), "reserve", (hs.reserved.Sub(hs.superseded) - hs.closingWaited).Round(time.Microsecond), "route_after", hs.admittedAt.Sub(hs.localAt).Round(time.Microsecond))
	hs.run(r)
}

// maxSessionKV is the most KV cells one session may reserve here (0: no
// cap but the engine's).
func (h *HopService) maxSessionKV(info ShardInfo) int {
	switch c := h.cfg.MaxSessionKV; {
	case c > 0:
		return c
	case c < 0:
		return 0
	}
	return info.NCtx / DefaultSessionKVDivisor
}

// checkSessionKV refuses a session that asks for more KV cells than one
// session may hold here. Not retryable and nobody to blame: every replica
// of this shard would refuse it too.
func (h *HopService) checkSessionKV(open *meshp2pb.SessionOpen, info ShardInfo) *hopError {
	if c := h.maxSessionKV(info); c > 0 && int(open.GetNCtxNeeded()) > c {
		return codeErr(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST,
			fmt.Sprintf("session needs %d KV cells; this hop admits at most %d per session", open.GetNCtxNeeded(), c), "")
	}
	return nil
}

// checkSilence refuses a session whose origin is backing off here because
// its earlier sessions held slots and sent nothing (NO_CAPACITY with the
// time left: an honest origin that tripped it once waits, then retries).
func (h *HopService) checkSilence(hs *hopSession) *hopError {
	if h.cfg.TrustedOrigins[hs.origin] {
		return nil
	}
	d := h.silence.blocked(hs.origin)
	if d <= 0 {
		return nil
	}
	return h.refusedFor(d, fmt.Sprintf("origin %s left sessions here silent; refused for %s more", hs.origin, d.Round(time.Millisecond)))
}

// refusedFor is NO_CAPACITY with msg and a retry hint of d: an origin
// backing off here (silence, grammar budget) waits d, then retries.
func (h *HopService) refusedFor(d time.Duration, msg string) *hopError {
	he := codeErr(meshp2pb.ErrorCode_ERROR_CODE_NO_CAPACITY, msg, h.host.ID())
	he.e.RetryAfterMs = uint64(d.Milliseconds())
	return he
}

// checkGrammarBudget refuses, on the tail, a session with a grammar whose
// origin spent its grammar budget here (NO_CAPACITY with the time until
// it refills; sessions without a grammar are not affected).
func (h *HopService) checkGrammarBudget(hs *hopSession) *hopError {
	if !hs.tail || hs.open.GetSampling().GetGrammar() == "" || h.cfg.TrustedOrigins[hs.origin] {
		return nil
	}
	d := h.grammar.blocked(hs.origin)
	if d <= 0 {
		return nil
	}
	return h.refusedFor(d, fmt.Sprintf("origin %s spent its grammar time on this tail; sessions with a grammar refused for %s more", hs.origin, d.Round(time.Second)))
}

// noteSilence ends hs's account with its origin's silence memory: a strike
// when it reserved this hop and its upstream sent nothing, for its whole
// first-frame wait (timedOut) or for at least half of it before closing;
// one strike back when frames came. Only where the upstream is the origin
// itself (the head, or an origin that names itself the previous hop): an
// honest origin must not pay for a hop before this one that hangs.
func (h *HopService) noteSilence(hs *hopSession, timedOut bool) {
	switch {
	case h.cfg.TrustedOrigins[hs.origin] || !hs.admitted:
	case hs.heard.Load():
		h.silence.heard(hs.origin)
	case hs.from != hs.origin:
		h.log.Debug("previous hop sent nothing; not counted against the origin", "session", hs.key, "hop", hs.idx, "from", hs.from)
	case timedOut || time.Since(hs.admittedAt) >= hs.waits.first/2:
		d := h.silence.strike(hs.origin)
		h.log.Info("origin left a session silent; refusing its sessions for a while", "origin", hs.origin, "session", hs.key, "hop", hs.idx, "for", d)
	}
}

// peerQuota is what one origin may hold on this hop (0: unlimited).
func (h *HopService) peerQuota(info ShardInfo) peerUse {
	q := peerUse{sessions: h.cfg.MaxSessionsPerPeer, kv: h.cfg.MaxKVPerPeer}
	if q.sessions == 0 && info.MaxSessions > 0 {
		q.sessions = max(1, info.MaxSessions/DefaultPeerShareDivisor)
	}
	if q.kv == 0 {
		q.kv = info.NCtx / DefaultPeerShareDivisor
	}
	return peerUse{sessions: max(0, q.sessions), kv: max(0, q.kv)}
}

// takeQuota counts a new session against its origin's quota, or refuses
// it (NO_CAPACITY: the origin's own sessions must end first). The origin
// is the one that signed the open, at every position: an honest hop that
// forwards many origins' sessions is never throttled for them.
func (h *HopService) takeQuota(hs *hopSession, kv int) *hopError {
	if h.cfg.TrustedOrigins[hs.origin] {
		return nil // counted nowhere: giveQuota has nothing to return
	}
	q := h.peerQuota(hs.se.info)
	h.mu.Lock()
	defer h.mu.Unlock()
	u := h.perPeer[hs.origin]
	switch {
	case q.sessions > 0 && u.sessions+1 > q.sessions:
		return codeErr(meshp2pb.ErrorCode_ERROR_CODE_NO_CAPACITY, fmt.Sprintf("origin %s already holds %d sessions here (quota %d)", hs.origin, u.sessions, q.sessions), h.host.ID())
	case q.kv > 0 && u.kv+kv > q.kv:
		return codeErr(meshp2pb.ErrorCode_ERROR_CODE_NO_CAPACITY, fmt.Sprintf("origin %s holds %d KV cells here, %d more exceed its quota of %d", hs.origin, u.kv, kv, q.kv), h.host.ID())
	}
	// The upstream peer's sessions that have not sent a frame yet, whatever
	// origins signed them: a host forwarding opens signed by free origin
	// keys (naming itself the previous hop) holds no more of this hop than
	// one origin may (issue 37, row 4). An honest previous hop's sessions
	// send their prefill right after the accept: they leave this count at
	// once.
	if f := hs.from; f != "" && !h.cfg.TrustedOrigins[f] && q.sessions > 0 && h.unheard[f]+1 > q.sessions {
		return codeErr(meshp2pb.ErrorCode_ERROR_CODE_NO_CAPACITY, fmt.Sprintf("peer %s already forwarded %d sessions here that have sent nothing yet (at most %d)", f, h.unheard[f], q.sessions), h.host.ID())
	}
	if hs.from != "" {
		h.unheard[hs.from]++
		hs.unheard = true
	}
	hs.quota = peerUse{sessions: 1, kv: kv}
	h.perPeer[hs.origin] = peerUse{sessions: u.sessions + 1, kv: u.kv + kv}
	return nil
}

// heardFrom takes hs out of its upstream peer's count of sessions that
// have sent nothing (once: at its first frame, or at its end).
func (h *HopService) heardFrom(hs *hopSession) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.heardLocked(hs)
}

func (h *HopService) heardLocked(hs *hopSession) {
	if !hs.unheard {
		return
	}
	hs.unheard = false
	if h.unheard[hs.from]--; h.unheard[hs.from] <= 0 {
		delete(h.unheard, hs.from)
	}
}

// giveQuota returns what hs counted against its origin's quota (once).
func (h *HopService) giveQuota(hs *hopSession) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.heardLocked(hs)
	if hs.quota == (peerUse{}) {
		return
	}
	u := h.perPeer[hs.origin]
	u.sessions -= hs.quota.sessions
	u.kv -= hs.quota.kv
	hs.quota = peerUse{}
	if u == (peerUse{}) {
		delete(h.perPeer, hs.origin)
		return
	}
	h.perPeer[hs.origin] = u
}

// closeEngine frees the session's engine slot and KV cells and its quota,
// once; engFreed is closed when done.
func (hs *hopSession) closeEngine() {
	hs.engOnce.Do(func() {
		if hs.eng != nil {
			if gt, ok := hs.eng.(GrammarTimer); ok && !hs.h.cfg.TrustedOrigins[hs.origin] {
				hs.h.grammar.charge(hs.origin, gt.GrammarTime())
			}
			hs.keepPrefix()
			hs.eng.Close()
		}
		hs.h.giveQuota(hs)
		close(hs.engFreed)
	})
}

// supersede ends older epochs of a session that is being re-opened (the
// origin re-routed), and frees their KV cells before the new epoch's
// admission: the old epoch is dead either way, and its reservation must
// not make the new one fail for lack of capacity. The wait is bounded (an
// engine that frees late makes the new epoch's admission refuse with
// NO_CAPACITY, which the origin retries).
//
// Only the origin that opened a session may end it so: key's origin signed
// the new epoch (admit), and keys of other origins never match, whoever
// forwards the open — a replacement upstream hop carrying the origin's new
// epoch ends the old one at once, while a stranger who learnt the session
// id (a hop once on its route) opens a session of its own instead.
func (h *HopService) supersede(key Key, idx int) {
	h.mu.Lock()
	var old []*hopSession
	for k, hs := range h.active {
		if k.Origin == key.Origin && k.ID == key.ID && k.Epoch < key.Epoch {
			old = append(old, hs)
		}
	}
	h.mu.Unlock()
	deadline := time.After(h.cfg.OpenTimeout / 2)
	t0 := time.Now()
	for _, hs := range old {
		if hs.standby {
			// A standby taking over first computes what its mirror
			// still sends it (the mirror ends the stream after the last
			// frame): then it holds what the covered hop held.
			select {
			case <-hs.done:
			case <-deadline:
			}
		}
		h.log.Debug("epoch superseded", "session", hs.key, "by", key.Epoch, "hop", idx)
		hs.fail(codeErr(meshp2pb.ErrorCode_ERROR_CODE_STALE_EPOCH, fmt.Sprintf("superseded by epoch %d", key.Epoch), ""))
		hs.unblock()
		go hs.closeEngine()
		select {
		case <-hs.engFreed:
		case <-deadline:
			return
		}
		h.log.Debug("superseded epoch's cells free", "session", hs.key, "waited", time.Since(t0).Round(time.Microsecond))
	}
}

// ClosingWait bounds how long an admission waits for the same origin's
// closing sessions to be released (waitClosing).
const ClosingWait = time.Second

// waitClosing waits, at most ClosingWait, until the sessions of key's
// origin whose Close already arrived here, and the one the open follows
// (SessionOpen.follows: the conversation's previous turn, whose Close may
// not have been read here yet), are released. Released, a session has
// kept its blocks in the prefix cache (prefix.go), so a conversation's
// next turn, sent as soon as the last answer arrived (an agent's tool
// result), adopts them instead of racing their keep: the origin sends the
// Close before it answers, but the next turn's open travels on other
// streams. Other sessions still running are not waited for.
func (h *HopService) waitClosing(key Key, follows []byte) {
	h.mu.Lock()
	var closing []*hopSession
	for k, hs := range h.active {
		if k.Origin == key.Origin && k.ID != key.ID && (hs.closing.Load() || bytes.Equal(k.ID[:], follows)) {
			closing = append(closing, hs)
		}
	}
	h.mu.Unlock()
	if len(closing) == 0 {
		return
	}
	deadline := time.NewTimer(ClosingWait)
	defer deadline.Stop()
	for _, hs := range closing {
		select {
		case <-hs.released:
		case <-deadline.C:
			h.log.Debug("admission: a closing session of the same origin is still being released", "session", hs.key, "waited", ClosingWait)
			return
		}
	}
}
