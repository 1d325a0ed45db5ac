package perfbench

import (
	"context"

	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/node/shardengine"
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

// Engine is the shard as a hop's session.Engine: the node's own adapter
// (node/shardengine), so bench hops map engine errors to the same wire
// codes as real ones.
func (l *Loaded) Engine() session.Engine { return shardengine.Engine{Model: l.Model, Shard: l.Shard} }
