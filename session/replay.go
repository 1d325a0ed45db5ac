package session

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
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
	hops := r.Open.GetRoute().GetHops()
	if r.Hop < 0 || r.Hop >= len(hops) {
		return nil, fmt.Errorf("%w: hop %d of a %d-hop route", ErrReplay, r.Hop, len(hops))
	}
	hop, info := hops[r.Hop], eng.Info()
	if r.NEmbd == 0 && r.Hop == 0 { // the head's inputs are token ids: its width is the engine's
		r.NEmbd = info.NEmbd
	}
	if info.Start != int(hop.GetStart()) || info.End != int(hop.GetEnd()) || info.NEmbd != r.NEmbd {
		return nil, fmt.Errorf("%w: the engine serves layers %d-%d (n_embd %d), the hop %d-%d (n_embd %d)", ErrReplay,
			info.Start, info.End, info.NEmbd, hop.GetStart(), hop.GetEnd(), r.NEmbd)
	}
	var total uint32
	for _, n := range r.Windows {
		if n == 0 || n > TranscriptWindow {
			return nil, fmt.Errorf("%w: a window of %d frames", ErrReplay, n)
		}
		total += n
	}
	if int(total) > len(r.Frames) {
		return nil, fmt.Errorf("%w: windows cover %d frames, %d recorded", ErrReplay, total, len(r.Frames))
	}
	head, tail := r.Hop == 0, r.Hop == len(hops)-1
	key := Key{Origin: peer.ID(r.Open.GetOriginPeerId()), Epoch: r.Open.GetEpoch()}
	if _, err := rand.Read(key.ID[:]); err != nil { // never the live session's
		return nil, err
	}
	es, err := eng.OpenSession(key, EngineParams{KVTokens: int(r.Open.GetNCtxNeeded()), Sampling: r.Open.GetSampling(), Generated: r.Open.GetGenerated()})
	if err != nil {
		return nil, fmt.Errorf("%w: open an engine session: %w", ErrReplay, err)
	}
	defer es.Close()
	var (
		out      []ReplayWindow
		cur      ReplayWindow
		h        = sha256.New()
		inWindow uint32
		spec     specHop
	)
	next := 0
	for i, f := range r.Frames[:total] {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		a := f.GetHeader()
		in := Input{Pos: int(a.GetPosStart())}
		if head {
			if len(a.GetTokens()) != int(a.GetNRows()) {
				return nil, fmt.Errorf("%w: frame %d: %d tokens for %d rows", ErrReplay, i, len(a.GetTokens()), a.GetNRows())
			}
			in.Tokens = a.GetTokens()
		} else {
			if len(a.GetTensors()) != 1 {
				return nil, fmt.Errorf("%w: frame %d has %d tensors", ErrReplay, i, len(a.GetTensors()))
			}
			hidden, err := frame.ToF32(a.GetTensors()[0].GetDtype(), f.GetPayload(), nil)
			if err != nil || len(hidden) != int(a.GetNRows())*r.NEmbd {
				return nil, fmt.Errorf("%w: frame %d: %d values for %d rows of %d (%v)", ErrReplay, i, len(hidden), a.GetNRows(), r.NEmbd, err)
			}
			in.Hidden = hidden
		}
		skip := false
		if tail {
			in.Sample = a.GetLastChunk() || !a.GetIsPrefill()
		}
		if a.GetVerify() {
			if g := a.GetSpecGen(); g > spec.gen {
				spec.gen, spec.rejected = g, false
				if err := es.Truncate(ctx, int(a.GetPosStart())); err != nil {
					return nil, fmt.Errorf("%w: frame %d: %w", ErrReplay, i, err)
				}
			}
			skip = tail && spec.rejected
			if tail && len(a.GetTokens()) > 0 {
				in.Sample, in.Verify, in.Draft = false, true, append(slices.Clone(a.GetTokens()[1:]), a.GetLookahead()...)
			}
		}
		if !skip {
			o, err := es.Forward(ctx, in)
			if err != nil {
				return nil, fmt.Errorf("%w: frame %d: %w", ErrReplay, i, err)
			}
			switch {
			case !tail:
				hdr, payload := downFrame(a, o.Hidden, r.Open.GetWireDtype(), r.NEmbd)
				digestActivation(h, hdr, payload)
				s, err := sketchOf(hdr.GetTensors()[0].GetDtype(), payload, int(hdr.GetNRows()), r.NEmbd)
				if err != nil {
					return nil, fmt.Errorf("%w: %w", ErrReplay, err)
				}
				last, _ := frame.ToF32(hdr.GetTensors()[0].GetDtype(), payload[len(payload)/int(hdr.GetNRows())*(int(hdr.GetNRows())-1):], nil)
				cur.Sketch, cur.Last = append(cur.Sketch, s), append(cur.Last, slices.Clone(last))
			case in.Verify:
				if len(o.Tokens) == 0 {
					return nil, fmt.Errorf("%w: frame %d: verification sampled nothing", ErrReplay, i)
				}
				wr, rejected := windowAnswer(a, o.Tokens, eng.IsEOG)
				spec.rejected = rejected
				digestRing(h, &meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_WindowResult{WindowResult: wr}})
				cur.Tokens = append(cur.Tokens, wr.GetTokens()...)
			case in.Sample:
				tf := tokenFrame(a, o.Token, eng.IsEOG(o.Token))
				digestRing(h, &meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Token{Token: tf}})
				cur.Tokens = append(cur.Tokens, o.Token)
			}
		}
		inWindow++
		if inWindow == r.Windows[next] {
			cur.OutDigest = h.Sum(nil)
			out = append(out, cur)
			cur, inWindow = ReplayWindow{}, 0
			h.Reset()
			next++
		}
	}
	return out, nil
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
