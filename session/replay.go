package session

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"slices"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// ErrReplay: a replay that could not run (bad records, an engine that
// does not serve the hop's layers). It says nothing about the hop.
var ErrReplay = errors.New("replay failed")

// Replay is one hop's part of one (session, epoch) to run again: its input
// frames in order, cut into the windows its statements cover.
type Replay struct {
	Open    *meshp2pb.SessionOpen // the epoch's open, as the origin signed it
	Hop     int                   // index of the replayed hop in Open's route
	NEmbd   int
	Frames  []*meshp2pb.RecordedFrame
	Windows []uint32 // input frames per window, in order (their sum ≤ len(Frames))
	// Adopted are the inputs of the positions the hop adopted from its
	// prefix cache (AdoptedFrames), fed before Frames: they rebuild the
	// cells the epoch's frames attend to.
	Adopted []*meshp2pb.RecordedFrame
}

// ReplayWindow is what the replay made in one window: the same digest a
// hop computes of its output, the sketch of each activation's last row
// and the rows themselves (the tolerance rule), or the tail's tokens.
type ReplayWindow struct {
	OutDigest []byte
	Sketch    []*meshp2pb.SketchRow
	Last      [][]float32
	Tokens    []int32
}

// RunReplay runs r's frames through eng exactly as a hop does (dataplane
// compute: the same inputs, KV truncation on a new speculative generation,
// skipped windows of a rejected generation on the tail, the same output
// frames) and digests each window's output. eng must serve exactly the
// hop's layers; the replay holds one engine session while it runs.
func RunReplay(ctx context.Context, eng Engine, r Replay) ([]ReplayWindow, error) {
	total, err := r.check(eng)
	if err != nil {
		return nil, err
	}
	key := Key{Origin: peer.ID(r.Open.GetOriginPeerId()), Epoch: r.Open.GetEpoch()}
	if _, err := rand.Read(key.ID[:]); err != nil { // never the live session's
		return nil, err
	}
	es, err := eng.OpenSession(key, EngineParams{KVTokens: int(r.Open.GetNCtxNeeded()), Sampling: r.Open.GetSampling(), Generated: r.Open.GetGenerated()})
	if err != nil {
		return nil, fmt.Errorf("%w: open an engine session: %w", ErrReplay, err)
	}
	defer es.Close()
	rp := replayer{r: &r, eng: eng, es: es, head: r.Hop == 0, tail: r.Hop == len(r.Open.GetRoute().GetHops())-1, h: sha256.New()}
	if err := rp.adopt(ctx); err != nil {
		return nil, err
	}
	var inWindow uint32
	next := 0
	for i, f := range r.Frames[:total] {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if err := rp.frame(ctx, i, f); err != nil {
			return nil, err
		}
		inWindow++
		if inWindow == r.Windows[next] {
			rp.cur.OutDigest = rp.h.Sum(nil)
			rp.out = append(rp.out, rp.cur)
			rp.cur, inWindow = ReplayWindow{}, 0
			rp.h.Reset()
			next++
		}
	}
	return rp.out, nil
}

// check checks r against eng, the engine that is to replay it, taking
// the head's width from it, and returns how many frames r's windows
// cover.
func (r *Replay) check(eng Engine) (total uint32, _ error) {
	hops := r.Open.GetRoute().GetHops()
	if r.Hop < 0 || r.Hop >= len(hops) {
		return 0, fmt.Errorf("%w: hop %d of a %d-hop route", ErrReplay, r.Hop, len(hops))
	}
	hop, info := hops[r.Hop], eng.Info()
	if r.NEmbd == 0 && r.Hop == 0 { // the head's inputs are token ids: its width is the engine's
		r.NEmbd = info.NEmbd
	}
	if info.Start != int(hop.GetStart()) || info.End != int(hop.GetEnd()) || info.NEmbd != r.NEmbd {
		return 0, fmt.Errorf("%w: the engine serves layers %d-%d (n_embd %d), the hop %d-%d (n_embd %d)", ErrReplay,
			info.Start, info.End, info.NEmbd, hop.GetStart(), hop.GetEnd(), r.NEmbd)
	}
	for _, n := range r.Windows {
		if n == 0 || n > TranscriptWindow {
			return 0, fmt.Errorf("%w: a window of %d frames", ErrReplay, n)
		}
		total += n
	}
	if int(total) > len(r.Frames) {
		return 0, fmt.Errorf("%w: windows cover %d frames, %d recorded", ErrReplay, total, len(r.Frames))
	}
	return total, nil
}

// replayer is a replay in progress: the engine session, the speculation
// state of the hop and the window being digested.
type replayer struct {
	r          *Replay
	eng        Engine
	es         EngineSession
	head, tail bool
	spec       specHop
	// next is where the next hop starts (the epoch's plan, hop_starts, in
	// its first frame: planStarts): rows below it are computed, not sent.
	next    int
	started bool
	h       hash.Hash // the current window's output digest
	cur     ReplayWindow
	out     []ReplayWindow
}

// adopt feeds the adopted positions' inputs (their outputs are not the
// epoch's: the hop sent nothing for them).
func (rp *replayer) adopt(ctx context.Context) error {
	for i, f := range rp.r.Adopted {
		in, err := rp.input(i, f)
		if err != nil {
			return fmt.Errorf("adopted positions: %w", err)
		}
		if _, err := rp.es.Forward(ctx, in); err != nil {
			return fmt.Errorf("%w: adopted input frame %d: %w", ErrReplay, i, err)
		}
	}
	return nil
}

// frame runs input frame i (f) through the engine session as the hop
// does and adds its output to the current window.
func (rp *replayer) frame(ctx context.Context, i int, f *meshp2pb.RecordedFrame) error {
	a := f.GetHeader()
	in, err := rp.input(i, f)
	if err != nil {
		return err
	}
	if !rp.started { // as planStarts takes the plan from the epoch's first frame
		rp.started = true
		if st := a.GetHopStarts(); !rp.tail && len(st) == len(rp.r.Open.GetRoute().GetHops()) {
			rp.next = int(st[rp.r.Hop+1])
		}
	}
	skip := false
	if rp.tail {
		in.Sample = a.GetLastChunk() || !a.GetIsPrefill()
	}
	if a.GetVerify() {
		if g := a.GetSpecGen(); g > rp.spec.gen {
			rp.spec.gen, rp.spec.rejected = g, false
			if err := rp.es.Truncate(ctx, int(a.GetPosStart())); err != nil {
				return fmt.Errorf("%w: frame %d: %w", ErrReplay, i, err)
			}
		}
		skip = rp.tail && rp.spec.rejected
		if rp.tail && len(a.GetTokens()) > 0 {
			in.Sample, in.Verify, in.Draft = false, true, append(slices.Clone(a.GetTokens()[1:]), a.GetLookahead()...)
		}
	}
	if skip {
		return nil
	}
	o, err := rp.es.Forward(ctx, in)
	if err != nil {
		return fmt.Errorf("%w: frame %d: %w", ErrReplay, i, err)
	}
	return rp.output(i, a, in, o)
}

// input is the engine input of frame i (f): its tokens on the head, its
// activations elsewhere.
func (rp *replayer) input(i int, f *meshp2pb.RecordedFrame) (Input, error) {
	a := f.GetHeader()
	in := Input{Pos: int(a.GetPosStart())}
	if rp.head {
		if len(a.GetTokens()) != int(a.GetNRows()) {
			return in, fmt.Errorf("%w: frame %d: %d tokens for %d rows", ErrReplay, i, len(a.GetTokens()), a.GetNRows())
		}
		in.Tokens = a.GetTokens()
		return in, nil
	}
	if len(a.GetTensors()) != 1 {
		return in, fmt.Errorf("%w: frame %d has %d tensors", ErrReplay, i, len(a.GetTensors()))
	}
	hidden, err := frame.ToF32(a.GetTensors()[0].GetDtype(), f.GetPayload(), nil)
	if err != nil || len(hidden) != int(a.GetNRows())*rp.r.NEmbd {
		return in, fmt.Errorf("%w: frame %d: %d values for %d rows of %d (%v)", ErrReplay, i, len(hidden), a.GetNRows(), rp.r.NEmbd, err)
	}
	in.Hidden = hidden
	return in, nil
}

// output digests the frame the hop would have sent for input frame i
// (header a, engine input in, output o) and keeps what a window reports
// of it: the activation's sketch and last row, or the tail's tokens.
func (rp *replayer) output(i int, a *meshp2pb.ActivationHeader, in Input, o Output) error {
	switch {
	case !rp.tail:
		a, hidden, ok := forwardFrom(a, o.Hidden, rp.r.NEmbd, rp.next)
		if !ok {
			return nil // rows the next hop held: computed, not sent
		}
		hdr, payload := downFrame(a, hidden, rp.r.Open.GetWireDtype(), rp.r.NEmbd)
		digestActivation(rp.h, hdr, payload)
		s, err := sketchOf(hdr.GetTensors()[0].GetDtype(), payload, int(hdr.GetNRows()), rp.r.NEmbd)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrReplay, err)
		}
		last, _ := frame.ToF32(hdr.GetTensors()[0].GetDtype(), payload[len(payload)/int(hdr.GetNRows())*(int(hdr.GetNRows())-1):], nil)
		rp.cur.Sketch, rp.cur.Last = append(rp.cur.Sketch, s), append(rp.cur.Last, slices.Clone(last))
	case in.Verify:
		if len(o.Tokens) == 0 {
			return fmt.Errorf("%w: frame %d: verification sampled nothing", ErrReplay, i)
		}
		wr, rejected := windowAnswer(a, o.Tokens, rp.eng.IsEOG)
		rp.spec.rejected = rejected
		digestRing(rp.h, &meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_WindowResult{WindowResult: wr}})
		rp.cur.Tokens = append(rp.cur.Tokens, wr.GetTokens()...)
	case in.Sample:
		tf := tokenFrame(a, o.Token, rp.eng.IsEOG(o.Token))
		digestRing(rp.h, &meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Token{Token: tf}})
		rp.cur.Tokens = append(rp.cur.Tokens, o.Token)
	}
	return nil
}

// InputDigest is a window's digest of input frames, as the hop that
// received them computes it.
func InputDigest(frames []*meshp2pb.RecordedFrame) []byte {
	h := sha256.New()
	for _, f := range frames {
		digestActivation(h, f.GetHeader(), f.GetPayload())
	}
	return h.Sum(nil)
}
