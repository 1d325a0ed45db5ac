package node

import (
	"context"
	"slices"
	"testing"

	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/internal/testmodels"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/session"
)

// A conversation through a 3-node swarm: every turn after the first
// reuses the previous turns' KV on every hop (the prompt it resends and
// the answer it got), the origin sends only the rest, and the tokens are
// exactly `--local`'s for the whole prompt — greedy, sampled with a seed,
// and with speculative windows (whose rejected rows must not be kept).
func TestPrefixCacheConversation(t *testing.T) {
	model := testmodels.Path(t, "stories260K.gguf")
	tn := newTestNet(t)
	for _, r := range gguf.EvenSplit(5, 3) {
		tn.shardWith(model, &r, func(c *Config) { c.Engine.PrefixCacheCells = 512 })
	}
	c := tn.client()
	fp, nl := waitModel(t, c, "stories260K")
	o := c.Origin(nil)
	sampled := &meshp2pb.SamplingParams{Temperature: 0.8, TopK: 40, TopP: 0.95, RepeatPenalty: 1.1, Seed: 77}
	turns := []struct {
		name string
		sp   *meshp2pb.SamplingParams
		spec *meshp2pb.Speculation
	}{
		{"greedy", nil, nil},
		{"greedy", nil, nil},
		{"sampled", sampled, nil},
		{"speculative", nil, &meshp2pb.Speculation{Mode: meshp2pb.SpecMode_SPEC_MODE_NGRAM}},
		{"sampled after speculation", sampled, nil},
	}
	convo := thinClientPrompt(t, c, fp, "Once upon a time, there was a little girl named Lily. She loved to play outside")
	fed := 0 // what the turn before fed the route: its prompt and answer but the last token
	for i, turn := range turns {
		const maxTok = 40
		res, err := o.Generate(context.Background(), session.GenerateRequest{Fingerprint: fp, NLayer: nl, Prompt: convo, MaxTokens: maxTok,
			Sampling: turn.sp, Speculation: turn.spec})
		if err != nil {
			t.Fatal(err)
		}
		if want := localSampled(t, model, convo, maxTok, turn.sp); !equalTokens(res.Tokens, want) {
			t.Fatalf("turn %d (%s, %d cached): swarm %v\nlocal %v", i, turn.name, res.CachedTokens, res.Tokens, want)
		}
		t.Logf("turn %d (%s): prompt %d tokens, %d cached (per hop %v), TTFT %s", i, turn.name, len(convo), res.CachedTokens, res.HopCached, res.TTFT)
		// Every hop kept the turn before's whole blocks.
		if want := fed / session.PrefixBlock * session.PrefixBlock; res.CachedTokens != want || !slices.Equal(res.HopCached, []int{want, want, want}) {
			t.Fatalf("turn %d: %d cached, per hop %v; want %d on every hop", i, res.CachedTokens, res.HopCached, want)
		}
		fed = len(convo) + len(res.Tokens) - 1
		convo = slices.Concat(convo, res.Tokens, []int32{13, 376, 471, 263})
	}
	assertReleased(t, tn, c)
}
