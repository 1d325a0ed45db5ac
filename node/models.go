package node

import (
	"context"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/placement"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
)

// Many models on one node (issue 28, docs/placement.md "Many models"): a
// node started with several whole model files (Config.Models) serves a
// window of one of them at a time, advertises the others as offers
// ("can be warmed"), and switches to the model demand asks for
// (placement.ChooseModel over the swarm's gossiped demand, the adverts'
// shards and offers).

// catalogModel is one model a multi-model node can serve.
type catalogModel struct {
	path, name, fp string
	nLayer, nEmbd  int
	arch           string
	bytes          int64 // the whole model's weights
	sizing         placement.Sizing
}

// ErrModelTooBig: a model given to a node does not fit its memory budget
// (not even one layer).
var ErrModelTooBig = errors.New("model does not fit the memory budget")

// modelFileName is the name a whole model file is advertised under: its
// file name without .gguf.
func modelFileName(path string) string {
	b := filepath.Base(path)
	return b[:len(b)-len(filepath.Ext(b))]
}

// loadCatalog reads every model a node may serve (cfg.ModelPath first,
// then cfg.Models): fingerprint (cached), layer count, sizing. Two files
// of one model, or two models under one name, are refused.
func loadCatalog(ctx context.Context, cfg Config) ([]catalogModel, error) {
	paths := append([]string{cfg.ModelPath}, cfg.Models...)
	var out []catalogModel
	seenFP, seenName := map[string]string{}, map[string]string{}
	for _, p := range paths {
		fp, nl, err := modelFingerprint(ctx, cfg.P2P.DataDir, p, cfg.Logger)
		if err != nil {
			return nil, fmt.Errorf("model %s: %w", p, err)
		}
		sz, in, err := modelSizing(p, cfg.Engine)
		if err != nil {
			return nil, fmt.Errorf("model %s: %w", p, err)
		}
		name := modelFileName(p)
		if len(paths) == 1 && cfg.ModelName != "" {
			name = cfg.ModelName
		}
		if q, ok := seenFP[fp]; ok {
			return nil, fmt.Errorf("models %s and %s are the same model (fingerprint %.16s): give each model once", q, p, fp)
		}
		if q, ok := seenName[name]; ok {
			return nil, fmt.Errorf("models %s and %s would both be advertised as %q: rename one file", q, p, name)
		}
		seenFP[fp], seenName[name] = p, p
		bytes := sz.HeadBytes + sz.TailBytes
		for _, b := range sz.LayerBytes {
			bytes += b
		}
		out = append(out, catalogModel{path: p, name: name, fp: fp, nLayer: nl, nEmbd: in.NEmbd, arch: in.Architecture, bytes: bytes, sizing: sz})
	}
	return out, nil
}

// checkModels refuses what a node with several models cannot do: it
// chooses its own windows (Placement, a whole model file first, no
// Layers), offers at most route.MaxOffers models besides the served one,
// and a draft model belongs to one model's vocabulary.
func (c Config) checkModels() error {
	switch {
	case len(c.Models) == 0:
		return nil
	case !c.places():
		return errors.New("several models need automatic placement: whole model files (no shard file first) and no fixed layers")
	case len(c.Models) > route.MaxOffers:
		return fmt.Errorf("%d models: a node serves one and offers at most %d others", len(c.Models)+1, route.MaxOffers)
	case c.DraftPath != "":
		return errors.New("a draft model proposes for one model's vocabulary: not with several models")
	}
	return nil
}

// checkFits refuses a model of which the budget holds no window.
func checkFits(m catalogModel, budget int64, from string) error {
	if len(placement.Candidates(m.sizing, budget)) > 0 {
		return nil
	}
	nl := m.nLayer
	return fmt.Errorf("%w: model %s (%s): memory budget %s (%s) holds no layer of it: one layer needs at least %s; pass a larger --memory, or leave the model out",
		ErrModelTooBig, m.name, m.path, mib(budget), from, mib(m.sizing.Need(placement.Range{Start: nl / 2, End: nl/2 + 1})))
}

func distinctPeers(ss []route.Shard) int {
	ps := map[peer.ID]bool{}
	for _, s := range ss {
		ps[s.Peer] = true
	}
	return len(ps)
}

// routeDepth is how many routes the loaded windows of a model of nl
// layers make at most: the least number of loaded windows covering any
// one layer (a planned window, with no session slot, does not count).
func routeDepth(ss []route.Shard, nl int) int {
	if nl <= 0 {
		return 0
	}
	depth := make([]int, nl)
	for _, s := range ss {
		if s.NLayer != nl || s.Capacity.GetMaxSessions() == 0 {
			continue
		}
		for l := max(0, s.Start); l < min(nl, s.End); l++ {
			depth[l]++
		}
	}
	return slices.Min(depth)
}

// modelLoads are the catalog's models as placement.ChooseModel weighs
// them: the swarm's demand for each, the nodes on it (this one counted
// when it serves it), its routes, and how many nodes one route takes; and
// the standby peers (offering models, serving none).
func (c *placementController) modelLoads(ctx context.Context, now time.Time) ([]placement.ModelLoad, int) {
	dem := c.table.Demand(now)
	me := c.swarm.ID()
	st := c.set.now()
	cur, ownWindow, ownMs, serving, extras := st.fp, st.window, st.msPerLayer, st.serving, st.extras
	var loads []placement.ModelLoad
	for _, m := range c.models {
		d := dem[m.fp]
		if d.Requests > 0 {
			c.lastAsked[m.fp] = now
		}
		last, ok := c.lastAsked[m.fp]
		if !ok {
			last = c.started
		}
		shards := c.modelShards(m.fp, m.nLayer)
		alive := c.alive(ctx, shards)
		var live []route.Shard
		for _, s := range shards {
			if alive[s.Peer] {
				live = append(live, s)
			}
		}
		if m.fp == cur && serving {
			live = append(live, route.Shard{Peer: me, Fingerprint: m.fp, NLayer: m.nLayer, Start: ownWindow.Start, End: ownWindow.End,
				DecodeMsPerLayer: float32(ownMs), Capacity: &meshp2pb.ShardCapacity{MaxSessions: 1}})
		}
		if extras[m.fp] {
			live = append(live, route.Shard{Peer: me, Fingerprint: m.fp, NLayer: m.nLayer, Start: 0, End: m.nLayer,
				Capacity: &meshp2pb.ShardCapacity{MaxSessions: 1}})
		}
		perRoute := 1
		if c.budget > 0 {
			perRoute = max(1, int(math.Ceil(float64(m.bytes)/float64(c.budget))))
		}
		loads = append(loads, placement.ModelLoad{Fingerprint: m.fp, Bytes: m.bytes, Demand: d.Requests, Unmet: d.Unmet(),
			Nodes: distinctPeers(live), Routes: routeDepth(live, m.nLayer), NodesPerRoute: perRoute, IdleFor: now.Sub(last)})
	}
	// Standby peers: offering models, serving none.
	serves := map[peer.ID]bool{}
	for _, s := range c.table.Shards("") {
		serves[s.Peer] = true
	}
	standby := map[peer.ID]bool{}
	for _, o := range c.table.Offers("") {
		if !serves[o.Peer] && o.Peer != me {
			standby[o.Peer] = true
		}
	}
	return loads, len(standby)
}

// startCatalog takes a multi-model node's models (each must fit the
// budget, which came from budgetFrom) and returns the one it starts on:
// the one demand asks for, else the first.
func (c *placementController) startCatalog(ctx context.Context, cat []catalogModel, budgetFrom string) (catalogModel, error) {
	for _, m := range cat {
		if err := checkFits(m, c.budget, budgetFrom); err != nil {
			return catalogModel{}, err
		}
	}
	c.models = cat
	c.settle(ctx)
	m := c.firstModel(ctx)
	c.resize(m)
	c.log.Info("serving several models, one at a time", "models", len(cat), "first", m.name)
	return m, nil
}

// firstModel is the model a multi-model node starts on: the one
// ChooseModel sends a standby node to (with the choice's probability, so
// nodes starting together spread), else the first given.
func (c *placementController) firstModel(ctx context.Context) catalogModel {
	loads, standby := c.modelLoads(ctx, time.Now())
	ch := placement.ChooseModel("", loads, standby, c.cfg.ModelRules)
	if m, ok := c.catalogModel(ch.Target); ok && c.rng.Float64() < ch.Move {
		c.log.Info("placement: starting on the model demand asks for", "model", m.name, "why", ch.Why)
		return m
	}
	return c.models[0]
}

func (c *placementController) catalogModel(fp string) (catalogModel, bool) {
	for _, m := range c.models {
		if m.fp == fp {
			return m, true
		}
	}
	return catalogModel{}, false
}

// switchIntent is the window of another model a multi-model node is about
// to switch to, advertised as planned before the node drains its old one.
type switchIntent struct {
	m catalogModel
	r gguf.Range
}

// switchingTo is the model switch under way (nil: none).
func (c *placementController) switchingTo() *switchIntent {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.switching
}

func (c *placementController) setSwitching(sw *switchIntent) {
	c.mu.Lock()
	c.switching = sw
	c.mu.Unlock()
}

// pinnedNow reports whether the node holds the last route of a model
// still needed (it will not switch): its offers say so.
func (c *placementController) pinnedNow() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pinned
}

// checkModel is the cross-model part of a placement check: it switches
// the node to another of its models when placement.ChooseModel says so
// (with the choice's probability, so that nodes seeing one view do not
// all move at once). A model whose switch failed is left out for
// ModelRetryBackoff. It reports whether the node switched.
func (c *placementController) checkModel(ctx context.Context) bool {
	if len(c.models) < 2 || c.table == nil {
		return false
	}
	now := time.Now()
	cur := c.curFP()
	loads, standby := c.modelLoads(ctx, now)
	// Pinned: the node holds its model's last route while it is needed
	// (its offers say so).
	pinned := false
	for _, l := range loads {
		if l.Fingerprint == cur {
			pinned = l.Routes <= 1 && (l.Demand > 0 || l.IdleFor < c.cfg.ModelRules.IdleReleaseOrDefault())
		}
	}
	c.mu.Lock()
	pinChanged := c.pinned != pinned
	c.pinned = pinned
	c.mu.Unlock()
	if pinChanged {
		if err := c.publish(); err != nil {
			c.log.Warn("advertise offers", "err", err)
		}
	}
	if changed, handled := c.checkExtras(ctx, loads); changed || handled {
		return changed
	}
	extras := c.set.now().extras
	var candidates []placement.ModelLoad
	for _, l := range loads {
		if at, failed := c.failedAt[l.Fingerprint]; failed && now.Sub(at) < ModelRetryBackoff && l.Fingerprint != cur {
			continue
		}
		if extras[l.Fingerprint] {
			continue // served whole beside the node's own: not a switch target
		}
		candidates = append(candidates, l)
	}
	ch := placement.ChooseModel(cur, candidates, standby, c.cfg.ModelRules)
	c.mu.Lock()
	c.modelWhy = ch.Why
	c.mu.Unlock()
	m, ok := c.catalogModel(ch.Target)
	if !ok || ch.Target == cur {
		c.log.Debug("placement: staying on the model", "why", ch.Why)
		return false
	}
	if c.rng.Float64() >= ch.Move {
		c.log.Info("placement: another model needs nodes; leaving the move to others this time", "model", m.name, "p", ch.Move, "why", ch.Why)
		return false
	}
	c.log.Info("placement: switching model", "to", m.name, "why", ch.Why)
	if err := c.switchModel(ctx, m, loads); errors.Is(err, placement.ErrNoRoom) {
		c.log.Info("placement: not switching: an extra model here holds the last route of a model still asked for", "to", m.name, "err", err)
		return false
	} else if err != nil {
		c.failedAt[m.fp] = time.Now()
		c.log.Warn("placement: model switch failed; not trying this model again for a while", "to", m.name, "for", ModelRetryBackoff, "err", err)
		return false
	}
	delete(c.failedAt, m.fp)
	return true
}

// switchModel moves the node to model m: it chooses m's window as a
// starting node would (coverage first) and advertises it as planned, gets
// its shard file (cut, cached), and only then releases the window served
// now (its sessions finish, or are ended after DrainTimeout and re-routed
// by their origins), makes m the served model and loads the window. A
// switch that cannot get the file leaves the node where it is; one whose
// window does not load goes back to the old model and window.
func (c *placementController) switchModel(ctx context.Context, m catalogModel, loads []placement.ModelLoad) error {
	prev, _ := c.catalogModel(c.curFP())
	ex := c.extras(c.set.now())
	release, err := ex.RoomFor(m.fp, loads)
	if err != nil {
		return err
	}
	room := c.ownBudget()
	for _, fp := range release {
		room += ex.Need[fp]
	}
	ch, ok := placement.Choose(c.viewOf(ctx, m.fp, m.nLayer), m.sizing, room, 0, nil, c.rng)
	if !ok {
		return fmt.Errorf("%w: model %s", ErrModelTooBig, m.name)
	}
	r := gguf.Range{Start: ch.Range.Start, End: ch.Range.End}
	c.setSwitching(&switchIntent{m: m, r: r})
	if err := c.publish(); err != nil {
		c.log.Warn("advertise planned window", "err", err)
	}
	path, err := c.loader.cut(ctx, m.path, m.fp, r)
	if err == nil {
		err = c.loader.checkDevice(path)
	}
	if err != nil {
		c.setSwitching(nil)
		_ = c.publish()
		return err
	}
	for _, fp := range release {
		ended := c.set.releaseExtra(ctx, fp)
		c.moved()
		c.log.Info("placement: released an extra model to make room for the switch", "model", fp[:16], "sessions_ended_by_drain", ended)
	}
	from, oldPath, ended, released := c.set.releaseWindow(ctx)
	c.log.Info("placement: released the window of the old model", "model", prev.name, "range", from.String(), "sessions_ended_by_drain", ended)
	c.resize(m)
	c.set.setModel(ctx, m) // the vocabulary first: clients that see the window fetch it at once
	c.mu.Lock()
	c.switching, c.loading = nil, &r
	c.mu.Unlock()
	if err := c.publish(); err != nil {
		c.log.Warn("advertise planned window", "err", err)
	}
	ls, err := c.loader.load(ctx, path)
	if err == nil {
		if _, err = c.set.serveWindow(ctx, ls, c.firstServed); err != nil {
			ls.close()
		}
	}
	if err == nil {
		c.mu.Lock()
		c.moves++
		c.mu.Unlock()
		c.moved()
		c.log.Info("placement: serving the new model", "model", m.name, "range", r.String(), "why", choiceWhy(ch))
		return nil
	}
	// Back to what it served.
	c.resize(prev)
	c.set.setModel(ctx, prev)
	if released {
		back, lerr := c.loader.load(ctx, oldPath)
		if lerr == nil {
			if _, lerr = c.set.serveWindow(ctx, back, func(*gguf.Range) {}); lerr != nil {
				back.close()
			}
		}
		if lerr != nil {
			c.log.Error("placement: could not serve the old model's window again: serving nothing until the next check", "model", prev.name, "range", from.String(), "err", lerr)
		}
	}
	c.abandon()
	return err
}

func (c *placementController) curFP() string {
	return c.set.now().fp
}

// resize sets the controller's model: its sizing and shape, and a new
// rebalancer (the budget stays).
func (c *placementController) resize(m catalogModel) {
	c.mu.Lock()
	c.sizing, c.nEmbd, c.arch = m.sizing, m.nEmbd, m.arch
	c.mu.Unlock()
	c.reb = placement.NewRebalancer(m.sizing, c.ownBudget(), c.rng)
}

// warmWanted reports whether one of the node's models other than the one
// it serves is asked for and has no route: a standby's cue to check now.
func (c *placementController) warmWanted() bool {
	dem := c.table.Demand(time.Now())
	cur := c.curFP()
	for _, m := range c.models {
		if m.fp != cur && dem[m.fp].Requests > 0 && !c.table.Covers(m.fp, m.nLayer) {
			return true
		}
	}
	return false
}
