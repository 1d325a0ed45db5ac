package engine

import (
	"context"
	"fmt"
	"math"
	"time"
)

// ChainOptions configure an in-process run of a chain of shards.
type ChainOptions struct {
	Steps    int      // greedy/sampled decode steps after the prompt
	Sampling Sampling // tail sampling
	Logits   bool     // keep the tail's logits of every step
	// Chunk splits the prompt into prefill chunks of at most Chunk rows
	// (0: one chunk).
	Chunk int
	// Wire, if set, transforms hidden states between shards (e.g. an f16
	// round trip) to measure a lossy wire encoding.
	Wire func([]float32) []float32
	Key  SessionKey
	// Stop, if set, sees every sampled token; returning true ends the run
	// early (end-of-generation token, stop string).
	Stop func(tok int32) bool
}

// ChainResult is what a chain produced.
type ChainResult struct {
	Tokens  []int32     // sampled tokens: Steps+1 (the first after the prompt) unless stopped
	Logits  [][]float32 // per sampled token, when asked
	Prefill time.Duration
	Decode  time.Duration // total over the decode steps
}

// RunChain feeds prompt through shards in order (the first must be a head,
// the last a tail, ranges contiguous) and generates like the mesh does:
// each shard runs its layers and hands hidden states to the next. A single
// whole-model shard is the reference the chains must match.
func RunChain(ctx context.Context, shards []*Shard, prompt []int32, o ChainOptions) (*ChainResult, error) {
	if err := checkChain(shards); err != nil {
		return nil, err
	}
	if len(prompt) == 0 {
		return nil, fmt.Errorf("%w: empty prompt", ErrBadInput)
	}
	need := len(prompt) + o.Steps + 1
	sess := make([]*Session, len(shards))
	for i, s := range shards {
		x, err := s.OpenSession(o.Key, SessionParams{KVTokens: need, Sampling: o.Sampling})
		if err != nil {
			for _, y := range sess[:i] {
				y.Close()
			}
			return nil, err
		}
		sess[i] = x
	}
	defer func() {
		for _, x := range sess {
			x.Close()
		}
	}()
	res := &ChainResult{}
	step := func(toks []int32, pos int, last bool) (int32, []float32, error) {
		out, err := forwardChain(ctx, sess, toks, pos, last, last && o.Logits, o.Wire)
		if err != nil {
			return 0, nil, err
		}
		return out.Token, out.Logits, nil
	}
	chunk := o.Chunk
	if chunk <= 0 {
		chunk = len(prompt)
	}
	t0 := time.Now()
	var tok int32
	var logits []float32
	for off := 0; off < len(prompt); off += chunk {
		end := min(off+chunk, len(prompt))
		var err error
		tok, logits, err = step(prompt[off:end], off, end == len(prompt))
		if err != nil {
			return nil, err
		}
	}
	res.Prefill = time.Since(t0)
	res.Tokens = append(res.Tokens, tok)
	if o.Logits {
		res.Logits = append(res.Logits, logits)
	}
	stopped := o.Stop != nil && o.Stop(tok)
	t1 := time.Now()
	for i := 0; i < o.Steps && !stopped; i++ {
		var err error
		tok, logits, err = step([]int32{tok}, len(prompt)+i, true)
		if err != nil {
			return nil, err
		}
		res.Tokens = append(res.Tokens, tok)
		if o.Logits {
			res.Logits = append(res.Logits, logits)
		}
		stopped = o.Stop != nil && o.Stop(tok)
	}
	res.Decode = time.Since(t1)
	return res, nil
}

func checkChain(shards []*Shard) error {
	if len(shards) == 0 {
		return fmt.Errorf("%w: no shards", ErrBadInput)
	}
	if !shards[0].info.IsHead() {
		return fmt.Errorf("%w: first shard [%d,%d) is not a head", ErrBadInput, shards[0].info.Start, shards[0].info.End)
	}
	for i := 1; i < len(shards); i++ {
		a, b := shards[i-1].info, shards[i].info
		if a.End != b.Start || a.ParentNLayer != b.ParentNLayer || a.ParentFingerprint != b.ParentFingerprint {
			return fmt.Errorf("%w: shard [%d,%d) does not continue [%d,%d) of the same model", ErrBadInput, b.Start, b.End, a.Start, a.End)
		}
	}
	if last := shards[len(shards)-1].info; !last.IsTail() {
		return fmt.Errorf("%w: last shard [%d,%d) is not a tail (model has %d layers)", ErrBadInput, last.Start, last.End, last.ParentNLayer)
	}
	return nil
}

// MaxAbsDiff is the largest |a[i]-b[i]| (Inf when lengths differ).
func MaxAbsDiff(a, b []float32) float64 {
	if len(a) != len(b) {
		return math.Inf(1)
	}
	d := 0.0
	for i := range a {
		d = math.Max(d, math.Abs(float64(a[i])-float64(b[i])))
	}
	return d
}

// MeasureDecode times steps single-row decode steps of one scratch session
// (a head gets token ids, other shards small hidden states) and returns
// the fastest step: the shard's speed without the noise of whatever else
// the machine is doing at that moment (load is modelled separately). Nodes
// advertise it, per layer, for the tracker's cost model. It takes one
// session slot briefly.
func (s *Shard) MeasureDecode(ctx context.Context, steps int) (time.Duration, error) {
	if steps <= 0 {
		steps = 8
	}
	x, err := s.OpenSession(SessionKey{ID: [16]byte{0xca, 0x11, 0xb7}}, SessionParams{KVTokens: steps + 1})
	if err != nil {
		return 0, err
	}
	defer x.Close()
	hidden := make([]float32, s.info.NEmbd)
	for i := range hidden {
		hidden[i] = float32(math.Sin(float64(i))) * 0.1
	}
	best := time.Duration(math.MaxInt64)
	for i := 0; i <= steps; i++ {
		in := Input{Pos: i, Sample: s.info.IsTail()}
		if s.info.IsHead() {
			in.Tokens = []int32{int32(1 + i%max(1, s.info.NVocab-1))}
		} else {
			in.Hidden = hidden
		}
		t0 := time.Now()
		if _, err := x.Forward(ctx, in); err != nil {
			return 0, err
		}
		if i > 0 { // the first step warms caches
			best = min(best, time.Since(t0))
		}
	}
	return best, nil
}

// forwardChain runs rows through every session in order, as the mesh does
// in-process: token ids into the first, each shard's hidden states into the
// next (through wire, if set). It returns the tail's output.
func forwardChain(ctx context.Context, sess []*Session, toks []int32, pos int, sample, logits bool, wire func([]float32) []float32) (*Output, error) {
	var hidden []float32
	for i, x := range sess {
		in := Input{Pos: pos}
		if i == 0 {
			in.Tokens = toks
		} else {
			in.Hidden = hidden
		}
		last := i == len(sess)-1
		if last {
			in.Sample, in.Logits = sample, logits
		}
		out, err := x.Forward(ctx, in)
		if err != nil {
			return nil, fmt.Errorf("shard %d [%d,%d): %w", i, x.shard.info.Start, x.shard.info.End, err)
		}
		if last {
			return out, nil
		}
		hidden = out.Hidden
		if wire != nil {
			hidden = wire(hidden)
		}
	}
	return nil, fmt.Errorf("%w: empty chain", ErrBadInput)
}
