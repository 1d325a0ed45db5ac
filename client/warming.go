package client

import (
	"errors"
	"fmt"
	"time"

	"github.com/neuron-tai/meshp2p/demand"
	"github.com/neuron-tai/meshp2p/route"
)

// WarmingError: nobody serves the model now, but peers offer to load it
// (their adverts' offers) and it was first asked for less than the
// warming timeout ago. The request counts as demand, which makes an
// offering peer load it; retry after RetryAfter (an API answers 503 with
// Retry-After).
type WarmingError struct {
	Model       string // the model's id
	Fingerprint string
	// Peers offering to load it, Pinned of them holding the last route of
	// a model still asked for (they switch only once it is idle); Waited
	// since it was first asked for.
	Peers, Pinned int
	Waited        time.Duration
	Timeout       time.Duration
	RetryAfter    time.Duration
}

func (e *WarmingError) Error() string {
	why := fmt.Sprintf("%d peer(s) offer to load it", e.Peers)
	if e.Pinned == e.Peers {
		why += ", but each holds the last route of another model asked for recently and switches only once that one is idle (30 min)"
	}
	return fmt.Sprintf("model %s is warming: nobody serves it yet; %s (asked for %s ago; giving up after %s); retry in %s",
		e.Model, why, e.Waited.Round(time.Second), e.Timeout, e.RetryAfter)
}

// ErrWarmingGaveUp: peers offered to warm the model, but no route
// appeared within the warming timeout; their offers are not believed for
// the cooldown (so a liar cannot turn "not found" into endless retries).
// It wraps ErrModelNotFound.
var ErrWarmingGaveUp = fmt.Errorf("%w: warming gave up", ErrModelNotFound)

// warmingState answers a request for model fp (id: its name), which the
// swarm does not cover now: a *WarmingError while peers offer it and the
// timeout has not passed, ErrWarmingGaveUp after, ErrModelNotFound when
// nobody offers it. ok is false when the model is covered or nobody
// offers it: the caller goes on as before.
func (c *Client) warmingState(fp, id string) (err error, ok bool) {
	offers := c.cfg.Table.Offers(fp)
	if len(offers) == 0 {
		return nil, false
	}
	now := time.Now()
	peers, pinned := map[string]bool{}, map[string]bool{}
	for _, o := range offers {
		peers[o.Peer.String()] = true
		if o.Pinned {
			pinned[o.Peer.String()] = true
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	// The table's offers are the claims: signed adverts, at most
	// route.MaxOffers each; the tracker only remembers the asks.
	st, retry := c.warming.AskOffered(now, fp, false, true)
	cfg := c.warmCfg
	switch st {
	case demand.Warming:
		return &WarmingError{Model: id, Fingerprint: fp, Peers: len(peers), Pinned: len(pinned), Waited: c.warming.Waited(now, fp),
			Timeout: cfg.Timeout, RetryAfter: retry}, true
	case demand.GaveUp:
		return fmt.Errorf("%w: model %s: %d peer(s) offered to load it, but no route appeared within %s; not retried for %s",
			ErrWarmingGaveUp, id, len(peers), cfg.Timeout, cfg.Cooldown), true
	}
	return fmt.Errorf("%w: %s", ErrModelNotFound, id), true
}

// served tells the warming state that model fp has a route again.
func (c *Client) served(fp string) {
	c.mu.Lock()
	c.warming.AskOffered(time.Now(), fp, true, false)
	c.mu.Unlock()
}

func offersByPeer(os []route.Offer) map[string]bool {
	out := map[string]bool{}
	for _, o := range os {
		out[o.Peer.String()] = true
	}
	return out
}

// isWarming reports whether err is a WarmingError.
func isWarming(err error) bool {
	var we *WarmingError
	return errors.As(err, &we)
}
