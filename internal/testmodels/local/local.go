// Package local runs a whole model in-process for tests, as `generate
// --local` does: the reference a swarm's tokens must equal.
package local

import (
	"context"
	"testing"

	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// Tokens generates n tokens from prompt with the whole model at path,
// sampling with sp (nil: greedy).
func Tokens(t testing.TB, model string, prompt []int32, n int, sp *meshp2pb.SamplingParams) []int32 {
	t.Helper()
	m, err := engine.LoadModel(context.Background(), model, engine.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	s, err := engine.NewShard(context.Background(), m, engine.Config{NCtx: max(256, len(prompt)+n+16), NBatch: 64, MaxSessions: 1, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	res, err := engine.RunChain(context.Background(), []*engine.Shard{s}, prompt, engine.ChainOptions{Steps: n - 1, Chunk: 128, Sampling: engine.SamplingFromProto(sp)})
	if err != nil {
		t.Fatal(err)
	}
	return res.Tokens
}
