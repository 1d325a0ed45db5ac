package shardengine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/session"
)

// ErrDraftVocab reports a draft model that does not tokenize like the
// model it drafts for.
var ErrDraftVocab = errors.New("draft model's vocabulary differs from the model's")

// DraftSlack is the KV cells a draft session holds beyond its route
// session's reservation: the proposals of every window in flight.
const DraftSlack = session.MaxSpecDraft*session.MaxSpecWindows + 2

// Draft is a small whole model run on the head as the proposer of
// speculative sessions that ask for one (--speculative draft): it
// continues each session's committed tokens greedily.
type Draft struct {
	Model *engine.Model
	Shard *engine.Shard
	log   *slog.Logger
	ids   atomic.Uint64
}

// CheckDraftVocab opens both files and refuses a draft whose vocabulary
// (gguf.VocabDigest) is not the model's, naming both.
func CheckDraftVocab(draftPath, modelPath string) error {
	digest := func(p string) (gguf.Digest, error) {
		f, err := gguf.Open(p)
		if err != nil {
			return gguf.Digest{}, err
		}
		defer f.Close()
		return gguf.VocabDigest(f)
	}
	d, err := digest(draftPath)
	if err != nil {
		return fmt.Errorf("draft %s: %w", draftPath, err)
	}
	m, err := digest(modelPath)
	if err != nil {
		return fmt.Errorf("model %s: %w", modelPath, err)
	}
	if d != m {
		return fmt.Errorf("%w: draft %s has vocabulary %.12s…, model %s has %.12s…", ErrDraftVocab, draftPath, d, modelPath, m)
	}
	return nil
}

// LoadDraft loads a whole model as a draft, with room for maxSessions
// sessions of up to nCtx cells in all (plus DraftSlack each).
func LoadDraft(ctx context.Context, path string, maxSessions, nCtx, threads int, log *slog.Logger) (*Draft, error) {
	m, err := engine.LoadModel(ctx, path, engine.LoadOptions{})
	if err != nil {
		return nil, err
	}
	if in := m.Info(); !in.IsHead() || !in.IsTail() || !in.HasVocab {
		m.Close()
		return nil, fmt.Errorf("draft %s holds layers %d-%d of %d: a draft must be a whole model (shard split --first K makes one from a model)", path, in.Start, in.End, in.ParentNLayer)
	}
	sh, err := engine.NewShard(ctx, m, engine.Config{NCtx: nCtx + maxSessions*DraftSlack, NBatch: 512, MaxSessions: maxSessions, Threads: threads, Logger: log})
	if err != nil {
		m.Close()
		return nil, err
	}
	return &Draft{Model: m, Shard: sh, log: log}, nil
}

// Close frees the draft model.
func (d *Draft) Close() {
	_ = d.Shard.Close()
	d.Model.Close()
}

// Proposer is a session.ProposerFactory: a draft proposer for sessions
// that ask for SPEC_MODE_DRAFT, none (the n-gram one) otherwise or when
// the draft has no free session.
func (d *Draft) Proposer(mode meshp2pb.SpecMode, kv int) (session.Proposer, string) {
	if mode != meshp2pb.SpecMode_SPEC_MODE_DRAFT {
		return nil, ""
	}
	var id [16]byte
	n := d.ids.Add(1)
	for i := range 8 {
		id[i] = byte(n >> (8 * i))
	}
	s, err := d.Shard.OpenSession(engine.SessionKey{ID: id}, engine.SessionParams{KVTokens: kv + DraftSlack})
	if err != nil {
		d.log.Warn("draft model has no room for a session; proposing by n-gram", "err", err)
		return nil, ""
	}
	return &draftProposer{s: s, kv: kv + DraftSlack, log: d.log}, "draft"
}

// draftProposer continues a session's committed tokens with the draft
// model, greedily. Its KV cache holds seq (committed tokens, then earlier
// proposals); next is the draft's choice after seq.
type draftProposer struct {
	s    *engine.Session
	kv   int
	hist []int32 // committed tokens
	seq  []int32 // tokens decoded into the draft's KV, in order
	next int32
	ok   bool // next is valid
	err  error
	log  *slog.Logger
}

func (p *draftProposer) Append(toks ...int32) { p.hist = append(p.hist, toks...) }

// Costly: every proposal is a decode of the draft model.
func (p *draftProposer) Costly() bool { return true }

// Propose returns up to k of the draft's greedy continuation of the
// committed tokens. Proposals made before that are still a prefix of what
// was committed since are kept (their rows stay in the draft's cache).
func (p *draftProposer) Propose(k int) ([]int32, int) {
	if p.err != nil || k <= 0 || len(p.hist) == 0 {
		return nil, 0
	}
	ctx := context.Background()
	c := 0
	for c < len(p.seq) && c < len(p.hist) && p.seq[c] == p.hist[c] {
		c++
	}
	if c < len(p.seq) && c < len(p.hist) || (c == len(p.seq) && c == len(p.hist) && !p.ok) {
		// The draft's cache diverges from what was committed (or its
		// choice after it is unknown): keep the common part, at least one
		// token short so the last one is decoded again for its choice.
		c = min(c, len(p.hist)-1)
		if err := p.s.Truncate(ctx, c); err != nil {
			return p.fail(err)
		}
		p.seq, p.ok = p.seq[:c], false
	}
	if len(p.seq) < len(p.hist) {
		if len(p.hist)+k > p.kv {
			return nil, 0 // the session's reservation is spent
		}
		if !p.step(ctx, p.hist[len(p.seq):]) {
			return nil, 0
		}
	}
	// p.hist is a prefix of p.seq: the rest of seq and next are proposals.
	props := append(append([]int32(nil), p.seq[len(p.hist):]...), p.next)
	for len(props) < k && len(p.seq) < p.kv-1 {
		if !p.step(ctx, []int32{p.next}) {
			break
		}
		props = append(props, p.next)
	}
	return props[:min(k, len(props))], 0
}

// step decodes toks after seq and takes the draft's greedy choice.
func (p *draftProposer) step(ctx context.Context, toks []int32) bool {
	out, err := p.s.Forward(ctx, engine.Input{Pos: len(p.seq), Tokens: toks, Sample: true})
	if err != nil {
		p.fail(err)
		return false
	}
	p.seq, p.next, p.ok = append(p.seq, toks...), out.Token, true
	return true
}

func (p *draftProposer) fail(err error) ([]int32, int) {
	p.err = err
	p.log.Warn("draft model failed; this session proposes nothing more", "err", err)
	return nil, 0
}

// Close frees the draft session.
func (p *draftProposer) Close() error {
	p.s.Close()
	return nil
}
