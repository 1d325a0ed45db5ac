package node

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/route"
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
			r := measureFailover(t, model, "bench512", prompt, noCache, false)
			if ref == nil {
				ref = r.toks
			} else if !equalTokens(ref, r.toks) {
				t.Fatalf("tokens differ with and without the cache:\n%v\n%v", ref, r.toks)
			}
			share := r.ttft / 3
			t.Logf("prefix cache %-5v: first-epoch TTFT %v, stall after the kill %v = %.2f× the replaced hop's share (%v); kill to re-route %v, re-route to token %v",
				!noCache, r.ttft.Round(time.Millisecond), r.stall.Round(time.Millisecond), float64(r.stall)/float64(share), share.Round(time.Millisecond),
				r.detect.Round(time.Millisecond), r.resume.Round(time.Millisecond))
		}
	}
}

// failoverRun is what one measured failover gave: the tokens, the first
// epoch's TTFT, the stall (the longest gap between two tokens) and the
// median gap otherwise, the re-route's figures and, with a standby, its
// cost.
type failoverRun struct {
	toks               []int32
	ttft, stall, token time.Duration
	// detect is from the kill to the new epoch's route, resume from
	// there to the first token after it.
	detect, resume  time.Duration
	res             *session.Result
	standby, mirror session.StandbyStats
}

// measureFailover runs one generation over a fresh swarm of 4 nodes (a
// spare middle one), with a standby of the middle hop or without, and
// kills the first epoch's middle node after 3 decode steps.
func measureFailover(t *testing.T, model, name string, prompt []int32, noCache, standby bool) failoverRun {
	tn := newTestNet(t)
	cfg := func(c *Config) { c.Engine.NCtx, c.Engine.NBatch, c.Engine.PrefixCacheCells = 4096, 256, 2048 }
	head := tn.shardWith(model, &gguf.Range{Start: 0, End: 2}, cfg)
	mids := []*Node{tn.shardWith(model, &gguf.Range{Start: 2, End: 4}, cfg), tn.shardWith(model, &gguf.Range{Start: 2, End: 4}, cfg)}
	tail := tn.shardWith(model, &gguf.Range{Start: 4, End: 6}, cfg)
	c := tn.client()
	fp, nl := waitModel(t, c, name)
	for deadline := time.Now().Add(30 * time.Second); len(c.Table().Shards(fp)) < 4 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		lctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, _ = c.P2P().Discovery().Lookup(lctx, fp)
		cancel()
	}
	o := c.Origin(nil)
	o.NoPrefixCache = noCache
	o.StandbyAbove = -1
	o.Audit = &session.Auditor{Rate: 0.5, Draw: func() float64 { return 0.99 }} // the CLI's transcripts and records, no audit
	killed := make(chan struct{})
	var killedAt atomic.Value
	var spare *Node
	start := time.Now()
	var stamps []time.Time
	var rerouted time.Time
	nBefore := 0
	res, err := o.Generate(context.Background(), session.GenerateRequest{Fingerprint: fp, NLayer: nl, Prompt: prompt, MaxTokens: 16, Standby: standby,
		OnRoute: func(rt *route.Route, reroutes int) {
			if reroutes == 1 && rerouted.IsZero() {
				rerouted, nBefore = time.Now(), len(stamps)
			}
			if reroutes == 0 && len(rt.Hops) == 3 && spare == nil {
				m, other := mids[0], mids[1]
				if rt.Hops[1].Peer == other.P2P().ID() {
					m, other = other, m
				}
				spare = other
				go func() {
					killAfterSteps(m, 3, nil, head, tail)
					killedAt.Store(time.Now())
					close(killed)
				}()
			}
		},
		OnToken: func(int32) bool {
			stamps = append(stamps, time.Now())
			return false
		}})
	if spare == nil {
		t.Fatal("no first route of 3 hops")
	}
	<-killed
	if err != nil || res.Reroutes != 1 || len(stamps) < 3 {
		t.Fatalf("reroutes %d, %d tokens: %v", res.Reroutes, len(stamps), err)
	}
	r := failoverRun{toks: res.Tokens, ttft: stamps[0].Sub(start), res: res, standby: spare.Hop().StandbyStats(), mirror: head.Hop().StandbyStats(),
		detect: rerouted.Sub(killedAt.Load().(time.Time)), resume: stamps[nBefore].Sub(rerouted)}
	var gaps []time.Duration
	for i := 1; i < len(stamps); i++ {
		gaps = append(gaps, stamps[i].Sub(stamps[i-1]))
	}
	slices.Sort(gaps)
	r.stall, r.token = gaps[len(gaps)-1], gaps[(len(gaps)-1)/2]
	return r
}

// The hot standby's stall and cost, measured (MESHP2P_STANDBY_BENCH=1):
// the failover above, at several prompt lengths, with a standby of the
// middle hop (the spare middle node) and without (the spare recomputes
// the prompt's rows of its layers, the prefix cache's failover). The
// stall is the longest gap between two tokens, the token time the median
// gap; the cost is what the standby computed (rows, compute time), the
// bytes the head sent it and the KV it reserved. MESHP2P_STANDBY_PROMPTS
// lists the prompt lengths (default 256,1024,2000).
func TestStandbyStallMeasure(t *testing.T) {
	if os.Getenv("MESHP2P_STANDBY_BENCH") == "" {
		t.Skip("measurement: set MESHP2P_STANDBY_BENCH=1")
	}
	spec := gguf.DefaultSpec("llama")
	spec.Layers, spec.Embd, spec.Heads, spec.KVHeads, spec.FF, spec.Type, spec.Name = 6, 512, 8, 4, 1536, gguf.TypeF16, "bench512"
	model := filepath.Join(t.TempDir(), "bench512.gguf")
	if err := gguf.Synth(context.Background(), spec, model); err != nil {
		t.Fatal(err)
	}
	lengths := []int{256, 1024, 2000}
	if v := os.Getenv("MESHP2P_STANDBY_PROMPTS"); v != "" {
		lengths = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(f)
			if err != nil {
				t.Fatal(err)
			}
			lengths = append(lengths, n)
		}
	}
	// K and V, f16, of the standby's 2 layers: bytes per KV cell.
	cell := 2 * 2 * 2 * spec.Embd / spec.Heads * spec.KVHeads
	for _, n := range lengths {
		prompt := make([]int32, n)
		for i := range prompt {
			prompt[i] = int32(3 + (i*131)%250)
		}
		var ref []int32
		for _, standby := range []bool{false, true} {
			r := measureFailover(t, model, "bench512", prompt, false, standby)
			if ref == nil {
				ref = r.toks
			} else if !equalTokens(ref, r.toks) {
				t.Fatalf("tokens differ with and without the standby:\n%v\n%v", ref, r.toks)
			}
			t.Logf("prompt %4d, standby %-5v: TTFT %v, token %v, stall %v = %.1f× the token time (kill to re-route %v, re-route to token %v); new epoch's hops held %v, takeovers %d",
				n, standby, r.ttft.Round(time.Millisecond), r.token.Round(100*time.Microsecond), r.stall.Round(time.Millisecond),
				float64(r.stall)/float64(r.token), r.detect.Round(time.Millisecond), r.resume.Round(time.Millisecond), r.res.HopCached, r.res.Takeovers)
			if standby {
				t.Logf("  standby cost: %d rows computed in %v (the generation took %v), %d frames %.1f MiB mirrored by the head, %d KV cells reserved = %.1f MiB, dropped %d",
					r.standby.Rows, r.standby.Compute.Round(time.Millisecond), r.res.Total.Round(time.Millisecond), r.mirror.MirrorFrames,
					float64(r.mirror.MirrorBytes)/(1<<20), n+17, float64((n+17)*cell)/(1<<20), r.mirror.Dropped)
			}
		}
	}
}
