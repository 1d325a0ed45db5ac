package session

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
)

// Spot-check audits (docs/trust.md). After a generation the origin draws
// whether to audit it (Auditor.Rate); the draw stays in the origin until
// the session has ended, so no hop can know whether it is watched while it
// computes. An audit picks one hop of the final epoch uniformly, fetches
// its signed statements from the hop after it (which checked them against
// the bytes it got), its input frames from the hop before it (the head's
// own inputs from the head), and replays its layers on them (Judge). A
// window whose output differs is a fraud proof: it verifies offline
// (`meshp2p proof verify`), and the origin avoids the hop from then on.
// Every audit also checks the head's relay of the tail's tokens to the
// origin (relaycheck.go), whichever hop it drew: that needs no replay.

// DefaultAuditRate is the share of generations an origin audits.
const DefaultAuditRate = 0.05

// AuditEngines gives an auditor the layers it replays.
type AuditEngines interface {
	// Engine returns an engine serving exactly layers [start, end) of the
	// model with fingerprint fp, its kernel class (engine.KernelClass),
	// and a release to call when done; an error wrapping ErrNoAuditor
	// when it holds no such layers.
	Engine(ctx context.Context, fp string, start, end int) (Engine, string, func(), error)
}

// ErrNoAuditor: nothing here can replay the hop's layers.
var ErrNoAuditor = errors.New("no auditor for these layers")

// ErrProof: a proof that does not convict (malformed, unsigned, its inputs
// not what the hop signed, or its replay agrees with the hop).
var ErrProof = errors.New("proof does not verify")

// AuditOutcome is how an audit ended.
type AuditOutcome string

const (
	AuditPassed       AuditOutcome = "passed"       // every window's replay matched
	AuditFailed       AuditOutcome = "failed"       // a window did not: a verified proof convicts the hop
	AuditInconclusive AuditOutcome = "inconclusive" // records missing or contradictory: nobody convicted
	AuditSkipped      AuditOutcome = "skipped"      // no auditor for the layers, or audits busy
)

// AuditReport is one audit's result.
type AuditReport struct {
	Peer       peer.ID
	Hop        int
	Start, End int
	Epoch      uint64
	Outcome    AuditOutcome
	Reason     string
	Windows    int           // windows replayed
	Frames     int           // input frames replayed
	InputBytes int64         // bytes of recorded inputs fetched
	Replay     time.Duration // the replay's compute
	Exact      bool          // compared exactly (same kernel class)
	Proof      *meshp2pb.Proof
	// Adopted is how many positions the hop adopted from its prefix
	// cache, whose inputs the replay fed first (0: none).
	Adopted int
	// CrossChecked is how many adopted positions' rows were found to be
	// those the hop signed it received in the session that left them
	// (crosscheck.go; 0: not checked).
	CrossChecked int
	// Relayed is how many of the final epoch's tokens the relay check
	// found to be the ones the tail signed it sent (relaycheck.go; 0: not
	// checked, a one-hop route, or records missing).
	Relayed int
}

// Auditor runs an origin's audits, one at a time in the background.
type Auditor struct {
	// Rate is the probability that a generation is audited (0: never; the
	// sessions then ask for no transcripts either).
	Rate    float64
	Engines AuditEngines
	// Protocol is the swarm's audit protocol ID (ProtoAudit).
	Protocol protocol.ID
	// OnReport sees every audit's report (proofs to save; tests).
	OnReport func(AuditReport)
	// Draw returns a uniform number in [0, 1) (nil: math/rand/v2).
	Draw func() float64

	mu      sync.Mutex
	running int
	wg      sync.WaitGroup
	recent  []recentGen // the cross-check's sources (crosscheck.go)
}

// maxAuditsQueued bounds the audits running or waiting at once: more are
// skipped (counted), never queued without bound.
const maxAuditsQueued = 2

// on reports whether sessions should ask for transcripts.
func (a *Auditor) on() bool { return a != nil && a.Rate > 0 }

func (a *Auditor) draw() float64 {
	if a.Draw != nil {
		return a.Draw()
	}
	return rand.Float64()
}

// Wait blocks until the audits started so far have ended.
func (a *Auditor) Wait() {
	if a != nil {
		a.wg.Wait()
	}
}

// maybeAudit draws whether the finished generation is audited and, if so,
// audits one hop of its final epoch in the background. A route from a
// tracker that assigns audits carries the tracker's draw instead
// (route.Route.Audit, checked against the ticket's commitment).
func (o *Origin) maybeAudit(res *Result) {
	a := o.Audit
	if !a.on() || res.lastOpen == nil {
		return
	}
	open, known := res.lastOpen, slices.Concat(res.prompt, res.Tokens)
	a.remember(open, known)                                                // the cross-check of later audits (crosscheck.go)
	at := len(res.prompt) + min(len(open.GetGenerated()), len(res.Tokens)) // the final epoch's first token
	got := relayed{tokens: known[at:], at: at, eos: res.Stop == "eos"}
	n := len(open.GetRoute().GetHops())
	var hop int
	if as := res.Route.Audit; as != nil { // the tracker's draw, committed to in the ticket
		if !as.GetAudit() || int(as.GetHop()) >= n {
			return
		}
		hop = int(as.GetHop())
	} else {
		if a.draw() >= a.Rate {
			return
		}
		hop = min(int(a.draw()*float64(n)), n-1)
	}
	a.mu.Lock()
	if a.running >= maxAuditsQueued {
		a.mu.Unlock()
		o.reportAudit(AuditReport{Hop: hop, Epoch: open.GetEpoch(), Outcome: AuditSkipped, Reason: "audits busy"})
		return
	}
	a.running++
	a.wg.Add(1)
	a.mu.Unlock()
	go func() {
		defer a.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), DefaultAuditTimeout)
		rep := o.auditGeneration(ctx, open, hop, known, got, advertisedClass(res.Route, open, hop))
		cancel()
		a.mu.Lock()
		a.running--
		a.mu.Unlock()
		o.reportAudit(rep)
	}()
}

// auditGeneration checks the head's relay (every audited generation: it
// needs no replay) and, unless that convicts the head, audits hop. An
// epoch whose hops reused cached positions is audited too: the hop signed
// what it adopted and kept its inputs, which the replay feeds first
// (adopted.go); without them the audit is inconclusive (docs/trust.md,
// "Prefix cache").
func (o *Origin) auditGeneration(ctx context.Context, open *meshp2pb.SessionOpen, hop int, known []int32, got relayed, advertised string) AuditReport {
	rc := o.checkRelay(ctx, open, got)
	if rc.Outcome == AuditFailed {
		return rc
	}
	if rc.Outcome == AuditInconclusive {
		o.logger().Info("relay check inconclusive", "head", rc.Peer, "reason", rc.Reason)
	}
	rep := o.audit(ctx, open, hop, known, advertised)
	rep.Relayed = rc.Relayed
	return rep
}

// DefaultAuditTimeout bounds one audit (fetches and replay).
const DefaultAuditTimeout = 5 * time.Minute

func (o *Origin) reportAudit(rep AuditReport) {
	log := o.logger()
	switch rep.Outcome {
	case AuditFailed:
		o.Failures.Convict(rep.Peer)
		log.Warn("audit failed: hop convicted, avoided from now on", "peer", rep.Peer, "hop", rep.Hop, "layers", fmt.Sprintf("%d-%d", rep.Start, rep.End), "reason", rep.Reason)
	case AuditInconclusive:
		log.Info("audit inconclusive", "peer", rep.Peer, "hop", rep.Hop, "reason", rep.Reason)
	default:
		log.Debug("audit", "outcome", rep.Outcome, "peer", rep.Peer, "hop", rep.Hop, "windows", rep.Windows, "reason", rep.Reason)
	}
	o.observer().Audited(rep)
	if o.Audit.OnReport != nil {
		o.Audit.OnReport(rep)
	}
}

// advertisedClass is the kernel class the audited hop advertised when the
// route was planned ("": unknown, or the route is not the open's).
func advertisedClass(rt *route.Route, open *meshp2pb.SessionOpen, hop int) string {
	hops := open.GetRoute().GetHops()
	if rt == nil || len(rt.Hops) != len(hops) || hop >= len(hops) {
		return ""
	}
	h := rt.Hops[hop]
	if h.Peer != peer.ID(hops[hop].GetPeerId()) || h.Start != int(hops[hop].GetStart()) || h.End != int(hops[hop].GetEnd()) {
		return ""
	}
	return h.KernelClass
}

// checkClaimedClass refuses statements whose kernel class is not the one
// the hop advertised (advertised "": not checked). The class decides how a
// replay is compared (exact within a batch-invariant class; a tail's
// tokens not across classes), so a liar naming a class it does not run
// would make its audits lenient or inconclusive (issue 37). Honest nodes
// sign and advertise the same class (their device's).
func checkClaimedClass(sts []*meshp2pb.SignedTranscript, advertised string) error {
	if advertised == "" {
		return nil
	}
	for i, st := range sts {
		tr, err := OpenTranscript(st)
		if err != nil {
			return nil // judged (and refused) by the replay
		}
		if c := tr.GetKernelClass(); c != advertised {
			return fmt.Errorf("statement %d names kernel class %q, but the hop advertised %q", i, c, advertised)
		}
	}
	return nil
}

// audit audits hop of the epoch open began; known is the prompt and every
// token generated (the head's committed inputs); advertised is the hop's
// advertised kernel class ("": unknown).
func (o *Origin) audit(ctx context.Context, open *meshp2pb.SessionOpen, hop int, known []int32, advertised string) AuditReport {
	hops := open.GetRoute().GetHops()
	target := peer.ID(hops[hop].GetPeerId())
	rep := AuditReport{Peer: target, Hop: hop, Start: int(hops[hop].GetStart()), End: int(hops[hop].GetEnd()), Epoch: open.GetEpoch()}
	inconclusive := func(format string, args ...any) AuditReport {
		rep.Outcome, rep.Reason = AuditInconclusive, fmt.Sprintf(format, args...)
		return rep
	}
	n := len(hops)
	holder := hop + 1 // checked the hop's statements
	switch {
	case n == 1:
		holder = 0 // a one-hop route keeps its own: nobody else saw its output
	case hop == n-1:
		holder = 0 // the tail's went to the head
	}
	recs, _, err := o.fetch(ctx, peer.ID(hops[holder].GetPeerId()), open, meshp2pb.AuditPart_AUDIT_PART_STATEMENTS)
	if err != nil {
		return inconclusive("statements from hop %d: %v", holder, err)
	}
	source, part := hop-1, meshp2pb.AuditPart_AUDIT_PART_SENT
	if hop == 0 {
		source, part = 0, meshp2pb.AuditPart_AUDIT_PART_INPUTS
	}
	inRecs, frames, err := o.fetch(ctx, peer.ID(hops[source].GetPeerId()), open, part)
	if err != nil {
		return inconclusive("inputs from hop %d: %v", source, err)
	}
	for _, f := range frames {
		rep.InputBytes += int64(len(f.GetPayload()))
	}
	sts := recs.GetStatements()
	if len(sts) == 0 {
		return inconclusive("hop %d holds no statements of hop %d", holder, hop)
	}
	if last, err := OpenTranscript(sts[len(sts)-1]); err != nil || !last.GetFinal() {
		return inconclusive("hop %d holds no final statement of hop %d (%d statements)", holder, hop, len(sts))
	}
	if err := checkClaimedClass(sts, advertised); err != nil {
		// Signed by the hop, against its own signed advert: not a
		// replayable proof, but this origin's conviction.
		rep.Outcome, rep.Reason = AuditFailed, err.Error()
		return rep
	}
	adopted, failed, why := o.adoptedInputs(ctx, open, hop, sts, known, frames)
	if failed != "" || why != "" {
		return adoptedVerdict(rep, failed, why)
	}
	rep.Adopted = positions(adopted)
	if rep.CrossChecked, why = o.crossCheck(ctx, open, hop, known, adopted); why != "" {
		return adoptedVerdict(rep, "", why)
	}
	p := &meshp2pb.Proof{Version: 1, Open: open, HopIndex: uint32(hop), NEmbd: uint32(nEmbd(frames)), Statements: sts, Inputs: frames, Adopted: adopted}
	if hop == 0 {
		if err := checkHeadInputs(frames, known); err != nil {
			return inconclusive("%v", err)
		}
	}
	v, err := Judge(ctx, p, o.Audit.Engines)
	return o.verdict(rep, v, err, inRecs.GetTruncated(), source)
}

// verdict is the report of an audit whose replay ended with v (err);
// truncated: the inputs' records hit their bound; source: the hop that
// sent the inputs.
func (o *Origin) verdict(rep AuditReport, v Verdict, err error, truncated bool, source int) AuditReport {
	rep.Windows, rep.Frames, rep.Replay, rep.Exact = v.Windows, v.Frames, v.Replay, v.Exact
	inconclusive := func(format string, args ...any) AuditReport {
		rep.Outcome, rep.Reason = AuditInconclusive, fmt.Sprintf(format, args...)
		return rep
	}
	switch {
	case errors.Is(err, ErrNoAuditor):
		rep.Outcome, rep.Reason = AuditSkipped, err.Error()
		return rep
	case err != nil:
		return inconclusive("%v", err)
	case v.Inconclusive != "":
		return inconclusive("%s", v.Inconclusive)
	case !v.Convicted && v.Windows < v.Signed:
		if truncated {
			return inconclusive("only %d of %d windows recorded (the record bound)", v.Windows, v.Signed)
		}
		return inconclusive("hop %d sent inputs for %d of %d windows", source, v.Windows, v.Signed)
	case !v.Convicted:
		rep.Outcome = AuditPassed
		return rep
	}
	rep.Outcome, rep.Reason, rep.Proof = AuditFailed, v.Reason, v.Proof
	return rep
}

// adoptedInputs fetches from the audited hop the inputs of the positions
// it signed it adopted from its prefix cache (sts[0].adopted; none: nil)
// and checks them against its signed digest (why: the audit is
// inconclusive) and, on the head, against the session's tokens known
// (failed: a head that signed it reused other tokens than the prompt's is
// convicted here, like a false kernel class: a signed contradiction).
func (o *Origin) adoptedInputs(ctx context.Context, open *meshp2pb.SessionOpen, hop int, sts []*meshp2pb.SignedTranscript, known []int32, inputs []*meshp2pb.RecordedFrame) (frames []*meshp2pb.RecordedFrame, failed, why string) {
	st, err := OpenTranscript(sts[0])
	n := int(st.GetAdopted())
	switch {
	case err != nil:
		return nil, "", "" // judged (and refused) by the replay
	case len(inputs) > 0 && int(inputs[0].GetHeader().GetPosStart()) != n:
		// An older hop signs no adopted positions; an honest one's first
		// input frame is where its adopted positions end.
		return nil, "", fmt.Sprintf("hop %d signed %d adopted positions, its first input frame is at position %d", hop, n, inputs[0].GetHeader().GetPosStart())
	case n == 0:
		return nil, "", ""
	}
	if len(st.GetAdoptedDigest()) == 0 {
		return nil, "", fmt.Sprintf("hop %d adopted %d cached positions whose inputs its cache entry did not keep: no replay rebuilds them", hop, n)
	}
	_, frames, err = o.fetch(ctx, peer.ID(open.GetRoute().GetHops()[hop].GetPeerId()), open, meshp2pb.AuditPart_AUDIT_PART_ADOPTED)
	if err != nil {
		return nil, "", fmt.Sprintf("inputs of the %d positions hop %d adopted: %v", n, hop, err)
	}
	if err := checkAdopted(frames, st, hop == 0, nEmbd(inputs)); err != nil {
		return nil, "", fmt.Sprintf("inputs of the %d positions hop %d adopted (%d frames kept): %v", n, hop, len(frames), err)
	}
	if toks := adoptedTokens(frames); hop == 0 && (len(toks) > len(known) || !slices.Equal(toks, known[:len(toks)])) {
		return nil, fmt.Sprintf("the head signed it reused the cached KV of %d tokens that are not the session's first %d", n, n), ""
	}
	return frames, "", ""
}

// nEmbd is the row width of the recorded inputs (0 for the head's).
func nEmbd(frames []*meshp2pb.RecordedFrame) int {
	for _, f := range frames {
		if t := f.GetHeader().GetTensors(); len(t) == 1 && len(t[0].GetShape()) == 2 {
			return int(t[0].GetShape()[1])
		}
	}
	return 0
}

// checkHeadInputs checks that the head's committed inputs are the prompt
// and the generated tokens: a head cannot make a replay agree by
// claiming it was fed other tokens. In a speculative session's
// verification windows, the rows past a window's first are proposals (a
// rejected one never reaches the output, and a changed one is only a
// rejection), and so is the first row of a window sent while the one
// before it was in flight (it is that window's lookahead); every other
// window's first row, like a plain step's row (sent at K = 0, with
// nothing in flight), is the session's token at its position and is
// checked like a plain decode row.
func checkHeadInputs(frames []*meshp2pb.RecordedFrame, known []int32) error {
	var prev *meshp2pb.ActivationHeader // the last verification window
	for i, f := range frames {
		a := f.GetHeader()
		toks := a.GetTokens()
		if a.GetVerify() {
			chained := prev != nil && len(prev.GetLookahead()) == 1 && len(toks) > 0 &&
				a.GetPosStart() == prev.GetPosStart()+uint32(len(prev.GetTokens())) && toks[0] == prev.GetLookahead()[0]
			prev = a
			if chained || len(toks) == 0 {
				continue
			}
			toks = toks[:1]
		} else {
			prev = nil // a plain step (K = 0) goes with nothing in flight
		}
		for j, t := range toks {
			pos := int(a.GetPosStart()) + j
			if pos < len(known) && known[pos] != t {
				return fmt.Errorf("head input frame %d: token %d at position %d, the session's is %d", i, t, pos, known[pos])
			}
		}
	}
	return nil
}

// fetchStart asks hop p for part of what it kept of open's epoch and
// reads the answer's header (the caller reads what follows it on r, then
// closes s).
func (o *Origin) fetchStart(ctx context.Context, p peer.ID, open *meshp2pb.SessionOpen, part meshp2pb.AuditPart) (network.Stream, *frame.Reader, *meshp2pb.AuditRecords, error) {
	s, err := o.Dialer.NewStream(ctx, p, o.Audit.Protocol)
	if err != nil {
		return nil, nil, nil, err
	}
	if d, ok := ctx.Deadline(); ok {
		_ = s.SetDeadline(d)
	}
	fail := func(err error) (network.Stream, *frame.Reader, *meshp2pb.AuditRecords, error) {
		_ = s.Close()
		return nil, nil, nil, err
	}
	w := frame.NewWriter(s, o.Limits)
	if err := w.WriteStream(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_AuditFetch{AuditFetch: &meshp2pb.AuditFetch{
		SessionId: open.GetSessionId(), Epoch: open.GetEpoch(), Part: part}}}); err != nil {
		return fail(err)
	}
	r := streamReader(s, o.Limits)
	msg, _, err := r.ReadStream()
	if err != nil {
		return fail(err)
	}
	rec := msg.GetAuditRecords()
	switch {
	case rec == nil:
		return fail(fmt.Errorf("%s answered an audit fetch with something else", p))
	case rec.GetError() != nil:
		return fail(frame.FromProto(rec.GetError()))
	case rec.GetFrames() > maxFrames(open):
		return fail(fmt.Errorf("%s announces %d frames for a session of %d positions", p, rec.GetFrames(), open.GetNCtxNeeded()))
	case part == meshp2pb.AuditPart_AUDIT_PART_STATEMENTS && rec.GetFrames() > maxFrames(open)/TranscriptWindow+2:
		return fail(fmt.Errorf("%s announces %d statements for a session of %d positions", p, rec.GetFrames(), open.GetNCtxNeeded()))
	case len(rec.GetStatements()) > 0:
		return fail(fmt.Errorf("%s sent statements in the header (they come one per message)", p))
	}
	return s, r, rec, nil
}

// fetch asks hop p for part of what it kept of open's epoch: statements
// (in the answer) or frames.
func (o *Origin) fetch(ctx context.Context, p peer.ID, open *meshp2pb.SessionOpen, part meshp2pb.AuditPart) (*meshp2pb.AuditRecords, []*meshp2pb.RecordedFrame, error) {
	s, r, rec, err := o.fetchStart(ctx, p, open, part)
	if err != nil {
		return nil, nil, err
	}
	defer s.Close()
	if part == meshp2pb.AuditPart_AUDIT_PART_STATEMENTS {
		for range rec.GetFrames() {
			m, _, err := r.ReadStream()
			if err != nil {
				return nil, nil, fmt.Errorf("statement from %s: %w", p, err)
			}
			if m.GetTranscript() == nil {
				return nil, nil, fmt.Errorf("statement from %s: not a transcript", p)
			}
			rec.Statements = append(rec.Statements, m.GetTranscript())
		}
		return rec, nil, nil
	}
	frames := make([]*meshp2pb.RecordedFrame, 0, min(rec.GetFrames(), 4096))
	var total int64
	for range rec.GetFrames() {
		m, tensors, err := r.ReadStream()
		if err != nil {
			return nil, nil, fmt.Errorf("record from %s: %w", p, err)
		}
		a := m.GetActivation()
		if a == nil {
			return nil, nil, fmt.Errorf("record from %s: not an activation frame", p)
		}
		f := &meshp2pb.RecordedFrame{Header: a}
		if len(tensors) == 1 {
			if total += int64(len(tensors[0])); total > DefaultAuditKeepBytes {
				return nil, nil, fmt.Errorf("record from %s: over %d bytes (more than a hop keeps)", p, DefaultAuditKeepBytes)
			}
			f.Payload = slices.Clone(tensors[0]) // the reader reuses its buffer
		}
		frames = append(frames, f)
	}
	return rec, frames, nil
}

// maxFrames bounds the frames one hop can have seen in an epoch of open:
// one per position, and with speculation up to MaxSpecWindows windows in
// flight per committed token (the stale ones of a rejected generation).
func maxFrames(open *meshp2pb.SessionOpen) uint32 {
	n := open.GetNCtxNeeded() + 1
	if speculative(open) {
		n *= MaxSpecWindows + 1
	}
	return n
}

// Verdict is what judging a proof found.
type Verdict struct {
	Convicted bool
	Reason    string
	Window    int  // the first window that differed
	Windows   int  // windows replayed
	Signed    int  // windows the hop signed that cover frames (all to replay)
	Frames    int  // input frames replayed
	Exact     bool // compared exactly (the statement's kernel class is the replay's)
	Class     string
	Replay    time.Duration
	Proof     *meshp2pb.Proof // trimmed to the failing window, with the replay's result
	// Inconclusive says why nothing could be compared (neither convicted
	// nor passed): the tail across kernel classes.
	Inconclusive string
}

// Judge replays a proof's (or an audit's) hop on its recorded inputs and
// convicts it if a window's output differs from what it signed: exactly
// when the statement names the replay's kernel class, else beyond
// SketchTolerance (the tail across classes is never convicted: its output
// is sampled tokens, with no tolerance to apply). It errors (ErrProof)
// when the proof itself does not hold: the open not signed by its origin,
// statements not signed by the hop or not in order, inputs that are not
// what the hop signed it received.
func Judge(ctx context.Context, p *meshp2pb.Proof, engines AuditEngines) (Verdict, error) {
	var v Verdict
	sts, err := checkProofShape(p)
	if err != nil {
		return v, err
	}
	open, hop := p.GetOpen(), int(p.GetHopIndex())
	h := open.GetRoute().GetHops()[hop]
	windows, signed, err := replayableWindows(p, sts)
	v.Signed = signed
	if err != nil || len(windows) == 0 {
		return v, err // nothing to replay (no output either), or inputs not the hop's
	}
	if len(sts) > 0 {
		if err := checkAdopted(p.GetAdopted(), sts[0], hop == 0, int(p.GetNEmbd())); err != nil {
			return v, fmt.Errorf("%w: %w", ErrProof, err)
		}
	}
	eng, class, release, err := engines.Engine(ctx, open.GetModelFingerprint(), int(h.GetStart()), int(h.GetEnd()))
	if err != nil {
		return v, err
	}
	defer release()
	v.Class = class
	t0 := time.Now()
	got, err := RunReplay(ctx, eng, Replay{Open: open, Hop: hop, NEmbd: int(p.GetNEmbd()), Frames: p.GetInputs(), Windows: windows, Adopted: p.GetAdopted()})
	v.Replay = time.Since(t0)
	if err != nil {
		return v, err
	}
	tail := hop == len(open.GetRoute().GetHops())-1
	wi := 0
	for i, st := range sts {
		if st.GetFrames() == 0 {
			continue
		}
		if wi >= len(got) {
			break
		}
		r := got[wi]
		wi++
		v.Windows++
		v.Frames += int(st.GetFrames())
		// Byte for byte only within a batch-invariant class: a GPU hop's
		// rows depend on what it batched them with, which a replay does
		// not repeat.
		v.Exact = st.GetKernelClass() == class && route.InvariantClass(class)
		reason, inconclusive := compareWindow(st, r, class, hop, i, v.Exact, tail)
		if inconclusive != "" {
			v.Inconclusive = inconclusive
			return v, nil
		}
		if reason != "" {
			v.Convicted, v.Reason, v.Window = true, reason, i
			v.Proof = trimProof(p, sts, i, r, class, reason)
			return v, nil
		}
	}
	return v, nil
}

// replayableWindows returns the frames of each of a proof's windows whose
// inputs are all present (in order, windows of no frames left out) and
// how many windows the hop signed with frames; an ErrProof when a window's
// inputs are not what the hop signed it received.
func replayableWindows(p *meshp2pb.Proof, sts []*meshp2pb.Transcript) (windows []uint32, signed int, err error) {
	for _, st := range sts {
		if st.GetFrames() > 0 {
			signed++
		}
	}
	at := 0
	for i, st := range sts {
		n := int(st.GetFrames())
		if at+n > len(p.GetInputs()) {
			break
		}
		if !bytes.Equal(InputDigest(p.GetInputs()[at:at+n]), st.GetInDigest()) {
			return nil, signed, fmt.Errorf("%w: window %d: the inputs are not what hop %d signed it received", ErrProof, i, p.GetHopIndex())
		}
		if n > 0 {
			windows = append(windows, uint32(n))
		}
		at += n
	}
	return windows, signed, nil
}

// compareWindow compares window i's replay r with what the hop signed in
// st: why it differs ("" when it does not), or why it cannot be compared
// (the tail across kernel classes: sampled tokens have no tolerance, so it
// is never convicted that way, and not passed either).
func compareWindow(st *meshp2pb.Transcript, r ReplayWindow, class string, hop, i int, exact, tail bool) (reason, inconclusive string) {
	switch {
	case exact:
		if !bytes.Equal(r.OutDigest, st.GetOutDigest()) {
			return fmt.Sprintf("window %d (frames %d-%d): the replay's output digest differs from the one hop %d signed (exact comparison, kernel class %s)",
				i, st.GetFirstFrame(), st.GetFirstFrame()+st.GetFrames()-1, hop, class), ""
		}
	case tail:
		return "", fmt.Sprintf("the tail's output (sampled tokens) cannot be compared across kernel classes (the hop names %s, the replay ran on %s)", st.GetKernelClass(), class)
	default:
		if reason := SketchTolerance.Compare(st.GetSketch(), r.Last); reason != "" {
			return fmt.Sprintf("window %d: %s (kernel class %s against the hop's %s)", i, reason, class, st.GetKernelClass()), ""
		}
	}
	return "", ""
}

// trimProof is p cut to its windows up to the failing window i, with the
// replay's evidence of it.
func trimProof(p *meshp2pb.Proof, sts []*meshp2pb.Transcript, i int, r ReplayWindow, class, reason string) *meshp2pb.Proof {
	trimmed := proto.Clone(p).(*meshp2pb.Proof)
	trimmed.Statements = p.GetStatements()[:i+1]
	end := 0
	for _, s := range sts[:i+1] {
		end += int(s.GetFrames())
	}
	trimmed.Inputs = p.GetInputs()[:end]
	trimmed.Window, trimmed.ReplayOutDigest, trimmed.ReplaySketch, trimmed.ReplayTokens = uint32(i), r.OutDigest, r.Sketch, r.Tokens
	trimmed.AuditorKernelClass, trimmed.Reason, trimmed.MadeAtMs = class, reason, time.Now().UnixMilli()
	return trimmed
}

// CheckProof checks everything about a proof that needs no replay: the
// origin's signature on the open, the hop's on every statement, their
// order, and that the recorded inputs are what the hop signed it received.
// It returns the accused hop's peer: what a gossiped proof must pass before
// anyone spends a replay on it (ErrProof when it does not).
func CheckProof(p *meshp2pb.Proof) (peer.ID, error) {
	sts, err := checkProofShape(p)
	if err != nil {
		return "", err
	}
	windows, _, err := replayableWindows(p, sts)
	if err != nil {
		return "", err
	}
	if len(sts) > 0 {
		if err := checkAdopted(p.GetAdopted(), sts[0], p.GetHopIndex() == 0, int(p.GetNEmbd())); err != nil {
			return "", fmt.Errorf("%w: %w", ErrProof, err)
		}
	}
	if len(windows) == 0 {
		return "", fmt.Errorf("%w: no window with its inputs: nothing to replay", ErrProof)
	}
	return peer.ID(p.GetOpen().GetRoute().GetHops()[p.GetHopIndex()].GetPeerId()), nil
}

// checkProofShape checks everything about a proof but the replay: the
// origin's signature on the open, the hop's on every statement, and that
// the statements are the hop's windows of that epoch in order.
func checkProofShape(p *meshp2pb.Proof) ([]*meshp2pb.Transcript, error) {
	open := p.GetOpen()
	if open == nil || p.GetVersion() != 1 {
		return nil, fmt.Errorf("%w: no open, or version %d (want 1)", ErrProof, p.GetVersion())
	}
	if _, err := VerifyOpenOrigin(open); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrProof, err)
	}
	hops := open.GetRoute().GetHops()
	hop := int(p.GetHopIndex())
	if hop >= len(hops) {
		return nil, fmt.Errorf("%w: hop %d of a %d-hop route", ErrProof, hop, len(hops))
	}
	if hop > 0 && p.GetNEmbd() == 0 {
		return nil, fmt.Errorf("%w: n_embd missing", ErrProof)
	}
	return checkStatements(open, hop, p.GetStatements())
}

// checkStatements checks that sts are hop's signed statements of open's
// epoch, its consecutive windows from the first, under that open; it
// returns them opened (ErrProof when they are not).
func checkStatements(open *meshp2pb.SessionOpen, hop int, sts []*meshp2pb.SignedTranscript) ([]*meshp2pb.Transcript, error) {
	hops := open.GetRoute().GetHops()
	want := peer.ID(hops[hop].GetPeerId())
	var out []*meshp2pb.Transcript
	var frames uint32
	for i, s := range sts {
		st, err := OpenTranscript(s)
		if err != nil {
			return nil, fmt.Errorf("%w: statement %d: %w", ErrProof, i, err)
		}
		switch {
		case peer.ID(st.GetPeerId()) != want || int(st.GetHopIndex()) != hop:
			return nil, fmt.Errorf("%w: statement %d is %s's as hop %d, not %s's as hop %d", ErrProof, i, peer.ID(st.GetPeerId()), st.GetHopIndex(), want, hop)
		case !bytes.Equal(st.GetSessionId(), open.GetSessionId()) || st.GetEpoch() != open.GetEpoch() || !bytes.Equal(st.GetOriginPeerId(), open.GetOriginPeerId()):
			return nil, fmt.Errorf("%w: statement %d is of another session", ErrProof, i)
		case st.GetWindow() != uint32(i) || st.GetFirstFrame() != frames:
			return nil, fmt.Errorf("%w: statement %d is window %d from frame %d, want window %d from frame %d", ErrProof, i, st.GetWindow(), st.GetFirstFrame(), i, frames)
		case st.GetModelFingerprint() != open.GetModelFingerprint() || st.GetStart() != hops[hop].GetStart() || st.GetEnd() != hops[hop].GetEnd():
			return nil, fmt.Errorf("%w: statement %d is of another model or layers", ErrProof, i)
		case !bytes.Equal(st.GetOpenDigest(), OpenDigest(open)):
			// The origin could re-sign the session with other sampling or
			// wire dtype: the replay must run under the open the hop ran.
			return nil, fmt.Errorf("%w: statement %d was signed under another open than the proof's", ErrProof, i)
		}
		frames += st.GetFrames()
		out = append(out, st)
	}
	return out, nil
}

// Tolerance is the rule that compares a hop's sketch with a replay on
// another kernel class (docs/trust.md: how it was measured).
type Tolerance struct {
	// Abs and Rel bound |replay - signed| at each signed index: Abs +
	// Rel·|signed| (Abs in units of the row's largest signed magnitude).
	Abs, Rel float64
	// MinOverlap is how many of the signed top-k indices must be among
	// the replay's own top-k.
	MinOverlap int
}

// SketchTolerance is the cross-class rule, measured between builds of
// three SIMD levels (docs/trust.md): honest differences at the signed
// indices stayed under 0.016 of the row's largest magnitude (quantized
// weights; 7e-4 for F32/F16), and overlap never fell below 7 of 8; a
// skipped layer or a changed token moved them by 0.21 or more.
var SketchTolerance = Tolerance{Abs: 0.05, MinOverlap: SketchK - 2}

// Compare returns why the replay's rows do not fit the signed sketch ("":
// they do).
func (t Tolerance) Compare(signed []*meshp2pb.SketchRow, replay [][]float32) string {
	if len(signed) != len(replay) {
		return fmt.Sprintf("%d sketch rows signed for %d activations replayed", len(signed), len(replay))
	}
	for i, s := range signed {
		row := replay[i]
		var scale float64
		for _, v := range s.GetValue() {
			if a := math.Abs(float64(v)); !math.IsInf(a, 0) && !math.IsNaN(a) {
				scale = max(scale, a)
			}
		}
		for j, idx := range s.GetIndex() {
			if int(idx) >= len(row) {
				return fmt.Sprintf("row %d: index %d outside the row", i, idx)
			}
			if j >= len(s.GetValue()) {
				return fmt.Sprintf("row %d: %d indices, %d values", i, len(s.GetIndex()), len(s.GetValue()))
			}
			v, r := float64(s.GetValue()[j]), float64(row[idx])
			if v == r || (math.IsNaN(v) && math.IsNaN(r)) {
				continue // equal, infinities and NaN included
			}
			if d := math.Abs(r - v); !(d <= t.Abs*scale+t.Rel*math.Abs(v)) {
				return fmt.Sprintf("row %d: value at %d is %g signed, %g replayed (over the tolerance)", i, idx, v, r)
			}
		}
		// Ranks below the largest values shuffle across builds when many
		// values are close: a signed index counts as missing only if the
		// replay's value there is clearly below the replay's k-th largest,
		// and no unsigned value may clearly beat the smallest signed one.
		if len(s.GetIndex()) < min(SketchK, len(row)) {
			return fmt.Sprintf("row %d: %d sketch entries signed for a row of %d values (an honest hop signs %d)", i, len(s.GetIndex()), len(row), min(SketchK, len(row)))
		}
		if len(row) == 0 {
			continue
		}
		own := SketchRow(row, len(s.GetIndex()))
		tol := t.Abs * scale
		kth := math.Abs(float64(own.GetValue()[len(own.GetValue())-1]))
		missing := 0
		for _, idx := range s.GetIndex() {
			if r := math.Abs(float64(row[idx])); r < kth-tol {
				missing++
			}
		}
		if len(s.GetIndex())-missing < min(t.MinOverlap, len(s.GetIndex())) {
			return fmt.Sprintf("row %d: %d of the signed top-%d entries are clearly below the replay's top %d", i, missing, len(s.GetIndex()), len(s.GetIndex()))
		}
		least := math.Inf(1)
		for _, v := range s.GetValue() {
			least = min(least, math.Abs(float64(v)))
		}
		for j, idx := range own.GetIndex() {
			if !slices.Contains(s.GetIndex(), idx) && math.Abs(float64(own.GetValue()[j])) > least+tol {
				return fmt.Sprintf("row %d: the replay's value at %d (%g) clearly beats every signed one (smallest %g)", i, idx, own.GetValue()[j], least)
			}
		}
	}
	return ""
}
