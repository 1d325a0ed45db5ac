package tracker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/route"
	"github.com/neuron-tai/meshp2p/vocab"
)

// ErrLayersUnverified: the tracker could not verify a model's layer count
// (no peer gave a vocabulary that proves it).
var ErrLayersUnverified = errors.New("tracker: model's layer count not verified")

// layerEntry is one model's verified layer count: being verified (ready
// open), verified, or failed (then forgotten, so a later request retries).
type layerEntry struct {
	ready chan struct{}
	n     int
	err   error
	used  time.Time
}

// layerCounts caches verified layer counts per fingerprint, at most
// MaxVerifiedModels (the least recently used goes).
type layerCounts struct {
	mu sync.Mutex
	m  map[string]*layerEntry
}

// layerCount is model fp's layer count as the model's vocabulary proves
// it (gguf.CheckVocabLayers: its per-layer digests hash to fp), fetched
// once from peers advertising it and cached; never a vote over adverts.
// It waits up to VerifyWait for a verification under way (which goes on
// in the background).
func (t *Tracker) layerCount(ctx context.Context, fp string) (int, error) {
	lc := &t.layers
	lc.mu.Lock()
	e, ok := lc.m[fp]
	if !ok {
		if len(lc.m) >= MaxVerifiedModels {
			var oldest string
			var at time.Time
			for k, v := range lc.m {
				select {
				case <-v.ready:
				default:
					continue // under way
				}
				if oldest == "" || v.used.Before(at) {
					oldest, at = k, v.used
				}
			}
			if oldest == "" {
				lc.mu.Unlock()
				return 0, fmt.Errorf("%w: %d verifications under way", ErrLayersUnverified, len(lc.m))
			}
			delete(lc.m, oldest)
		}
		e = &layerEntry{ready: make(chan struct{})}
		lc.m[fp] = e
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			defer close(e.ready)
			e.n, e.err = t.verifyLayers(t.bg, fp)
			if e.err != nil {
				lc.mu.Lock()
				if lc.m[fp] == e {
					delete(lc.m, fp)
				}
				lc.mu.Unlock()
			}
		}()
	}
	e.used = t.cfg.Now()
	lc.mu.Unlock()
	wait := time.NewTimer(VerifyWait)
	defer wait.Stop()
	select {
	case <-e.ready:
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-wait.C:
		return 0, fmt.Errorf("%w: verifying model %.16s, retry", errVerifying, fp)
	}
	return e.n, e.err
}

// errVerifying: a verification is under way (the request may retry).
var errVerifying = errors.New("tracker: verifying layer count")

// verifyLayers fetches model fp's vocabulary from up to MaxVocabSources
// peers advertising one (vocab.FetchFirst), verifies it and returns the
// layer count it proves; the file is not kept.
func (t *Tracker) verifyLayers(ctx context.Context, fp string) (int, error) {
	if t.cfg.VerifyLayers != nil {
		return t.cfg.VerifyLayers(ctx, fp)
	}
	if !route.ValidFingerprint(fp) {
		return 0, fmt.Errorf("%w: %q is not a model fingerprint", ErrLayersUnverified, fp)
	}
	var peers []peer.ID
	for _, s := range t.table.Shards(fp) {
		if s.HasVocab && len(peers) < MaxVocabSources && !slices.Contains(peers, s.Peer) {
			peers = append(peers, s.Peer)
		}
	}
	if len(peers) == 0 {
		return 0, fmt.Errorf("%w: no peer serving model %.16s offers its vocabulary", ErrLayersUnverified, fp)
	}
	dir, err := os.MkdirTemp(t.cfg.P2P.DataDir, "vocab-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	var n int
	_, err = vocab.FetchFirst(ctx, &p2p.StreamHost{N: t.p2p}, peers, fp, dir, func(_ string, nl int) error {
		n = nl // verified by FetchFirst (gguf.CheckVocabLayers)
		return nil
	}, nil)
	if err != nil {
		return 0, fmt.Errorf("%w: no peer serving model %.16s gave a vocabulary that proves it: %w", ErrLayersUnverified, fp, err)
	}
	t.log.Info("model layer count verified", "model", fp[:16], "n_layer", n)
	return n, nil
}
