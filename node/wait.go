package node

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/route"
)

// WaitForModel resolves a model name, fingerprint or local model file to
// a fingerprint with a complete route, waiting up to wait for discovery
// (gossip, plus DHT lookups every WaitLookupInterval for late joiners).
func (n *Node) WaitForModel(ctx context.Context, model string, wait time.Duration) (string, int, error) {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	key := NameKey(model)
	if isHex(model) && len(model) == 64 {
		key = model
	}
	if st, err := os.Stat(model); err == nil && !st.IsDir() {
		f, err := gguf.Open(model)
		if err != nil {
			return "", 0, err
		}
		fp, err := gguf.Fingerprint(ctx, f)
		f.Close()
		if err != nil {
			return "", 0, err
		}
		key, model = fp, fp
	}
	changed := n.table.Changed()
	var lastErr error
	// Besides gossip, every few seconds: pull adverts again from connected
	// peers (a peer we connected to before it learnt of the model) and ask
	// the DHT for providers of the key.
	lookup := time.NewTimer(0)
	defer lookup.Stop()
	alone := time.NewTicker(WaitUnreachableCheck)
	defer alone.Stop()
	var looking atomic.Bool
	for {
		if fp, nl, err := n.table.Resolve(model); err == nil {
			_, perr := (&route.LocalPlanner{Table: n.table}).Plan(ctx, route.Request{Fingerprint: fp, NLayer: nl})
			if perr == nil {
				return fp, nl, nil
			}
			lastErr = perr
		} else {
			lastErr = err
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				if err := n.p2p.NoPeersError(); err != nil {
					return "", 0, fmt.Errorf("after waiting %s: %w", wait, err)
				}
				return "", 0, fmt.Errorf("after waiting %s (connected to %d peer(s), %d advert(s) seen): %w",
					wait, n.p2p.PeerCount(), len(n.p2p.Discovery().Adverts()), lastErr)
			}
			return "", 0, ctx.Err()
		case <-alone.C:
			// Every bootstrap peer refused us for a reason waiting will
			// not fix (wrong key, network or address): say so now.
			if n.p2p.Unreachable() {
				return "", 0, n.p2p.NoPeersError()
			}
		case <-changed:
		case <-lookup.C:
			if looking.CompareAndSwap(false, true) {
				go func() {
					defer looking.Store(false)
					lctx, c := context.WithTimeout(ctx, WaitLookupTimeout)
					defer c()
					n.p2p.Discovery().Sync(lctx)
					_, _ = n.p2p.Discovery().Lookup(lctx, key)
				}()
			}
			lookup.Reset(WaitLookupInterval)
		}
	}
}

func isHex(s string) bool {
	_, err := hex.DecodeString(s)
	return err == nil
}
