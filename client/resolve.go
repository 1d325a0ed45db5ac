package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/neuron-tai/meshp2p/route"
)

// Model is one model the swarm serves.
type Model struct {
	// ID names the model to users: its network name, or its fingerprint
	// when several models share the name (or it has none).
	ID          string
	Name        string
	Fingerprint string
	NLayer      int
	// Created is when this client first listed it (unix seconds).
	Created int64
	// Warmable: nobody serves it now, but peers (Offers of them)
	// offer to load it when it is asked for (a request gets a
	// *WarmingError meanwhile).
	Warmable bool
	Offers   int
	// Unavailable: a model this client listed as served has lost layers
	// MissingStart-MissingEnd (no known peer serves them now); a request
	// for it is refused at once with the gap (503 with Retry-After in the
	// API) until some peer serves them again.
	Unavailable              bool
	MissingStart, MissingEnd int
}

// Models lists every model whose layers the known peers cover (live or
// full), those that were and have lost a layer range (Unavailable), and
// those peers offer to load (Warmable), sorted by ID. A model that was
// never covered (a swarm still loading) is not listed.
func (c *Client) Models() []Model {
	byFP := map[string][]route.Shard{}
	for _, s := range c.cfg.Table.Shards("") {
		byFP[s.Fingerprint] = append(byFP[s.Fingerprint], s)
	}
	names := map[string]int{}
	var out []Model
	for fp, ss := range byFP {
		nl := c.heldLayers(fp) // verified, else the peers' vote (listing only)
		var err error
		if nl == 0 {
			nl, err = c.cfg.Table.LayerCount(fp)
		}
		if err != nil {
			continue
		}
		m := Model{Name: ss[0].ModelName, Fingerprint: fp, NLayer: nl}
		if start, end, covered := c.cfg.Table.Gap(fp, nl); !covered {
			if !c.listed(fp) {
				continue
			}
			m.Unavailable, m.MissingStart, m.MissingEnd = true, start, end
		}
		out = append(out, m)
		names[ss[0].ModelName]++
	}
	listed := map[string]bool{}
	for _, m := range out {
		listed[m.Fingerprint] = true
	}
	offered := map[string][]route.Offer{}
	for _, o := range c.cfg.Table.Offers("") {
		if !listed[o.Fingerprint] {
			offered[o.Fingerprint] = append(offered[o.Fingerprint], o)
		}
	}
	for fp, os := range offered {
		out = append(out, Model{Name: os[0].ModelName, Fingerprint: fp, NLayer: os[0].NLayer, Warmable: true, Offers: len(offersByPeer(os))})
		names[os[0].ModelName]++
	}
	now := time.Now().Unix()
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range out {
		m := &out[i]
		m.ID = m.Name
		if m.ID == "" || names[m.Name] > 1 {
			m.ID = m.Fingerprint
		}
		if m.Warmable {
			// Offers are anyone's claims: listed, not remembered (the
			// client's state grows only with models peers serve).
			m.Created = now
			if at, ok := c.created[m.Fingerprint]; ok {
				m.Created = at
			}
			continue
		}
		if _, ok := c.created[m.Fingerprint]; !ok {
			c.created[m.Fingerprint] = now
		}
		m.Created = c.created[m.Fingerprint]
	}
	slices.SortFunc(out, func(a, b Model) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// listed reports whether Models has listed fingerprint fp as served.
func (c *Client) listed(fp string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.created[fp]
	return ok
}

// modelOf is the Model the client lists for fingerprint fp (its ID as
// Models gives it), also for a model not covered now.
func (c *Client) modelOf(fp string, nl int) Model {
	for _, m := range c.Models() {
		if m.Fingerprint == fp {
			m.NLayer = nl
			return m
		}
	}
	m := Model{ID: fp, Fingerprint: fp, NLayer: nl}
	for _, s := range c.cfg.Table.Shards(fp) {
		if s.ModelName != "" {
			m.ID, m.Name = s.ModelName, s.ModelName
			break
		}
	}
	return m
}

// Resolve finds the model a user names (network name, fingerprint, or a
// unique fingerprint prefix of route.MinPrefix+ hex characters) and waits
// up to wait for peers that cover every layer (peers full now count: the
// origin waits for room). While it waits it re-pulls adverts from
// connected peers and asks the DHT every WaitLookupInterval. Errors:
// route.ErrAmbiguousModel at once; p2p.ErrNoPeers as soon as every
// bootstrap peer refused us for a reason waiting will not fix;
// ErrModelNotFound (naming what is served and the nearest name), or the
// *route.NoRouteError naming the layers nobody serves and who serves the
// rest, as soon as the swarm's adverts are in and nothing that could
// change them is under way (hopeless.go), else after the wait.
func (c *Client) Resolve(ctx context.Context, model string, wait time.Duration) (Model, error) {
	return c.resolve(ctx, model, wait, true)
}

// Lookup is Resolve for a server answering at once: it waits up to wait
// only for a model it does not know; a known model whose layers are not
// all served is reported at once (the *route.NoRouteError).
func (c *Client) Lookup(ctx context.Context, model string, wait time.Duration) (Model, error) {
	return c.resolve(ctx, model, wait, false)
}

func (c *Client) resolve(ctx context.Context, model string, wait time.Duration, untilRoutable bool) (Model, error) {
	m, _, err := c.resolveCounted(ctx, model, wait, untilRoutable)
	return m, err
}

// resolveCounted is resolve; counted reports that it counted the request
// as demand (request and refusal) because it waited for a warming model.
func (c *Client) resolveCounted(ctx context.Context, model string, wait time.Duration, untilRoutable bool) (_ Model, counted bool, _ error) {
	// final: an answer waiting will not change.
	final := func(err error) bool {
		return err == nil || errors.Is(err, route.ErrAmbiguousModel) || errors.Is(err, ErrModelNotFound) ||
			(!untilRoutable && !errors.Is(err, route.ErrUnknownModel))
	}
	m, err := c.routable(ctx, model)
	if final(err) {
		return m, false, err
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	sw, table := c.cfg.Swarm, c.cfg.Table
	key := route.NameKey(model)
	if route.ValidFingerprint(model) { // a fingerprint is its own key
		key = model
	}
	changed := table.Changed(ctx)
	lookup := time.NewTimer(0)
	defer lookup.Stop()
	alone := time.NewTicker(WaitUnreachableCheck)
	defer alone.Stop()
	var looking atomic.Bool
	// settled counts the checks that found the swarm's adverts in since
	// this wait began (hopeless.go); the second, a check later, also
	// finds the last pulled adverts in the table (route.Follow applies
	// them from discovery in a goroutine of its own).
	settled, since := 0, time.Now()
	lastErr := err
	warmed := false
	noteWarming := func(err error) {
		// A caller that waits for the route (generate) is demand too: it
		// is what makes an offering peer load the model. Counted once,
		// here (Generate then counts nothing more of it).
		var we *WarmingError
		if untilRoutable && !warmed && errors.As(err, &we) {
			warmed = true
			c.cfg.Demand.Request(we.Fingerprint)
			c.cfg.Demand.Refused(we.Fingerprint)
			c.log.Info("model is warming: a peer offers to load it; waiting for its route", "model", model, "peers", we.Peers, "wait", wait)
		}
	}
	noteWarming(err)
	for {
		select {
		case <-ctx.Done():
			return Model{}, warmed, c.waitFailed(ctx, model, wait, lastErr)
		case <-alone.C:
			if sw.Unreachable() {
				return Model{}, warmed, sw.NoPeersError()
			}
			if untilRoutable && sw.Discovery().Settle(since, SettleGap) {
				settled++
			}
		case <-changed:
		case <-lookup.C:
			c.lookupAsync(ctx, key, &looking)
			lookup.Reset(WaitLookupInterval)
		}
		m, err := c.routable(ctx, model)
		if final(err) {
			return m, warmed, err
		}
		if settled >= 2 {
			if herr := c.hopeless(model, err); herr != nil {
				return Model{}, warmed, herr
			}
		}
		noteWarming(err)
		lastErr = err
	}
}

// lookupAsync re-pulls adverts from connected peers and asks the DHT for
// key, in the background, unless the last such lookup still runs.
func (c *Client) lookupAsync(ctx context.Context, key string, looking *atomic.Bool) {
	if !looking.CompareAndSwap(false, true) {
		return
	}
	sw := c.cfg.Swarm
	go func() {
		defer looking.Store(false)
		lctx, cancel := context.WithTimeout(ctx, WaitLookupTimeout)
		defer cancel()
		sw.Discovery().Sync(lctx)
		_, _ = sw.Discovery().Lookup(lctx, key)
	}()
}

// routable resolves model in the table to a fingerprint, takes its layer
// count from the verified vocabulary (layerCount), and checks that some
// route covers every layer with shards of that count, full peers included.
func (c *Client) routable(ctx context.Context, model string) (Model, error) {
	fp, err := c.cfg.Table.Fingerprint(model)
	if err != nil {
		return Model{}, err
	}
	if !c.covered(fp) {
		// Nobody serves it, or not every layer: peers may offer
		// to load it (warming.go).
		if err, ok := c.warmingState(fp, model); ok {
			return Model{}, err
		}
	}
	nl, err := c.layerCount(ctx, fp)
	if err != nil {
		if errors.Is(err, ErrNoVocab) {
			// Covered only by the planned windows of peers switching to
			// it (they offer no vocabulary before it is loaded): warming.
			if werr, ok := c.warmingState(fp, model); ok {
				return Model{}, werr
			}
		}
		return Model{}, err
	}
	_, err = (&route.LocalPlanner{Table: c.cfg.Table}).Plan(ctx, route.Request{Fingerprint: fp, NLayer: nl})
	if err != nil && !errors.Is(err, route.ErrRouteFull) {
		return Model{}, c.withServed(fp, nl, err)
	}
	c.served(fp)
	return c.modelOf(fp, nl), nil
}

// covered reports whether the peers' shards of model fp cover every
// layer (by the layer count they vote for; full peers count).
func (c *Client) covered(fp string) bool {
	nl, err := c.cfg.Table.LayerCount(fp)
	return err == nil && c.cfg.Table.Covers(fp, nl)
}

// layerCount is model fp's layer count: the one its verified vocabulary
// gives (fetched once, Vocab), which the fingerprint binds, so no advert
// can change it. A client that cannot fetch vocabularies (a Config without
// Host, e.g. the status command) falls back to the peers' vote.
func (c *Client) layerCount(ctx context.Context, fp string) (int, error) {
	if !c.canFetchVocab() {
		if nl := c.heldLayers(fp); nl > 0 {
			return nl, nil
		}
		return c.cfg.Table.LayerCount(fp)
	}
	_, nl, err := c.vocabOf(ctx, fp)
	return nl, err
}

// waitFailed is Resolve's error when the wait ended: the caller's own
// context, no peers at all, an unknown model, or the layers nobody serves.
func (c *Client) waitFailed(ctx context.Context, model string, wait time.Duration, lastErr error) error {
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return ctx.Err()
	}
	sw := c.cfg.Swarm
	if err := sw.NoPeersError(); err != nil {
		return fmt.Errorf("after waiting %s: %w", wait, err)
	}
	if _, err := c.cfg.Table.Fingerprint(model); errors.Is(lastErr, route.ErrUnknownModel) && err != nil && !errors.Is(err, route.ErrAmbiguousModel) {
		return c.notFound(model, lastErr, " after waiting "+wait.String())
	}
	seen := fmt.Sprintf("connected to %d peer(s), %d advert(s) seen", sw.PeerCount(), len(sw.Discovery().Adverts()))
	if errors.Is(lastErr, route.ErrUnknownModel) {
		return fmt.Errorf("%w after waiting %s (%s): %w", ErrModelNotFound, wait, seen, lastErr)
	}
	if isWarming(lastErr) {
		return fmt.Errorf("after waiting %s: %w (loading a model takes seconds to minutes: wait longer)", wait, lastErr)
	}
	return fmt.Errorf("after waiting %s (%s): %w", wait, seen, lastErr)
}

// contextLimit is the longest session (KV cells) any route over ss could
// hold: per layer the largest advertised n_ctx of a shard covering it, the
// least of those over the layers (0: unknown).
func contextLimit(ss []route.Shard, nl int) int {
	limit := 0
	for l := 0; l < nl; l++ {
		best := 0
		for _, s := range ss {
			if s.NLayer == nl && s.Start <= l && l < s.End {
				best = max(best, int(s.Capacity.GetNCtx()))
			}
		}
		if best == 0 {
			return 0
		}
		if limit == 0 || best < limit {
			limit = best
		}
	}
	return limit
}
