package perfbench

import (
	"context"
	"errors"
	"testing"

	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/node/shardengine"
	"github.com/neuron-tai/meshp2p/session"
)

// TestEngineIsTheNodes checks that bench hops run the node's adapter and
// so classify a full KV cache as the hop's ErrNoCapacity (CONTEXT_FULL on
// the wire), as a real hop does.
func TestEngineIsTheNodes(t *testing.T) {
	p, err := SmallModel()
	if err != nil {
		t.Skip(err)
	}
	l, err := Load(context.Background(), p, engine.Config{NCtx: 256, NBatch: 64, MaxSessions: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	e := l.Engine()
	if _, ok := e.(shardengine.Engine); !ok {
		t.Fatalf("bench engine is %T, not the node's shardengine.Engine", e)
	}
	_, err = e.OpenSession(session.Key{ID: [16]byte{1}}, session.EngineParams{KVTokens: 1 << 20})
	if !errors.Is(err, session.ErrNoCapacity) {
		t.Fatalf("opening a session larger than the KV cache: %v, want session.ErrNoCapacity", err)
	}
}
