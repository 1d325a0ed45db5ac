package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/session"
)

// The prefix cache's gain, measured (MESHP2P_PREFIX_BENCH=1): a
// conversation of several turns through 3 in-process nodes of a
// random-weight llama (n_embd 512, 6 layers, F16), each turn resending the
// earlier ones plus 300 new tokens; time to first token and the process's
// CPU time (all three nodes' compute) of each turn with the cache and
// without (the origin's NoPrefixCache: nothing reused or kept), best of 3.
// The tokens must be the same either way.
func TestPrefixCacheMeasure(t *testing.T) {
	if os.Getenv("MESHP2P_PREFIX_BENCH") == "" {
		t.Skip("measurement: set MESHP2P_PREFIX_BENCH=1")
	}
	spec := gguf.DefaultSpec("llama")
	spec.Layers, spec.Embd, spec.Heads, spec.KVHeads, spec.FF, spec.Type, spec.Name = 6, 512, 8, 4, 1536, gguf.TypeF16, "bench512"
	model := filepath.Join(t.TempDir(), "bench512.gguf")
	if err := gguf.Synth(context.Background(), spec, model); err != nil {
		t.Fatal(err)
	}
	tn := newTestNet(t)
	for _, r := range gguf.EvenSplit(spec.Layers, 3) {
		tn.shardWith(model, &r, func(c *Config) {
			c.Engine.NCtx, c.Engine.NBatch, c.Engine.PrefixCacheCells = 2048, 256, 2048
		})
	}
	c := tn.client()
	fp, nl := waitModel(t, c, "bench512")
	const turns, user, answer = 5, 300, 16
	words := func(turn int) []int32 {
		w := make([]int32, user)
		for i := range w {
			w[i] = int32(3 + (i*131+turn*977)%250)
		}
		return w
	}
	// The two conversations go in lockstep, turn by turn, so load from
	// elsewhere on the machine hits both alike; the best of 3 runs.
	with, without := make([]time.Duration, turns), make([]time.Duration, turns)
	withCPU, withoutCPU := make([]time.Duration, turns), make([]time.Duration, turns)
	cached := make([]int, turns)
	for rep := range 3 {
		convo := [2][]int32{{1}, {1}}
		for turn := range turns {
			var outs [2][]int32
			for mode, noCache := range []bool{true, false} {
				o := c.Origin(nil)
				o.NoPrefixCache = noCache
				convo[mode] = slices.Concat(convo[mode], words(turn))
				cpu0 := cpuTime(t)
				res, err := o.Generate(context.Background(), session.GenerateRequest{Fingerprint: fp, NLayer: nl, Prompt: convo[mode], MaxTokens: answer,
					CacheNamespace: fmt.Sprint(rep)})
				if err != nil {
					t.Fatal(err)
				}
				cpu := cpuTime(t) - cpu0
				if noCache {
					without[turn], withoutCPU[turn] = minDur(without[turn], res.TTFT), minDur(withoutCPU[turn], cpu)
				} else {
					with[turn], withCPU[turn], cached[turn] = minDur(with[turn], res.TTFT), minDur(withCPU[turn], cpu), res.CachedTokens
				}
				outs[mode] = res.Tokens
				convo[mode] = slices.Concat(convo[mode], res.Tokens)
			}
			if !slices.Equal(outs[0], outs[1]) {
				t.Fatalf("turn %d: %v with the cache, %v without", turn, outs[1], outs[0])
			}
		}
	}
	for i := range turns {
		t.Logf("turn %d: prompt %4d tokens, %4d reused: TTFT %v without the cache, %v with it (%.1f×); CPU %v and %v (%.1f×)", i, 1+(user+answer)*i+user, cached[i],
			without[i].Round(time.Millisecond), with[i].Round(time.Millisecond), ratio(without[i], with[i]),
			withoutCPU[i].Round(time.Millisecond), withCPU[i].Round(time.Millisecond), ratio(withoutCPU[i], withCPU[i]))
	}
}

func ratio(a, b time.Duration) float64 { return float64(a) / float64(max(1, b)) }

func minDur(a, b time.Duration) time.Duration {
	if a == 0 || b < a {
		return b
	}
	return a
}
