package client

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/route"
	"github.com/neuron-tai/meshp2p/vocab"
)

// Vocab is the tokenizer of one model: what the client needs of the
// engine (client/enginevocab adapts engine.Model).
type Vocab interface {
	// Tokenize turns text into token ids; addSpecial adds BOS (and EOS
	// where the model wants it), parseSpecial reads special-token text as
	// the special token.
	Tokenize(text string, addSpecial, parseSpecial bool) ([]int32, error)
	// TokenPiece is the text of one token (raw bytes: it may end inside
	// a UTF-8 character).
	TokenPiece(tok int32, special bool) (string, error)
	// IsEOG reports an end-of-generation token.
	IsEOG(tok int32) bool
	// ApplyChatTemplate renders msgs with the model's chat template
	// (ErrNoChatTemplate when the model has none).
	ApplyChatTemplate(msgs []Message, addAssistant bool) (string, error)
	Close()
}

// VocabLoader loads the vocabulary-only GGUF file at path.
type VocabLoader func(ctx context.Context, path string) (Vocab, error)

// vocabEntry is one model's vocabulary: loaded, being fetched (ready
// open) or failed.
type vocabEntry struct {
	ready chan struct{}
	v     Vocab
	// nLayer is the model's layer count as the verified vocabulary file
	// (or the caller's whole model file) gives it: the count to plan with.
	nLayer int
	err    error
}

// AddVocab makes v the vocabulary of model fp with nLayer layers (e.g.
// from a local model file the caller opened and fingerprinted: the
// digests' layer count), so Vocab fetches nothing; the client closes it.
// A model whose vocabulary the client already holds or is fetching keeps
// it (callers may be using it): AddVocab then returns ErrVocabHeld and v
// stays the caller's. The MaxVocabs bound applies.
func (c *Client) AddVocab(fp string, nLayer int, v Vocab) error {
	if nLayer <= 0 || nLayer > gguf.MaxLayers {
		return fmt.Errorf("client: model %.16s: layer count %d out of range", fp, nLayer)
	}
	e := &vocabEntry{ready: make(chan struct{}), v: v, nLayer: nLayer}
	close(e.ready)
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.vocabs[fp]; ok {
		return fmt.Errorf("%w: model %.16s", ErrVocabHeld, fp)
	}
	if len(c.vocabs) >= MaxVocabs {
		return fmt.Errorf("%w: the client holds the vocabularies of %d models, its limit", ErrTooManyModels, MaxVocabs)
	}
	c.vocabs[fp] = e
	return nil
}

// Vocab returns model fp's vocabulary: the one added or fetched before,
// else fetched once from a peer that advertises it and verified against
// the fingerprint. Concurrent callers share one fetch; a failed fetch is
// forgotten so a later call tries again.
func (c *Client) Vocab(ctx context.Context, fp string) (Vocab, error) {
	v, _, err := c.vocabOf(ctx, fp)
	return v, err
}

// canFetchVocab reports whether the client can fetch vocabularies (and so
// verify layer counts).
func (c *Client) canFetchVocab() bool { return c.cfg.Host != nil && c.cfg.LoadVocab != nil }

// vocabOf is Vocab and the model's verified layer count.
func (c *Client) vocabOf(ctx context.Context, fp string) (Vocab, int, error) {
	if !c.canFetchVocab() {
		return nil, 0, errors.New("client: Config needs Host and LoadVocab to fetch vocabularies")
	}
	c.mu.Lock()
	e, ok := c.vocabs[fp]
	if !ok {
		if len(c.vocabs) >= MaxVocabs {
			c.mu.Unlock()
			return nil, 0, fmt.Errorf("%w: the client holds the vocabularies of %d models, its limit", ErrTooManyModels, MaxVocabs)
		}
		e = &vocabEntry{ready: make(chan struct{})}
		c.vocabs[fp] = e
		c.wg.Add(1)
		go func() { defer c.wg.Done(); c.fetchVocab(fp, e) }()
	}
	c.mu.Unlock()
	select {
	case <-e.ready:
	case <-ctx.Done():
		return nil, 0, ctx.Err()
	}
	if e.err != nil {
		return nil, 0, e.err
	}
	return e.v, e.nLayer, nil
}

// heldLayers is the verified layer count of model fp if the client holds
// its vocabulary (0 otherwise); it fetches nothing.
func (c *Client) heldLayers(fp string) int {
	c.mu.Lock()
	e, ok := c.vocabs[fp]
	c.mu.Unlock()
	if !ok {
		return 0
	}
	select {
	case <-e.ready:
		if e.err == nil {
			return e.nLayer
		}
	default:
	}
	return 0
}

// fetchVocab fills e: the verified file of an earlier fetch in VocabDir,
// else the first verified download from up to MaxVocabSources peers
// advertising it (vocab.FetchFirst: the next peer is asked when one fails
// or after vocab.HedgeDelay, so a stalling peer costs seconds). It runs in the client's context (a
// caller that leaves does not cancel a fetch others wait for).
func (c *Client) fetchVocab(fp string, e *vocabEntry) {
	defer close(e.ready)
	e.v, e.nLayer, e.err = c.loadVocab(fp)
	if e.err == nil {
		return
	}
	c.mu.Lock()
	if c.vocabs[fp] == e {
		delete(c.vocabs, fp)
	}
	c.mu.Unlock()
}

func (c *Client) loadVocab(fp string) (Vocab, int, error) {
	ctx := c.ctx
	if path, nl := c.cachedVocab(ctx, fp); path != "" {
		if v, err := c.cfg.LoadVocab(ctx, path); err == nil {
			return v, nl, nil
		}
	}
	var peers []peer.ID
	for _, s := range c.vocabSources(fp) {
		if len(peers) < MaxVocabSources && !slices.Contains(peers, s.Peer) {
			peers = append(peers, s.Peer)
		}
	}
	if len(peers) == 0 {
		return nil, 0, fmt.Errorf("%w: no peer serving model %.16s offers its vocabulary", ErrNoVocab, fp)
	}
	var v Vocab
	var nl int
	_, err := vocab.FetchFirst(ctx, c.cfg.Host, peers, fp, c.cfg.VocabDir, func(path string, n int) error {
		// The file was verified against fp; n is the layer count its
		// digests prove.
		var err error
		v, err = c.cfg.LoadVocab(ctx, path)
		nl = n
		return err
	}, func(p peer.ID, err error) {
		// A peer that advertises the vocabulary and fails to give it is
		// asked last next time (and, for generate, in later runs).
		if c.cfg.Origin != nil && c.cfg.Origin.Failures != nil {
			c.log.Info("vocabulary source failed; avoiding it for a while", "peer", p, "err", err)
			c.cfg.Origin.Failures.Blame(p)
		}
	})
	if err != nil {
		return nil, 0, fmt.Errorf("%w: no peer serving model %.16s could give its vocabulary: %w", ErrNoVocab, fp, err)
	}
	return v, nl, nil
}

// cachedVocab is the path of a vocabulary fetched before into VocabDir,
// if it is still there and still belongs to model fp ("" otherwise), and
// the layer count it verifies.
func (c *Client) cachedVocab(ctx context.Context, fp string) (string, int) {
	if c.cfg.VocabDir == "" || !route.ValidFingerprint(fp) {
		return "", 0
	}
	path := filepath.Join(c.cfg.VocabDir, vocab.FileName(fp))
	if st, err := os.Stat(path); err != nil || !st.Mode().IsRegular() {
		return "", 0
	}
	nl, err := gguf.CheckVocabLayers(ctx, path, fp)
	if err != nil {
		c.log.Warn("cached vocabulary does not match its model; fetching it again", "file", path, "err", err)
		return "", 0
	}
	return path, nl
}
