package session

import (
	"fmt"
	"math"
	"slices"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
)

// Waits that follow the work. A big model on a slow machine can take
// minutes over a prompt, far longer than the fixed waits of defaults.go:
// without more, the hops after it give up on a frame that is still being
// computed, and the origin excludes an honest hop. So during the prefill a
// hop's waits grow with the work the other hops still have to do: the
// prompt's rows (what the open reserves beyond max_tokens) × each hop's
// layers × its advertised decode time per layer (the open's
// hop_ms_per_layer, filled in by the origin from the adverts), ×
// PrefillWaitSlack, at most MaxPrefillWait over the whole route.
//
// Hop k (w_j: hop j's allowance for the prefill, up: Σ w_j for j < k,
// all: Σ w_j for every hop):
//
//	first frame                    firstFrame(k) + up, at most Idle (the origin's first
//	                                 chunk is FirstChunkRows: it comes in about a decode step)
//	frames while its prompt rows   Idle + up (the rest of the prompt through the hops before)
//	  are not all in
//	after its prompt rows, until   Idle + 2·all (the hops after it finish; a hop stuck before
//	  the first decode step          a later one is reported by that one's successor first)
//	decoding                       Idle
//	writing a frame on             WriteDeadline(Idle) + the next hop's allowance for its rows
//
// and the origin waits for an epoch's first token TokenTimeout + 3·all, more
// than any hop (hops report first). The first-frame wait stays short
// because it is what frees a route reserved by an origin that sends
// nothing (squatting, docs/limits.md).
//
// A hop reported for a silence judges the report itself (verdict): it
// blames itself if it has computed one frame for longer than its own
// allowance, its own upstream if it is itself overdue for its prompt
// rows from there, and the peer its own idle timer would blame
// (silentPeer: on a head after the prompt, the tail) if it has heard
// nothing for its own whole wait; otherwise the reporter is blamed, as
// before (a later hop must not be able to get an earlier one excluded by
// a false report: the last rule only settles a tie with the hop's own
// timer, which says the same at that moment).
// A head whose idle timer runs out after the whole prompt blames the tail
// (its next frame comes over the ring), not the origin.

// waitPlan is one hop's waits for one session, fixed at admission.
type waitPlan struct {
	rows                  int64         // prefill rows: while fewer are computed here, the prompt is not all in
	first, prefill, after time.Duration // see the table above
	nextPerRow            time.Duration // the next hop's allowance per row (slack included; 0: none or unknown)
	ownPerRow             time.Duration // this hop's, from the open
}

// prefillRows is how many rows an open's prefill has: the prompt and the
// tokens of earlier epochs (the origin reserves them, max_tokens and one
// more: Origin.sessionOpen). Without max_tokens, every reserved cell.
func prefillRows(open *meshp2pb.SessionOpen) int64 {
	n, m := int64(open.GetNCtxNeeded()), int64(open.GetMaxTokens())
	if m > 0 && n > m {
		return n - m - 1
	}
	return n
}

// perRow is each hop's allowance for one row through its layers: its
// layers × the open's time per layer for it (0 where the open gives no
// positive number; at most what an advert may say) × PrefillWaitSlack,
// at most MaxPrefillWait.
func perRow(open *meshp2pb.SessionOpen) []time.Duration {
	hops := open.GetRoute().GetHops()
	ms := open.GetHopMsPerLayer()
	out := make([]time.Duration, len(hops))
	for i, h := range hops {
		if i >= len(ms) || !(ms[i] > 0) {
			continue
		}
		m := min(float64(ms[i]), route.MaxAdvertMsPerLayer)
		layers := float64(max(0, int64(h.GetEnd())-int64(h.GetStart())))
		out[i] = time.Duration(min(m*layers*PrefillWaitSlack*float64(time.Millisecond), float64(MaxPrefillWait)))
	}
	return out
}

// workOf is rows × per, at most MaxPrefillWait.
func workOf(rows int64, per time.Duration) time.Duration {
	if per <= 0 || rows <= 0 {
		return 0
	}
	if float64(rows)*float64(per) >= float64(MaxPrefillWait) {
		return MaxPrefillWait
	}
	return time.Duration(rows) * per
}

// prefillWork is the allowance for the whole route's prefill (all) and
// for the hops before hop idx (up), both at most MaxPrefillWait.
func prefillWork(open *meshp2pb.SessionOpen, idx int) (up, all time.Duration) {
	rows := prefillRows(open)
	for j, per := range perRow(open) {
		w := workOf(rows, per)
		all = min(all+w, MaxPrefillWait)
		if j < idx {
			up = all
		}
	}
	return up, all
}

// planWaits is hop idx's waitPlan for open (firstFrame and idle: this
// hop's fixed waits).
func planWaits(open *meshp2pb.SessionOpen, idx int, firstFrame, idle time.Duration) waitPlan {
	up, all := prefillWork(open, idx)
	first := min(firstFrame+up, max(firstFrame, idle))
	p := waitPlan{rows: prefillRows(open), first: first, prefill: idle + up, after: idle + 2*all}
	per := perRow(open)
	if idx < len(per) {
		p.ownPerRow = per[idx]
	}
	if idx+1 < len(per) {
		p.nextPerRow = per[idx+1]
	}
	return p
}

// originFirstWait is how long the origin waits for an epoch's first token
// of open (input rows of prefill): one TokenTimeout per
// PrefillRowsPerTokenTimeout rows, and more than any hop waits.
func originFirstWait(open *meshp2pb.SessionOpen, input int, tokenTimeout time.Duration) time.Duration {
	_, all := prefillWork(open, 0)
	return max(tokenTimeout*time.Duration(1+input/PrefillRowsPerTokenTimeout), tokenTimeout+3*all)
}

// hopMsPerLayer is the open's hop_ms_per_layer for rt: each hop's
// advertised time per layer; a hop that advertises none counts as the
// slowest one that does (the same model: a layer costs about the same).
func hopMsPerLayer(rt *route.Route) []float32 {
	out := make([]float32, len(rt.Hops))
	slowest := 0.0
	for _, h := range rt.Hops {
		if h.MsPerLayer > 0 && !math.IsInf(h.MsPerLayer, 0) {
			slowest = max(slowest, min(h.MsPerLayer, route.MaxAdvertMsPerLayer))
		}
	}
	if slowest == 0 {
		return nil
	}
	for i, h := range rt.Hops {
		out[i] = float32(slowest)
		if h.MsPerLayer > 0 && h.MsPerLayer <= slowest {
			out[i] = float32(h.MsPerLayer)
		}
	}
	return out
}

// waitClock is what a hop's judgement of a report needs to know of its
// own recent past (all unix ns; 0: never).
type waitClock struct {
	admitted  atomic.Int64 // when the route accepted the session
	heard     atomic.Int64 // the last frame from upstream (or the ring)
	busySince atomic.Int64 // when the frame being computed now began
	busyRows  atomic.Int64 // its rows
}

// working counts a frame of rows rows as being computed (and sent on)
// until the returned func runs: the idle timer waits for it, and verdict
// knows since when.
func (hs *hopSession) working(rows uint32) func() {
	if hs.busy.Add(1) == 1 {
		hs.clk.busyRows.Store(int64(rows))
		hs.clk.busySince.Store(time.Now().UnixNano())
	}
	return func() {
		if hs.busy.Add(-1) == 0 {
			hs.clk.busySince.Store(0)
		}
	}
}

// idleWait is how long the hop waits now for its next frame: the
// prefill's waits while its own prompt rows are not all computed, and
// until the first decode step after them; then Idle.
func (hs *hopSession) idleWait() time.Duration {
	switch rows := hs.rows.Load(); {
	case rows < hs.waits.rows:
		return hs.waits.prefill
	case rows == hs.waits.rows:
		return hs.waits.after
	}
	return hs.h.cfg.Idle
}

// idleState is run's idle timer: what it was set to since the last frame
// (in all), whether no frame came yet, and how many busy periods it added.
type idleState struct {
	wait     time.Duration
	first    bool
	extended int
}

// expired is run's idle timer running out: it returns how much longer to
// wait, or fails the session (blaming the hop that should have sent a
// frame, silentPeer, or this hop if its own engine never returned) and
// returns 0.
func (hs *hopSession) expired(st *idleState) time.Duration {
	if w := hs.idleWait(); !st.first && w > st.wait {
		// The frame that reset the timer has since completed the prompt
		// here: the longer wait after it applies.
		d := w - st.wait
		st.wait = w
		return d
	}
	if hs.busy.Load() > 0 && st.extended < MaxBusyIdles {
		// This hop is still computing or sending what arrived (a prefill
		// chunk on a loaded machine can take longer than the idle
		// timeout): nobody upstream is idle. A stuck next hop fails the
		// send by its write deadline; a stuck engine ends the session
		// after MaxBusyIdles more idle periods.
		st.extended++
		return st.wait
	}
	what, blame, d := "session idle", hs.silentPeer(), st.wait*time.Duration(1+st.extended)
	switch {
	case hs.busy.Load() > 0:
		what, blame = "engine busy with one frame", hs.h.host.ID()
	case st.first:
		what = "no frame since admission"
		hs.h.noteSilence(hs, true)
	}
	hs.fail(codeErr(meshp2pb.ErrorCode_ERROR_CODE_TIMEOUT, fmt.Sprintf("%s for %s", what, d), blame))
	return 0
}

// silentPeer is the peer a hop's idle timer blames: its upstream
// neighbour ("" on the head: the origin, nothing to re-route), but on a
// head that has computed the whole prompt the tail, whose ring brings its
// next frame (a head must not end a generation without a re-route because
// the route after it went silent).
func (hs *hopSession) silentPeer() peer.ID {
	if hs.head && hs.rows.Load() >= hs.waits.rows {
		return hs.route[len(hs.route)-1]
	}
	return hs.upstreamPeer()
}

// downDeadline is the deadline of writing a frame of rows rows to the
// next hop: WriteDeadline(Idle), plus the next hop's allowance for as many
// rows (a next hop busy with a long prefill chunk has not stopped
// reading).
func (hs *hopSession) downDeadline(rows uint32) time.Duration {
	return WriteDeadline(hs.h.cfg.Idle) + workOf(int64(rows), hs.waits.nextPerRow)
}

// stuckAfter is how long this hop may compute one frame of rows rows
// before a report that it went silent is its own fault: its first-frame
// wait, plus its allowance for the rows (from the open or its own
// measured speed, whichever is slower).
func (hs *hopSession) stuckAfter(rows int64) time.Duration {
	per := hs.waits.ownPerRow
	if hs.se.own {
		layers := float64(max(1, hs.se.info.End-hs.se.info.Start))
		per = max(per, time.Duration(float64(hs.h.DecodeMsPerLayer())*layers*PrefillWaitSlack*float64(time.Millisecond)))
	}
	return hs.h.firstFrame(0) + workOf(rows, per)
}

// verdict judges a TIMEOUT report e that blames this hop (from its
// successor, or on the head the tail over the ring): nil when it does not
// blame this hop or the hop cannot tell (fromDownstream then blames its
// sender, as any report against an earlier hop). A hop that has computed
// one frame for longer than stuckAfter takes the blame; one that is
// itself still waiting for its prompt rows, overdue by its own clock,
// passes it to its own upstream (nobody on the head: the origin); one
// whose own idle wait has run out since its last frame passes it where
// its idle timer would (silentPeer).
func (hs *hopSession) verdict(e *meshp2pb.Error) *hopError {
	admitted := hs.clk.admitted.Load()
	if admitted == 0 || e.GetCode() != meshp2pb.ErrorCode_ERROR_CODE_TIMEOUT {
		return nil // not a silence, or a refused admission
	}
	me := hs.h.host.ID()
	if peer.ID(e.GetFailedPeerId()) != me {
		return nil
	}
	now := time.Now()
	if since := hs.clk.busySince.Load(); since != 0 && hs.busy.Load() > 0 {
		if d := now.Sub(time.Unix(0, since)); d >= hs.stuckAfter(hs.clk.busyRows.Load()) {
			return judged(e, me, me, fmt.Sprintf("this hop has been computing one frame for %s", d.Round(time.Millisecond)))
		}
		return nil
	}
	heard, overdue := time.Unix(0, admitted), hs.waits.first/2
	if t := hs.clk.heard.Load(); t != 0 {
		heard, overdue = time.Unix(0, t), hs.waits.prefill/2
	}
	if hs.rows.Load() < hs.waits.rows && now.Sub(heard) >= overdue {
		return judged(e, me, hs.upstreamPeer(), fmt.Sprintf("this hop has waited %s for the prompt from its own upstream", now.Sub(heard).Round(time.Millisecond)))
	}
	if t := hs.clk.heard.Load(); t != 0 {
		// Its own idle timer is due: the silence is the peer it waits on,
		// as that timer is about to report. Waits after the prompt are the
		// same on every hop and each starts when its hop hears its last
		// prompt frame, so a later hop's timer runs out a frame's transit
		// after this one's: which report wins is scheduling, and on a
		// loaded machine the later one's often did (a stuck tail got the
		// honest hop before it excluded, TestStuckHopTakesTheBlame).
		if d, w := now.Sub(time.Unix(0, t)), hs.idleWait(); d >= w {
			return judged(e, me, hs.silentPeer(), fmt.Sprintf("this hop has itself heard nothing for %s, its own wait %s", d.Round(time.Millisecond), w))
		}
	}
	return nil
}

// judged is report e as this hop (me) passes it on after verdict: blaming
// failed (nobody when ""), with why.
func judged(e *meshp2pb.Error, me, failed peer.ID, why string) *hopError {
	e = proto.Clone(e).(*meshp2pb.Error)
	e.PeerId, e.FailedPeerId = []byte(me), nil
	if failed != "" {
		e.FailedPeerId = []byte(failed)
	}
	e.Message = fmt.Sprintf("%s (%s)", e.GetMessage(), why)
	return &hopError{e}
}

// ringReport is the head's report for an Error the tail sent over the
// ring. The tail sends it up its seam too; when it blames a silence on a
// hop between the head and the tail, that hop judges it (verdict) and its
// judgement travels up the seams, so it gets RingGrace to arrive first.
func (hs *hopSession) ringReport(e *meshp2pb.Error, tail peer.ID) *hopError {
	fp := peer.ID(e.GetFailedPeerId())
	if n := len(hs.route); e.GetCode() == meshp2pb.ErrorCode_ERROR_CODE_TIMEOUT && n > 2 && slices.Contains(hs.route[1:n-1], fp) {
		t := time.NewTimer(RingGrace)
		defer t.Stop()
		select {
		case <-hs.done:
		case <-t.C:
		}
	}
	return hs.fromDownstream(e, tail, true)
}
