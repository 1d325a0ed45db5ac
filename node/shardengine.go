package node

import (
	"context"
	"errors"

	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/session"
)

// shardEngine wires the llama.cpp shard into the hop (session.Engine).
type shardEngine struct {
	model *engine.Model
	shard *engine.Shard
}

func (e shardEngine) Info() session.ShardInfo {
	i, c := e.shard.Info(), e.shard.Capacity()
	return session.ShardInfo{Start: i.Start, End: i.End, ParentNLayer: i.ParentNLayer, NEmbd: i.NEmbd, NCtx: c.NCtx, MaxSessions: c.MaxSessions}
}

func (e shardEngine) IsEOG(tok int32) bool { return e.model.IsEOG(tok) }

func (e shardEngine) OpenSession(key session.Key, p session.EngineParams) (session.EngineSession, error) {
	smp := engine.SamplingFromProto(p.Sampling)
	smp.Generated = p.Generated
	s, err := e.shard.OpenSession(engine.SessionKey{ID: key.ID, Epoch: key.Epoch}, engine.SessionParams{KVTokens: p.KVTokens, Sampling: smp})
	if err != nil {
		return nil, engineError(err)
	}
	return shardSession{s}, nil
}

type shardSession struct{ s *engine.Session }

func (s shardSession) Forward(ctx context.Context, in session.Input) (session.Output, error) {
	out, err := s.s.Forward(ctx, engine.Input{Pos: in.Pos, Tokens: in.Tokens, Hidden: in.Hidden, Sample: in.Sample})
	if err != nil {
		return session.Output{}, engineError(err)
	}
	return session.Output{Hidden: out.Hidden, Token: out.Token}, nil
}

func (s shardSession) Close() { s.s.Close() }

// engineError marks the engine errors the hop maps to wire codes, keeping
// the engine's message.
func engineError(err error) error {
	switch {
	case errors.Is(err, engine.ErrNoCapacity):
		return markedError{err, session.ErrNoCapacity}
	case errors.Is(err, engine.ErrBadInput):
		return markedError{err, session.ErrBadInput}
	}
	return err
}

// markedError is err that also matches mark with errors.Is.
type markedError struct{ err, mark error }

func (e markedError) Error() string   { return e.err.Error() }
func (e markedError) Unwrap() []error { return []error{e.err, e.mark} }
