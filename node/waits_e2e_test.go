package node

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/session"
)

// Issue 39, item 6, with real parts: three nodes at one thread serve a
// synthesized model whose prefill of a long prompt takes several times
// the fixed waits, which are shortened by name (HopConfig.FirstFrame and
// Idle, Origin.TokenTimeout) rather than the model made huge (they stay
// well above a decode step on a loaded machine). The hops'
// speeds come from their adverts (measured at load) through the local
// planner into the open, and the waits follow them: the generation
// matches the whole model in-process, with no re-route and nobody blamed.
func TestSlowPrefillSwarm(t *testing.T) {
	if testing.Short() {
		t.Skip("a prefill of several seconds")
	}
	spec := gguf.DefaultSpec("llama")
	spec.Layers, spec.Embd, spec.FF, spec.Heads, spec.KVHeads, spec.Type = 6, 768, 2304, 12, 4, gguf.TypeF16
	spec.Name, spec.Seed = "slowprefill", 39
	model := filepath.Join(t.TempDir(), "slowprefill.gguf")
	if err := gguf.Synth(context.Background(), spec, model); err != nil {
		t.Fatal(err)
	}
	prompt := make([]int32, 800)
	for i := range prompt {
		prompt[i] = int32(3 + (i*37)%360)
	}
	const maxTok = 8
	t0 := time.Now()
	want := localTokens(t, model, prompt, maxTok)
	// The whole model's prefill, mostly: what the three hops take in turn.
	// The fixed waits are cut to fractions of it (the first frame 1/40, so
	// the tail once waited 3/40 for a first chunk that was the prompt;
	// idle 2/5, against the 2/3 the head waits after its prompt; the first
	// token 1/2), so the test scales with the machine; decode steps stay
	// far below them.
	took := time.Since(t0)
	firstFrame, idle, token := took/40, took*2/5, took/2
	t.Logf("local run %s: first frame %s, idle %s, token %s", took, firstFrame, idle, token)
	tn := newTestNet(t)
	for _, r := range gguf.EvenSplit(spec.Layers, 3) {
		tn.shardWith(model, &r, func(c *Config) { c.Hop.FirstFrame, c.Hop.Idle, c.Engine.NCtx = firstFrame, idle, 1024 })
	}
	c := tn.client()
	fp, nl := waitModel(t, c, spec.Name)
	deadline := time.Now().Add(30 * time.Second)
	for len(c.Table().Shards(fp)) < 3 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	o := c.Origin(nil)
	// The prompt in one chunk after the first row: each hop computes it
	// in one go, several idle times long, while the next waits.
	o.TokenTimeout, o.Chunk = token, len(prompt)
	res, err := o.Generate(context.Background(), session.GenerateRequest{Fingerprint: fp, NLayer: nl, Prompt: prompt, MaxTokens: maxTok})
	if err != nil {
		t.Fatalf("generation failed (a fixed wait ran out during the prefill?): %v", err)
	}
	t.Logf("TTFT %s, total %s, route %+v", res.TTFT, res.Total, res.HopStats)
	if res.Reroutes != 0 || len(res.Failures) != 0 || len(res.Route.Hops) != 3 {
		t.Fatalf("%d re-routes over %d hops, failures %v; want none over 3", res.Reroutes, len(res.Route.Hops), res.Failures)
	}
	for _, h := range res.Route.Hops {
		if h.MsPerLayer <= 0 {
			t.Errorf("route hop %s carries no advertised speed", h.Peer)
		}
		if o.Failures.Avoided(h.Peer) {
			t.Errorf("route hop %s blamed", h.Peer)
		}
	}
	if !equalTokens(res.Tokens, want) {
		t.Fatalf("swarm %v\nlocal %v", res.Tokens, want)
	}
	if res.TTFT < token {
		t.Fatalf("TTFT %s: the prefill did not outlast the fixed waits (idle %s, first token %s), the test proves nothing", res.TTFT, idle, token)
	}
	assertReleased(t, tn, c)
}
