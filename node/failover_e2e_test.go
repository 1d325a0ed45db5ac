package node

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/internal/testmodels"
	"github.com/neuron-tai/meshp2p/metrics"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/session"
)

// Killing the middle node of a long-context session re-routes through a
// spare that recomputes only its own layers: the head and tail keep what
// their first epoch computed (every position the origin had fed but the
// last, past whole blocks: PrefixChain.own), the head re-sends the spare
// the rows it sent the dead node (its records), and the tokens are
// `--local`'s — the real engine, greedy, with n-gram speculation on a
// copy-heavy prompt too (windows in flight at the kill, some of their
// proposals rejected: rows the hops hold above what they adopt).
func TestKillMiddleNodeRecomputesOneHop(t *testing.T) {
	model := testmodels.Path(t, "stories260K.gguf")
	for _, tc := range []struct {
		name  string
		spec  *meshp2pb.Speculation
		steps int
	}{
		{"plain", nil, 3},
		{"speculative", &meshp2pb.Speculation{Mode: meshp2pb.SpecMode_SPEC_MODE_NGRAM, MaxDraft: 4, MaxWindows: 3}, 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tn, head, mids, tail, c := spareMiddleSwarm(t, model)
			fp, nl := waitModel(t, c, "stories260K")
			prompt := thinClientPrompt(t, c, fp, strings.Repeat("Once upon a time, there was a little girl named Lily. She loved to play outside. ", 8))
			const maxTok = 60
			want := localTokens(t, model, prompt, maxTok)
			killed := killMiddleAfter(mids, tc.steps, head, tail)
			o := c.Origin(nil)
			o.Audit = &session.Auditor{Rate: 0.5, Draw: func() float64 { return 0.99 }} // transcripts and records (the CLI's default), no audit
			res, err := o.Generate(context.Background(), session.GenerateRequest{Fingerprint: fp, NLayer: nl, Prompt: prompt, MaxTokens: maxTok, Speculation: tc.spec})
			if killed() == nil {
				t.Fatal("no middle node was serving the session")
			}
			if err != nil {
				t.Fatal(err)
			}
			if res.Reroutes != 1 || !equalTokens(res.Tokens, want) {
				t.Fatalf("reroutes %d\nswarm %v\nlocal %v", res.Reroutes, res.Tokens, want)
			}
			if tc.spec != nil && res.Spec.Proposed == 0 {
				t.Fatalf("nothing proposed (%+v): the test no longer kills during speculation", res.Spec)
			}
			// The survivors adopt every position the origin had fed but
			// the last, past whole blocks: the prompt's at least.
			if held := len(prompt) - 1; len(res.HopCached) != 3 || res.HopCached[0] < held || res.HopCached[1] != 0 || res.HopCached[2] < held {
				t.Fatalf("the new epoch's hops held %v positions of a %d-token prompt; want ≥ %d on the head and tail, 0 on the spare", res.HopCached, len(prompt), held)
			}
			t.Logf("prompt %d tokens; after the kill the hops held %v positions, the spare computed them all; speculation %+v", len(prompt), res.HopCached, res.Spec)
			assertReleased(t, tn, head, tail, mids[0], mids[1])
		})
	}
}

// spareMiddleSwarm starts stories260K as head 0-2, two middles 2-4 and a
// tail 4-5 (each with a prefix cache) and a client, and waits until the
// client sees all four shards.
func spareMiddleSwarm(t *testing.T, model string) (tn *testNet, head *Node, mids []*Node, tail, c *Node) {
	t.Helper()
	tn = newTestNet(t)
	cache := func(c *Config) { c.Engine.PrefixCacheCells = 1024; c.Metrics = metrics.New() }
	head = tn.shardWith(model, &gguf.Range{Start: 0, End: 2}, cache)
	mids = []*Node{tn.shardWith(model, &gguf.Range{Start: 2, End: 4}, cache), tn.shardWith(model, &gguf.Range{Start: 2, End: 4}, cache)}
	tail = tn.shardWith(model, &gguf.Range{Start: 4, End: 5}, cache)
	c = tn.client()
	fp, _ := waitModel(t, c, "stories260K")
	for deadline := time.Now().Add(30 * time.Second); len(c.Table().Shards(fp)) < 4; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the client never saw both middle nodes")
		}
		lctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, _ = c.P2P().Discovery().Lookup(lctx, fp)
		cancel()
	}
	return tn, head, mids, tail, c
}
