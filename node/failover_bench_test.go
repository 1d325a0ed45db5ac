package node

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/session"
)

// The failover stall, measured (MESHP2P_PREFIX_BENCH=1): a 2,000-token
// prompt through 3 in-process nodes of a random-weight llama (n_embd 512,
// 6 layers, F16, 2 layers a node) with a spare middle node; the middle
// node is killed after 3 decode steps. The stall is the longest gap
// between two tokens; the replaced hop's share of the prefill is a third
// of the first epoch's TTFT. With the prefix cache (the default) the
// spare alone recomputes the prompt; without it (the origin's
// NoPrefixCache) every hop does, as before. The tokens must be the same.
func TestFailoverStallMeasure(t *testing.T) {
	if os.Getenv("MESHP2P_PREFIX_BENCH") == "" {
		t.Skip("measurement: set MESHP2P_PREFIX_BENCH=1")
	}
	spec := gguf.DefaultSpec("llama")
	spec.Layers, spec.Embd, spec.Heads, spec.KVHeads, spec.FF, spec.Type, spec.Name = 6, 512, 8, 4, 1536, gguf.TypeF16, "bench512"
	model := filepath.Join(t.TempDir(), "bench512.gguf")
	if err := gguf.Synth(context.Background(), spec, model); err != nil {
		t.Fatal(err)
	}
	prompt := make([]int32, 2000)
	for i := range prompt {
		prompt[i] = int32(3 + (i*131)%250)
	}
	var ref []int32
	for rep := range 2 {
		for _, noCache := range []bool{rep == 0, rep != 0} {
			toks, ttft, stall := failoverStall(t, model, prompt, noCache)
			if ref == nil {
				ref = toks
			} else if !equalTokens(ref, toks) {
				t.Fatalf("tokens differ with and without the cache:\n%v\n%v", ref, toks)
			}
			share := ttft / 3
			t.Logf("prefix cache %-5v: first-epoch TTFT %v, stall after the kill %v = %.2f× the replaced hop's share (%v)",
				!noCache, ttft.Round(time.Millisecond), stall.Round(time.Millisecond), float64(stall)/float64(share), share.Round(time.Millisecond))
		}
	}
}

// failoverStall runs one generation over a fresh swarm, killing the
// middle node after 3 decode steps: its tokens, TTFT and longest gap
// between tokens.
func failoverStall(t *testing.T, model string, prompt []int32, noCache bool) ([]int32, time.Duration, time.Duration) {
	tn := newTestNet(t)
	cfg := func(c *Config) { c.Engine.NCtx, c.Engine.NBatch, c.Engine.PrefixCacheCells = 4096, 256, 2048 }
	head := tn.shardWith(model, &gguf.Range{Start: 0, End: 2}, cfg)
	mids := []*Node{tn.shardWith(model, &gguf.Range{Start: 2, End: 4}, cfg), tn.shardWith(model, &gguf.Range{Start: 2, End: 4}, cfg)}
	tail := tn.shardWith(model, &gguf.Range{Start: 4, End: 6}, cfg)
	c := tn.client()
	fp, nl := waitModel(t, c, "bench512")
	for deadline := time.Now().Add(30 * time.Second); len(c.Table().Shards(fp)) < 4 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		lctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, _ = c.P2P().Discovery().Lookup(lctx, fp)
		cancel()
	}
	killed := killMiddleAfter(mids, 3, head, tail)
	o := c.Origin(nil)
	o.NoPrefixCache = noCache
	o.Audit = &session.Auditor{Rate: 0.5, Draw: func() float64 { return 0.99 }} // the CLI's transcripts and records, no audit
	start := time.Now()
	var last time.Time
	var ttft, stall time.Duration
	res, err := o.Generate(context.Background(), session.GenerateRequest{Fingerprint: fp, NLayer: nl, Prompt: prompt, MaxTokens: 16,
		OnToken: func(int32) bool {
			now := time.Now()
			if last.IsZero() {
				ttft = now.Sub(start)
			} else {
				stall = max(stall, now.Sub(last))
			}
			last = now
			return false
		}})
	if k := killed(); err != nil || k == nil || res.Reroutes != 1 {
		t.Fatalf("killed %v, reroutes %d: %v", k != nil, res.Reroutes, err)
	}
	return res.Tokens, ttft, stall
}
