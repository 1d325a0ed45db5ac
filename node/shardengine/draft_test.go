package shardengine

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/internal/testmodels"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// selfDraft is stories260K cut to its first 4 layers.
func selfDraft(t *testing.T) (model, draft string) {
	t.Helper()
	model = testmodels.Path(t, "stories260K.gguf")
	res, err := gguf.Truncate(context.Background(), model, 4, filepath.Join(t.TempDir(), gguf.TruncateName(model, 4)))
	if err != nil {
		t.Fatal(err)
	}
	return model, res.Path
}

// greedy is the draft model's own greedy continuation of hist, n tokens.
func greedy(t *testing.T, path string, hist []int32, n int) []int32 {
	t.Helper()
	m, err := engine.LoadModel(context.Background(), path, engine.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	sh, err := engine.NewShard(context.Background(), m, engine.Config{NCtx: 256, MaxSessions: 1, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	res, err := engine.RunChain(context.Background(), []*engine.Shard{sh}, hist, engine.ChainOptions{Steps: n - 1})
	if err != nil {
		t.Fatal(err)
	}
	return res.Tokens
}

// The draft proposer proposes the draft model's greedy continuation of
// exactly the committed tokens, whatever was committed since its last
// proposal: all of it, part of it, or a correction.
func TestDraftProposer(t *testing.T) {
	model, draft := selfDraft(t)
	if err := CheckDraftVocab(draft, model); err != nil {
		t.Fatal(err)
	}
	d, err := LoadDraft(context.Background(), draft, 2, 512, 1, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if p, _ := d.Proposer(meshp2pb.SpecMode_SPEC_MODE_NGRAM, 128); p != nil {
		t.Fatal("a draft proposer for a session that asked for n-grams")
	}
	p, name := d.Proposer(meshp2pb.SpecMode_SPEC_MODE_DRAFT, 128)
	if p == nil || name != "draft" {
		t.Fatalf("no draft proposer (%q)", name)
	}
	defer p.(interface{ Close() error }).Close()
	hist := []int32{1, 403, 407, 261, 378}
	p.Append(hist...)
	for i, commit := range [][]int32{
		nil,          // first proposal
		{0},          // the first proposal accepted (index into it)
		{0, 1, 2},    // three accepted
		{0, -1},      // one accepted, then a correction
		{-1},         // a correction at once
		{0, 1, 2, 3}, // all accepted, then more is asked
	} {
		props, _ := p.Propose(5)
		if want := greedy(t, draft, hist, 5); !slices.Equal(props, want) {
			t.Fatalf("step %d: proposals %v, want the draft's greedy %v after %v", i, props, want, hist)
		}
		var add []int32
		for _, j := range commit {
			if j < 0 {
				add = append(add, (props[len(add)]+7)%512) // not what was proposed
				break
			}
			add = append(add, props[j])
		}
		p.Append(add...)
		hist = append(hist, add...)
	}
	// Its reservation bounds it: a history beyond it gets no proposal.
	p.Append(make([]int32, 200)...)
	if props, _ := p.Propose(4); props != nil {
		t.Fatalf("proposals %v beyond the session's KV reservation", props)
	}
}

func TestDraftRefused(t *testing.T) {
	model, _ := selfDraft(t)
	other := filepath.Join(t.TempDir(), "other.gguf")
	s := gguf.DefaultSpec("llama")
	s.Embd, s.Layers, s.Heads, s.KVHeads, s.FF = 64, 2, 4, 4, 128
	if err := gguf.Synth(context.Background(), s, other); err != nil {
		t.Fatal(err)
	}
	err := CheckDraftVocab(other, model)
	if !errors.Is(err, ErrDraftVocab) || !strings.Contains(err.Error(), other) || !strings.Contains(err.Error(), model) {
		t.Fatalf("a draft of another vocabulary: %v, want ErrDraftVocab naming both files", err)
	}
	shards, err := gguf.Split(context.Background(), model, []gguf.Range{{Start: 0, End: 2}, {Start: 2, End: 5}}, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := LoadDraft(context.Background(), shards[0].Path, 1, 256, 1, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "whole model") {
		t.Fatalf("a head shard as draft: %v", err)
	}
}
