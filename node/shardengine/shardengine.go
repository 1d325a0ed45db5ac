// Package shardengine wires a llama.cpp shard into a hop (session.Engine),
// marking the engine's errors the hop maps to wire codes. The node serves
// through it and the performance bench (internal/perfbench) measures
// through it, so both classify NO_CAPACITY and BAD_INPUT alike.
package shardengine

import (
	"context"
	"errors"
	"time"

	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/session"
)

// Engine is a loaded shard as a hop's session.Engine.
type Engine struct {
	Model *engine.Model
	Shard *engine.Shard
}

var _ session.Engine = Engine{}

// Info is the shard's range and capacity as the hop sees them.
func (e Engine) Info() session.ShardInfo {
	i, c := e.Shard.Info(), e.Shard.Capacity()
	return session.ShardInfo{Start: i.Start, End: i.End, ParentNLayer: i.ParentNLayer, NEmbd: i.NEmbd, NCtx: c.NCtx, MaxSessions: c.MaxSessions}
}

// IsEOG reports whether tok ends a generation.
func (e Engine) IsEOG(tok int32) bool { return e.Model.IsEOG(tok) }

// OpenSession opens an engine session with the hop's sampling and KV
// reservation; its errors match session.ErrNoCapacity / ErrBadInput where
// the engine's do.
func (e Engine) OpenSession(key session.Key, p session.EngineParams) (session.EngineSession, error) {
	smp := engine.SamplingFromProto(p.Sampling)
	smp.Generated = p.Generated
	s, err := e.Shard.OpenSession(engine.SessionKey{ID: key.Local(), Epoch: key.Epoch}, engine.SessionParams{KVTokens: p.KVTokens, Sampling: smp, KeepInputs: p.KeepInputs})
	if err != nil {
		return nil, Error(err)
	}
	return shardSession{s}, nil
}

type shardSession struct{ s *engine.Session }

func (s shardSession) Forward(ctx context.Context, in session.Input) (session.Output, error) {
	out, err := s.s.Forward(ctx, engine.Input{Pos: in.Pos, Tokens: in.Tokens, Hidden: in.Hidden, Sample: in.Sample, Verify: in.Verify, Draft: in.Draft})
	if err != nil {
		return session.Output{}, Error(err)
	}
	o := session.Output{Hidden: out.Hidden, Token: out.Token, Tokens: out.Tokens}
	if lp := out.Logprob; lp != nil {
		o.Logprobs = &meshp2pb.TokenLogprobs{Logprob: lp.Logprob}
		for _, t := range lp.Top {
			o.Logprobs.TopTokens = append(o.Logprobs.TopTokens, t.Token)
			o.Logprobs.TopLogprobs = append(o.Logprobs.TopLogprobs, t.Logprob)
		}
	}
	return o, nil
}

func (s shardSession) Truncate(ctx context.Context, pos int) error {
	return Error(s.s.Truncate(ctx, pos))
}

func (s shardSession) Close() { s.s.Close() }

var _ session.PrefixSession = shardSession{}

// Adopt takes the longest cached prefix of p (session.PrefixSession).
func (s shardSession) Adopt(ctx context.Context, p session.Prefix) (int, []int32, error) {
	n, toks, err := s.s.Adopt(ctx, engine.Prefix(p))
	return n, toks, Error(err)
}

var _ session.InputKeeper = shardSession{}

// AdoptedInputs are the input rows of the adopted positions
// (session.InputKeeper).
func (s shardSession) AdoptedInputs() []float32 { return s.s.AdoptedInputs() }

// Keep makes Close keep the session's first blocks (session.PrefixSession).
func (s shardSession) Keep(p session.Prefix) { s.s.Keep(engine.Prefix(p)) }

// GrammarTime is the time the session's grammar took (session.GrammarTimer).
func (s shardSession) GrammarTime() time.Duration { return s.s.GrammarTime() }

// Error marks the engine errors the hop maps to wire codes
// (engine.ErrNoCapacity → session.ErrNoCapacity, engine.ErrBadInput →
// session.ErrBadInput), keeping the engine's message and error chain.
// Other errors pass unchanged.
func Error(err error) error {
	switch {
	case errors.Is(err, engine.ErrNoCapacity):
		return markedError{err, session.ErrNoCapacity}
	case errors.Is(err, engine.ErrBadInput), errors.Is(err, engine.ErrGrammar):
		// A grammar that does not compile, allows no token or costs too
		// much is the request's fault: re-routing would not help.
		return markedError{err, session.ErrBadInput}
	}
	return err
}

// markedError is err that also matches mark with errors.Is.
type markedError struct{ err, mark error }

func (e markedError) Error() string   { return e.err.Error() }
func (e markedError) Unwrap() []error { return []error{e.err, e.mark} }
