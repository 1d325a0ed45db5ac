package session

import (
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/specdecode"
)

// Speculative decoding on the ring (SessionOpen.speculation). The head is
// the proposer: accepted tokens reach it first (the tail sends them there),
// so proposing there adds no hop, and the origin stays off the per-token
// path. Per window the path is the plain step's: the head decodes the
// window's rows, each hop decodes them for the session in one call, the
// tail samples a target after each row in order and returns them (the
// accepted prefix and a correction or bonus) straight to the head, which
// passes the tokens to the origin and sends the next windows. Several
// windows may be in flight: each one after the first starts with the
// previous one's last proposal (its lookahead). After a rejection the head
// raises spec_gen: every hop drops the session's rows from the next
// window's first position on, and the tail drops the windows of the
// rejected generation still in flight. While the head proposes nothing
// (Adaptive chose K = 0) it sends plain decode steps instead, the frames
// of a session without speculation, answered by token frames.
//
// Exactness: the tail samples each committed position once and in order
// (Input.Verify), so penalties and the seeded draw see exactly the tokens
// plain decoding would; rows after a rejection are never sampled. Nothing
// else holds per-row state.

// Caps on speculation, enforced by every hop: proposals per window (a
// window has at most MaxSpecDraft+1 rows) and windows in flight.
const (
	MaxSpecDraft   = 16
	MaxSpecWindows = 4
	// DefaultSpecDraft / DefaultSpecWindows: what the head allows itself
	// when the open gives no smaller bound; Adaptive chooses below them.
	DefaultSpecDraft   = 8
	DefaultSpecWindows = 4
	// The n-gram sizes the head matches (specdecode.NGram).
	specNGramMin, specNGramMax = 1, 5
)

// checkSpeculation checks an open's speculation parameters (every hop).
func checkSpeculation(sp *meshp2pb.Speculation) error {
	if sp == nil {
		return nil
	}
	switch sp.GetMode() {
	case meshp2pb.SpecMode_SPEC_MODE_OFF, meshp2pb.SpecMode_SPEC_MODE_AUTO, meshp2pb.SpecMode_SPEC_MODE_NGRAM, meshp2pb.SpecMode_SPEC_MODE_DRAFT:
	default:
		return fmt.Errorf("unknown speculation mode %d", int32(sp.GetMode()))
	}
	if sp.GetMaxDraft() > MaxSpecDraft {
		return fmt.Errorf("speculation max_draft %d over the cap of %d", sp.GetMaxDraft(), MaxSpecDraft)
	}
	if sp.GetMaxWindows() > MaxSpecWindows {
		return fmt.Errorf("speculation max_windows %d over the cap of %d", sp.GetMaxWindows(), MaxSpecWindows)
	}
	return nil
}

// speculative reports whether an open asks for speculation.
// rowBudget is the most rows a hop computes for one session: its reserved
// KV cells (each position is computed once), times (1 + K) × W when it
// speculates with at most K proposals per window and W windows in flight
// (the open's, defaults DefaultSpecDraft and DefaultSpecWindows, within
// the caps): at worst every window commits one token and the windows in
// flight behind it are thrown away, yet each hop before the tail computed
// them. A hostile head that kept sending windows it then rejected made a
// hop compute 300× a session's reservation in 20 s (issue 37); past the
// budget the session ends with BAD_REQUEST blaming the sender.
func rowBudget(open *meshp2pb.SessionOpen) int64 {
	n := max(int64(1), int64(open.GetNCtxNeeded()))
	if speculative(open) {
		n *= int64(specFactor(open.GetSpeculation()))
	}
	return n
}

// specFactor is (1 + K) × W of a speculative open (rowBudget).
func specFactor(sp *meshp2pb.Speculation) int {
	k, w := int(sp.GetMaxDraft()), int(sp.GetMaxWindows())
	if k == 0 {
		k = DefaultSpecDraft
	}
	if w == 0 {
		w = DefaultSpecWindows
	}
	return (1 + min(k, MaxSpecDraft)) * min(w, MaxSpecWindows)
}

func speculative(open *meshp2pb.SessionOpen) bool {
	return open.GetSpeculation().GetMode() != meshp2pb.SpecMode_SPEC_MODE_OFF
}

// checkWindow checks a verification window against the session (spec: it
// negotiated speculation) and the hop's generation gen. It returns what is
// wrong, for a BAD_REQUEST blaming the sender.
func checkWindow(a *meshp2pb.ActivationHeader, spec bool, gen uint64) error {
	switch {
	case !spec:
		return fmt.Errorf("verification window in a session without speculation")
	case a.GetIsPrefill():
		return fmt.Errorf("verification window marked prefill")
	case a.GetNRows() > MaxSpecDraft+1:
		return fmt.Errorf("verification window of %d rows over the cap of %d", a.GetNRows(), MaxSpecDraft+1)
	case len(a.GetTokens()) != int(a.GetNRows()):
		return fmt.Errorf("verification window of %d rows carries %d tokens", a.GetNRows(), len(a.GetTokens()))
	case len(a.GetLookahead()) > 1:
		return fmt.Errorf("verification window with %d lookahead tokens (at most 1)", len(a.GetLookahead()))
	case a.GetSpecGen() < gen:
		return fmt.Errorf("verification window of speculation generation %d after %d", a.GetSpecGen(), gen)
	}
	return nil
}

// Proposer guesses the tokens the tail will choose next (the head's, one
// per speculative session). specdecode.NGram is the default; a node with a
// draft model gives one that runs it (HopConfig.Proposer), a benchmark
// one of known acceptance. A Proposer that is also an io.Closer is closed
// when its session ends.
type Proposer interface {
	// Append adds committed tokens: the prompt, then each accepted one.
	Append(toks ...int32)
	// Propose returns up to k tokens that would follow the history (nil:
	// no guess) and the length of the match they come from (0: none;
	// acceptance is tracked per length).
	Propose(k int) ([]int32, int)
}

// costly is implemented by proposers whose proposals cost work (a draft
// model decodes one per token): the head then asks for little more than
// it will send.
type costly interface{ Costly() bool }

// ProposerFactory makes the proposer of a speculative session this hop
// heads: mode is what the origin asked for, kv the KV cells the session
// reserved. nil: the n-gram proposer; name says what it is ("draft").
type ProposerFactory func(mode meshp2pb.SpecMode, kv int) (p Proposer, name string)

// specHop is what every hop keeps of a speculative session: the
// generation it saw last, and (tail) whether that generation was rejected.
// Only the goroutine that runs the session's windows touches it.
type specHop struct {
	gen      uint64
	rejected bool
}

// specHead is the head's proposer and window bookkeeping for one
// speculative session (one epoch). The chain is last followed by pending:
// the last committed token (its row not yet decoded) and the proposals
// sent after it, oldest first; sent of the chain's tokens went out as
// rows (the next window starts at chain[sent]). Every method takes mu; the
// in-flight observer is called under it, so the gauge never drifts.
type specHead struct {
	mu       sync.Mutex
	factory  ProposerFactory
	mode     meshp2pb.SpecMode
	kv       int
	prompt   []int32 // prefilled tokens, until the proposer exists
	chunk    int     // the last prefilled chunk's tokens
	ng       Proposer
	ad       specdecode.Adaptive
	oneHop   bool
	inflObs  func(delta int) // windows in flight changed (HopObserver.WindowsInFlight)
	begun    bool            // the first token came: the proposer exists
	finished bool            // the generation ended (end of generation, max_tokens)
	closed   bool            // the session was released
	gen      uint64
	last     int32
	lastPos  int
	pending  []int32
	sent     int
	inflight []specWindow
	// stepAt: when the plain step in flight went out (zero: none). At
	// K = 0 the head sends plain decode steps, as without speculation.
	stepAt time.Time
	// genSent is the generation of the last window sent: a plain step
	// goes only once the hops saw the current one (its first window
	// drops the rejected rows from their caches).
	genSent uint64
	shadow  []int32 // proposals made but not sent: checked against what is committed (acceptance while off)
	shadowN int     // their match length
	step    uint64
	lastK   int // the K chosen last
	stats   meshp2pb.SpecStats
	// unseen are committed tokens the proposer has not been given yet
	// (catchUp); quiet: the last step went out before the proposer
	// caught up (afterSend does it).
	unseen []int32
	quiet  bool
}

// specWindow is a window in flight.
type specWindow struct {
	rows, drafts int
	look         bool // its last proposal rode as the lookahead
	match        int  // the proposer's match length (acceptance per length)
	at           time.Time
	// alone: no other window was in flight while this one was, so its
	// round time is its own (the wall-clock costs of Adaptive).
	alone bool
}

// newSpecHead is the head's state for a speculative open; factory makes
// its proposer when the first token comes (nil, or a nil proposer: an
// n-gram one), so a refused or silent open holds no proposer; inflObs sees
// the windows in flight change.
func newSpecHead(open *meshp2pb.SessionOpen, oneHop bool, factory ProposerFactory, inflObs func(int)) *specHead {
	sp := open.GetSpeculation()
	k, w := int(sp.GetMaxDraft()), int(sp.GetMaxWindows())
	if k == 0 {
		k = DefaultSpecDraft
	}
	if w == 0 {
		w = DefaultSpecWindows
	}
	if oneHop {
		w = 1 // no ring to hide
	}
	return &specHead{factory: factory, mode: sp.GetMode(), kv: int(open.GetNCtxNeeded()), oneHop: oneHop, inflObs: inflObs,
		ad: specdecode.Adaptive{MaxK: min(k, MaxSpecDraft), MaxW: min(w, MaxSpecWindows), Always: sp.GetMode() == meshp2pb.SpecMode_SPEC_MODE_NGRAM}}
}

// history adds prompt (or re-prefilled) tokens the head decoded.
func (sp *specHead) history(toks []int32) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if !sp.begun {
		sp.prompt = append(sp.prompt, toks...)
		sp.chunk = len(toks)
	}
}

// prefilled takes the hops' compute (µs, one per hop) of the prefill's
// last chunk, the last tokens history had: what a batch of rows costs on
// this route, before any window was timed.
func (sp *specHead) prefilled(us []uint32) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.begun {
		return
	}
	sp.ad.ObservePrefill(sp.chunk, hopCompute(us))
}

// begin starts the first chain from the prefill's token tok, fed at pos:
// the proposer is made and learns the prompt. It reports false when the
// session had begun (a second prefill token: the tail's fault).
func (sp *specHead) begin(tok int32, pos int, step uint64) bool {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.begun || sp.closed {
		return false
	}
	sp.begun = true
	name := "ngram"
	if sp.factory != nil {
		if p, n := sp.factory(sp.mode, sp.kv); p != nil {
			sp.ng, name = p, n
		}
	}
	if sp.ng == nil {
		g, err := specdecode.NewNGram(specNGramMin, specNGramMax)
		if err != nil {
			panic(err) // constant parameters
		}
		sp.ng = g
	}
	sp.stats.Proposer = name
	sp.ng.Append(sp.prompt...)
	sp.prompt = nil
	sp.commit([]int32{tok})
	sp.last, sp.lastPos, sp.step = tok, pos, step
	return true
}

// commit takes committed tokens; the proposer sees them at catchUp.
func (sp *specHead) commit(toks []int32) {
	sp.unseen = append(sp.unseen, toks...)
}

// catchUp adds the committed tokens the proposer has not seen to its
// history and checks the shadow proposals against them. sp.mu is held.
func (sp *specHead) catchUp() {
	toks := sp.unseen
	if len(toks) == 0 {
		return
	}
	sp.unseen = sp.unseen[:0]
	sp.ng.Append(toks...)
	for _, t := range toks {
		if len(sp.shadow) == 0 {
			break
		}
		if sp.shadow[0] == t {
			sp.ad.ObserveAcceptance(sp.shadowN, 1, 1)
			sp.shadow = sp.shadow[1:]
			continue
		}
		sp.ad.ObserveAcceptance(sp.shadowN, 0, 1)
		sp.shadow = nil
	}
}

// propose returns up to n proposals that continue the chain (after the
// pending ones) and the proposer's match length, or none.
func (sp *specHead) propose(n int) ([]int32, int) {
	d, match := sp.ng.Propose(len(sp.pending) + n)
	if len(d) <= len(sp.pending) || !slices.Equal(d[:len(sp.pending)], sp.pending) {
		return nil, 0
	}
	return d[len(sp.pending):], match
}

// setInflight records the windows in flight and tells the observer.
func (sp *specHead) setInflight(ws []specWindow) {
	if d := len(ws) - len(sp.inflight); d != 0 && sp.inflObs != nil {
		sp.inflObs(d)
	}
	sp.inflight = ws
}

// windows returns the windows to send now (none once the session ended),
// or one plain decode step: the frame a session without speculation sends,
// when nothing is in flight and nothing is proposed (K = 0, or no
// proposal), so a session the controller holds off costs what plain
// decoding costs. The session may produce at most tokens more tokens
// (max_tokens) and feed rows below position kv (its KV cells).
func (sp *specHead) windows(sid []byte, epoch uint64, kv, tokens int) []*meshp2pb.ActivationHeader {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	room := min(kv-1-sp.lastPos, tokens)
	var out []*meshp2pb.ActivationHeader
	if sp.open() && len(sp.inflight) == 0 && sp.genSent == sp.gen && room > 0 && sp.ad.Quiet() {
		// Nothing would be proposed whatever the proposer says: the plain
		// step goes first, the proposer catches up after it (afterSend).
		sp.quiet = true
		return append(out, sp.plainStep(sid, epoch))
	}
	sp.catchUp()
	for sp.open() {
		n := len(sp.inflight)
		if n > 0 && sp.sent == len(sp.pending)+1 {
			return out // the window in flight ends the chain (no lookahead)
		}
		// A window of d proposals commits at most d+1 tokens.
		free := room - len(sp.pending) - 1
		if free < 0 {
			return out
		}
		// Ask for up to K (a costly proposer, a draft model: a little
		// more than the last K), one more to see whether another window
		// could follow.
		want := min(sp.ad.MaxK, free)
		if c, ok := sp.ng.(costly); ok && c.Costly() {
			want = min(want, 2*sp.lastK+2)
		}
		drafts, match := sp.propose(want + 1)
		k, w := sp.ad.Choose(match)
		k = min(k, want)
		sp.lastK = k
		if n >= w {
			return out
		}
		if k == 0 {
			// Not sent: while nothing is in flight the proposals still
			// teach the acceptance rate (checked against what commits).
			if n == 0 && len(sp.shadow) == 0 && len(drafts) > 0 {
				sp.shadow, sp.shadowN = drafts, match
			}
			drafts = nil
		}
		if len(drafts) == 0 && n == 0 && sp.genSent == sp.gen {
			return append(out, sp.plainStep(sid, epoch))
		}
		a := sp.window(sid, epoch, drafts, k, match, n, w)
		out = append(out, a)
		if len(a.GetLookahead()) == 0 {
			return out
		}
	}
	return out
}

// afterSend runs once the windows or step windows returned are on the
// route: after a quiet plain step, the proposer's bookkeeping (the new
// tokens, the shadow proposals that keep the acceptance rate learning)
// that windows skipped.
func (sp *specHead) afterSend() {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if !sp.quiet || sp.closed {
		return
	}
	sp.quiet = false
	sp.catchUp()
	if len(sp.shadow) == 0 && len(sp.pending) == 0 {
		if drafts, match := sp.propose(sp.ad.MaxK + 1); len(drafts) > 0 {
			sp.shadow, sp.shadowN = drafts, match
		}
	}
}

// plainStep is the plain decode step of the last committed token, as a
// session without speculation sends it. sp.mu is held.
func (sp *specHead) plainStep(sid []byte, epoch uint64) *meshp2pb.ActivationHeader {
	sp.step++
	sp.stepAt = time.Now()
	return &meshp2pb.ActivationHeader{SessionId: sid, Epoch: epoch, Step: sp.step, PosStart: uint32(sp.lastPos), NRows: 1, LastChunk: true,
		Tokens: []int32{sp.last}}
}

// window is the next window of the chain: up to k of drafts (the
// proposer's, from a match of match tokens) after the chain's next row,
// with n windows in flight of at most w. sp.mu is held.
func (sp *specHead) window(sid []byte, epoch uint64, drafts []int32, k, match, n, w int) *meshp2pb.ActivationHeader {
	first := sp.last
	if sp.sent > 0 {
		first = sp.pending[sp.sent-1]
	}
	rows := []int32{first}
	var look []int32
	switch {
	case len(drafts) > k && k > 0 && n+1 < w:
		// Another window follows at once: the last proposal rides as
		// this one's lookahead and is the next one's first row.
		rows = append(rows, drafts[:k-1]...)
		look = drafts[k-1 : k]
		sp.pending = append(sp.pending, drafts[:k]...)
	default:
		drafts = drafts[:min(len(drafts), k)]
		rows = append(rows, drafts...)
		sp.pending = append(sp.pending, drafts...)
	}
	sp.step++
	a := &meshp2pb.ActivationHeader{SessionId: sid, Epoch: epoch, Step: sp.step, PosStart: uint32(sp.lastPos + sp.sent),
		NRows: uint32(len(rows)), LastChunk: true, Tokens: rows, Verify: true, SpecGen: sp.gen, Lookahead: look}
	sp.sent += len(rows)
	sp.genSent = sp.gen
	for i := range sp.inflight {
		sp.inflight[i].alone = false
	}
	sp.setInflight(append(sp.inflight, specWindow{rows: len(rows), drafts: len(rows) - 1 + len(look), look: len(look) > 0, match: match, at: time.Now(),
		alone: n == 0}))
	sp.stats.K = max(sp.stats.K, uint32(len(rows)-1+len(look)))
	sp.stats.W = max(sp.stats.W, uint32(len(sp.inflight)))
	return a
}

// stepped takes the tail's token frame tf for the plain step in flight
// and returns what it commits: the token, and the session's counts after
// it (no token once the session ended). begun is false before the first
// token (the prefill's: begin takes it); an error says what is wrong
// with tf (blame the tail): no plain step in flight (a token frame while
// windows are verified), or another position. Nothing changes unless tf
// is valid.
func (sp *specHead) stepped(tf *meshp2pb.TokenFrame) (res specResult, begun bool, err error) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	switch {
	case !sp.begun:
		return specResult{}, false, nil
	case sp.finished || sp.closed:
		return specResult{}, true, nil
	case sp.stepAt.IsZero():
		return specResult{}, true, fmt.Errorf("token frame in a speculative session that is verifying windows")
	case int(tf.GetPosition()) != sp.lastPos+1:
		return specResult{}, true, fmt.Errorf("token frame at position %d, want %d", tf.GetPosition(), sp.lastPos+1)
	}
	// A plain step is a one-row window alone in flight: it times S1.
	sp.ad.ObserveWindow(1, time.Since(sp.stepAt), hopCompute(tf.GetHopUs()))
	sp.stepAt = time.Time{}
	tok := tf.GetToken()
	sp.commit([]int32{tok})
	sp.last, sp.lastPos = tok, sp.lastPos+1
	sp.finished = tf.GetEos()
	return specResult{toks: []int32{tok}, stats: sp.snapshotLocked()}, true, nil
}

// hopCompute is the hops' compute of a step or window (µs, one per hop).
func hopCompute(us []uint32) time.Duration {
	var sum time.Duration
	for _, u := range us {
		sum += time.Duration(u) * time.Microsecond
	}
	return sum
}

// specResult is what a window's result commits: its tokens, the
// proposals it verified and accepted, and the session's counts after it.
type specResult struct {
	toks               []int32
	verified, accepted int
	stats              *meshp2pb.SpecStats
}

// result takes the tail's answer to the oldest window in flight and
// returns what it commits (no tokens for a rejected generation's, or once
// the session ended), or what is wrong with it (blame the tail). Nothing
// changes unless the result is valid.
func (sp *specHead) result(wr *meshp2pb.WindowResult) (specResult, error) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	switch {
	case sp.finished || sp.closed || wr.GetSpecGen() < sp.gen:
		return specResult{}, nil
	case wr.GetSpecGen() > sp.gen || len(sp.inflight) == 0:
		return specResult{}, fmt.Errorf("window result of generation %d, none in flight (generation %d)", wr.GetSpecGen(), sp.gen)
	}
	w := sp.inflight[0]
	toks := wr.GetTokens()
	n := len(toks)
	switch {
	case n < 1 || n > w.drafts+1:
		return specResult{}, fmt.Errorf("window result of %d tokens for %d proposals", n, w.drafts)
	case int(wr.GetPosition()) != sp.lastPos+1:
		return specResult{}, fmt.Errorf("window result at position %d, want %d", wr.GetPosition(), sp.lastPos+1)
	case !slices.Equal(toks[:n-1], sp.pending[:n-1]):
		return specResult{}, fmt.Errorf("window result accepts tokens that were not proposed")
	}
	lastAccepted := n <= w.drafts && toks[n-1] == sp.pending[n-1]
	accepted, verified := n-1, min(n, w.drafts)
	if lastAccepted {
		accepted = n
	}
	end, err := sp.classify(wr, w, n, lastAccepted)
	if err != nil {
		return specResult{}, err
	}
	compute := hopCompute(wr.GetHopUs())
	switch {
	case w.alone && w.rows == 1: // the window after a rejection
		sp.ad.ObserveRedo(time.Since(w.at))
		sp.ad.ObserveCompute(w.rows, compute)
	case w.alone:
		sp.ad.ObserveWindow(w.rows, time.Since(w.at), compute)
	default:
		sp.ad.ObserveCompute(w.rows, compute)
	}
	sp.advance(end, n)
	sp.ad.ObserveAcceptance(w.match, accepted, verified)
	sp.stats.Windows++
	sp.stats.Proposed += uint32(verified)
	sp.stats.Accepted += uint32(accepted)
	sp.commit(toks)
	sp.last, sp.lastPos = toks[n-1], sp.lastPos+n
	return specResult{toks: toks, verified: verified, accepted: accepted, stats: sp.snapshotLocked()}, nil
}

// windowEnd is how a valid window result ends its window.
type windowEnd int

const (
	windowAccepted  windowEnd = iota // every proposal accepted, the lookahead too
	windowBonus                      // every proposal accepted, and a bonus token
	windowCorrected                  // a proposal rejected: the tail's token instead
	windowEnded                      // an end-of-generation token
)

// classify says how the result wr of n tokens ends window w, the
// oldest in flight (lastAccepted: its last token is a proposal), or
// why no valid result ends so. sp.mu is held.
func (sp *specHead) classify(wr *meshp2pb.WindowResult, w specWindow, n int, lastAccepted bool) (windowEnd, error) {
	switch {
	case wr.GetEos():
		// The tail stops at an end-of-generation token, accepted or not.
		return windowEnded, nil
	case lastAccepted:
		// Every proposal accepted, the lookahead too: the next window in
		// flight goes on from it. Only a lookahead window ends so.
		if !w.look || n != w.drafts {
			return 0, fmt.Errorf("window result stops at an accepted proposal (%d of %d)", n, w.drafts)
		}
		return windowAccepted, nil
	case n == w.drafts+1:
		// Every proposal accepted and a bonus: only the last window of
		// a chain (no lookahead) has one.
		if w.look || len(sp.inflight) != 1 || len(sp.pending) != n-1 {
			return 0, fmt.Errorf("window result with a bonus token where none can follow")
		}
		return windowBonus, nil
	default:
		return windowCorrected, nil
	}
}

// advance drops the oldest window in flight, ended by a result of n
// tokens, and its proposals. sp.mu is held.
func (sp *specHead) advance(end windowEnd, n int) {
	switch end {
	case windowAccepted:
		sp.pending, sp.sent = sp.pending[n:], sp.sent-n
		sp.setInflight(sp.inflight[1:])
	case windowBonus:
		sp.pending, sp.sent = sp.pending[:0], 0
		sp.setInflight(sp.inflight[:0])
	case windowCorrected:
		// The rest of the chain is rejected.
		sp.gen++
		sp.pending, sp.sent = sp.pending[:0], 0
		sp.setInflight(sp.inflight[:0])
	case windowEnded:
		sp.finished = true
		sp.setInflight(sp.inflight[:0])
	}
}

// stalled reports a running session with nothing in flight (windows
// returned none: its KV cells are spent).
func (sp *specHead) stalled() bool {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return sp.open() && len(sp.inflight) == 0
}

// open reports whether the session may send another window or step now:
// begun, not ended, and no plain step in flight. sp.mu is held.
func (sp *specHead) open() bool {
	return sp.begun && !sp.finished && !sp.closed && sp.stepAt.IsZero()
}

// finish marks the generation ended (the origin closes the session): no
// more windows, later results are dropped.
func (sp *specHead) finish() {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	sp.finished = true
	sp.setInflight(sp.inflight[:0])
}

// snapshotLocked is the session's counts so far (sp.mu held).
func (sp *specHead) snapshotLocked() *meshp2pb.SpecStats {
	return &meshp2pb.SpecStats{Windows: sp.stats.Windows, Proposed: sp.stats.Proposed, Accepted: sp.stats.Accepted, K: sp.stats.K, W: sp.stats.W,
		Proposer: sp.stats.Proposer}
}

// close ends the session's speculation when it is released: no more
// windows, the in-flight count back to 0, the proposer's resources (a
// draft model's session) freed.
func (sp *specHead) close() {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.closed {
		return
	}
	sp.closed = true
	sp.setInflight(nil)
	if c, ok := sp.ng.(io.Closer); ok {
		_ = c.Close()
	}
}
