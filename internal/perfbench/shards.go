package perfbench

import (
	"context"

	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/session"
)

// Loaded is a model file with one shard (llama context) on it.
type Loaded struct {
	Model *engine.Model
	Shard *engine.Shard
}

// Load opens path and starts a shard with cfg.
func Load(ctx context.Context, path string, cfg engine.Config) (*Loaded, error) {
	m, err := engine.LoadModel(ctx, path, engine.LoadOptions{})
	if err != nil {
		return nil, err
	}
	s, err := engine.NewShard(ctx, m, cfg)
	if err != nil {
		m.Close()
		return nil, err
	}
	return &Loaded{Model: m, Shard: s}, nil
}

// Close frees the shard and the model.
func (l *Loaded) Close() {
	_ = l.Shard.Close()
	l.Model.Close()
}

// Engine is the shard as a hop's session.Engine (like node's wiring).
func (l *Loaded) Engine() session.Engine { return shardEngine{l} }

type shardEngine struct{ l *Loaded }

func (e shardEngine) Info() session.ShardInfo {
	i, c := e.l.Shard.Info(), e.l.Shard.Capacity()
	return session.ShardInfo{Start: i.Start, End: i.End, ParentNLayer: i.ParentNLayer, NEmbd: i.NEmbd, NCtx: c.NCtx, MaxSessions: c.MaxSessions}
}

func (e shardEngine) IsEOG(tok int32) bool { return e.l.Model.IsEOG(tok) }

func (e shardEngine) OpenSession(key session.Key, p session.EngineParams) (session.EngineSession, error) {
	smp := engine.SamplingFromProto(p.Sampling)
	smp.Generated = p.Generated
	s, err := e.l.Shard.OpenSession(engine.SessionKey{ID: key.ID, Epoch: key.Epoch}, engine.SessionParams{KVTokens: p.KVTokens, Sampling: smp})
	if err != nil {
		return nil, err
	}
	return shardSession{s}, nil
}

type shardSession struct{ s *engine.Session }

func (s shardSession) Forward(ctx context.Context, in session.Input) (session.Output, error) {
	out, err := s.s.Forward(ctx, engine.Input{Pos: in.Pos, Tokens: in.Tokens, Hidden: in.Hidden, Sample: in.Sample})
	if err != nil {
		return session.Output{}, err
	}
	return session.Output{Hidden: out.Hidden, Token: out.Token}, nil
}

func (s shardSession) Close() { s.s.Close() }
