package node

import (
	"context"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/internal/testmodels"
	"github.com/neuron-tai/meshp2p/session"
)

// BenchmarkSwarmDecode measures what the mesh costs per token: greedy
// decode through 3 nodes on loopback (real hosts, f32 wire, ring pipeline)
// against the whole model in-process, reported as ms/token and the ratio
// in the same run. On the tiny model the difference is almost all network
// and framing overhead per hop.
func BenchmarkSwarmDecode(b *testing.B) {
	model := testmodels.Path(b, "stories260K.gguf")
	ctx := context.Background()
	tn := newTestNet(b)
	for _, r := range gguf.EvenSplit(5, 3) {
		tn.shard(model, r)
	}
	c := tn.client()
	fp, nl, err := waitForModel(ctx, c, "stories260K", 30*time.Second)
	if err != nil {
		b.Fatal(err)
	}
	const steps = 128
	prompt := []int32{1, 403, 407, 261}

	m, err := engine.LoadModel(ctx, model, engine.LoadOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	whole, err := engine.NewShard(ctx, m, engine.Config{NCtx: 512, NBatch: 64, MaxSessions: 1, Threads: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer whole.Close()

	var local, swarm time.Duration
	for i := 0; i < b.N; i++ {
		res, err := engine.RunChain(ctx, []*engine.Shard{whole}, prompt, engine.ChainOptions{Steps: steps - 1})
		if err != nil {
			b.Fatal(err)
		}
		local += res.Decode
		g, err := c.Origin(nil).Generate(ctx, session.GenerateRequest{Fingerprint: fp, NLayer: nl, Prompt: prompt, MaxTokens: steps})
		if err != nil {
			b.Fatal(err)
		}
		swarm += g.Total - g.TTFT
	}
	lm := float64(local.Microseconds()) / 1000 / float64(b.N*(steps-1))
	sm := float64(swarm.Microseconds()) / 1000 / float64(b.N*(steps-1))
	b.ReportMetric(lm, "local_ms/token")
	b.ReportMetric(sm, "swarm3_ms/token")
	b.ReportMetric(sm/lm, "x_local")
	b.ReportMetric((sm-lm)/3, "overhead_ms/hop/token")
}
