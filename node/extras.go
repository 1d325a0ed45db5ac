package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/placement"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
)

// Extra models (docs/placement.md "Many models"): a multi-model node whose
// budget holds its own model whole and more serves other models of its
// catalog whole beside it, on the same hop, when they are asked for and
// short of routes; it releases one after it has had no demand for the
// idle release time (30 min). Its own model stays what placement moves and
// switches; an extra is never switched to, and all extras are released
// before a switch whose new model would not fit beside them.

// extraModel is one model served whole beside the node's own.
type extraModel struct {
	m        catalogModel
	ls       *loadedShard
	hasVocab bool
}

// extraPlan is a multi-model node's decision about extra models: the
// extras to release (no demand for idle), and the one model to load as an
// extra ("" none): asked for, fitting the spare memory, with no route and
// nobody loading it. Extras warm models; more routes of a model that has
// one come from ChooseModel's switches, whose hysteresis and spreading
// bound them (a liar's refusals cannot make every node load a copy). ownWhole: the node serves its own model whole (extras
// only beside a whole model, so its window never grows into their memory);
// spare is the budget left beside it and the extras; loads are the
// catalog's models (placement.ChooseModel's view); need is each model's
// whole-model memory; skip leaves a model out (one that failed lately).
func extraPlan(own string, ownWhole bool, spare int64, loads []placement.ModelLoad, extras map[string]bool, need map[string]int64,
	skip func(fp string) bool, idle time.Duration) (load string, release []string) {
	for _, l := range loads {
		if extras[l.Fingerprint] && l.Demand == 0 && l.IdleFor >= idle {
			release = append(release, l.Fingerprint)
			spare += need[l.Fingerprint]
		}
	}
	slices.Sort(release)
	if !ownWhole {
		return "", release
	}
	best, bestUnmet := "", -1.0
	for _, l := range loads {
		fp := l.Fingerprint
		if fp == own || extras[fp] || skip(fp) || l.Demand <= 0 || l.Routes > 0 || l.Nodes > 0 || need[fp] > spare {
			continue
		}
		if l.Unmet > bestUnmet || (l.Unmet == bestUnmet && fp < best) {
			best, bestUnmet = fp, l.Unmet
		}
	}
	return best, release
}

// extraFPs lists the fingerprints of the extras served now.
func (n *Node) extraFPs() map[string]bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := map[string]bool{}
	for fp := range n.extras {
		out[fp] = true
	}
	return out
}

// loadExtra serves model m whole beside the node's own: cut (cached),
// checked against the device, loaded, added to the hop, its vocabulary
// and tensors served, advertised.
func (n *Node) loadExtra(ctx context.Context, m catalogModel) error {
	r := gguf.Range{Start: 0, End: m.nLayer}
	path, err := n.loader.cut(ctx, m.path, m.fp, r)
	if err != nil {
		return err
	}
	ls, err := n.loader.load(ctx, path)
	if err != nil {
		return err
	}
	if err := n.hop.AddModel(m.fp, n.cfg.hopEngine(ls.engine())); err != nil {
		ls.close()
		return err
	}
	vp := n.loader.vocabFile(m.fp)
	hasVocab := false
	if err := writeVocab(ctx, m.path, vp, m.fp, n.log); err != nil {
		n.log.Warn("vocabulary of the extra model not served", "model", m.name, "err", err)
	} else if err := n.vocab.Add(m.fp, vp); err != nil {
		n.log.Warn("vocabulary of the extra model not served", "model", m.name, "err", err)
	} else {
		hasVocab = true
	}
	if mb, err := ensureManifest(ctx, n.cfg.P2P.DataDir, m.path, m.fp); err == nil {
		_ = n.fetchSrv.Add(m.fp, path, mb)
	}
	n.mu.Lock()
	if n.extras == nil {
		n.extras = map[string]*extraModel{}
	}
	n.extras[m.fp] = &extraModel{m: m, ls: ls, hasVocab: hasVocab}
	n.mu.Unlock()
	if err := n.publish(); err != nil {
		n.log.Warn("advertise the extra model", "err", err)
	}
	n.windowMoved()
	return nil
}

// releaseExtra stops serving extra model fp: it leaves the advert, its
// sessions drain (ended after DrainTimeout: their origins re-route), and
// it is closed. It returns how many sessions the drain ended.
func (n *Node) releaseExtra(ctx context.Context, fp string) int {
	n.mu.Lock()
	e := n.extras[fp]
	delete(n.extras, fp)
	n.mu.Unlock()
	if e == nil {
		return 0
	}
	// Everything registered for it goes with it: the vocabulary and the
	// tensors other nodes fetch (a released extra stayed served there).
	n.vocab.Remove(fp)
	n.fetchSrv.Remove(fp)
	if err := n.publish(); err != nil {
		n.log.Warn("advertise without the extra model", "err", err)
	}
	dctx, cancel := context.WithTimeout(ctx, DrainTimeout)
	ended := n.hop.DrainModel(dctx, fp, 0, e.m.nLayer)
	cancel()
	e.ls.close()
	n.windowMoved()
	return ended
}

// extraShardsLocked are the extras' shards for the advert (n.mu held).
func (n *Node) extraShardsLocked() []*meshp2pb.ShardAdvert {
	var out []*meshp2pb.ShardAdvert
	for _, fp := range sortedKeys(n.extras) {
		e := n.extras[fp]
		info := e.ls.shard.Info()
		c := e.ls.shard.Capacity()
		sa := n.shardAdvertOf(e.m.fp, e.m.name, e.m.nLayer, info.Start, info.End, info.NEmbd, info.Arch)
		sa.HasVocab = e.hasVocab
		sa.PlacementBudget = 0 // served whole, never moved by heal plans
		sa.Capacity = &meshp2pb.ShardCapacity{FreeSessions: uint32(c.FreeSessions), MaxSessions: uint32(c.MaxSessions),
			FreeKvTokens: uint64(c.FreeKV), NCtx: uint32(c.NCtx), NBatch: uint32(e.ls.shard.Config().NBatch)}
		msl := float32(float64(e.ls.calibration.Microseconds()) / 1000 / float64(max(1, info.End-info.Start)))
		sa.DecodeMsPerLayer = &msl
		out = append(out, sa)
	}
	return out
}

// extraCapacities is the extras' capacity now, for the advert loop's
// change check.
func (n *Node) extraCapacities() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	for _, fp := range sortedKeys(n.extras) {
		c := n.extras[fp].ls.shard.Capacity()
		out = append(out, fmt.Sprintf("%s:%d/%d:%d", fp[:8], c.FreeSessions, c.MaxSessions, c.FreeKV))
	}
	return out
}

// closeExtras closes every extra (the node is closing; the hop is closed).
func (n *Node) closeExtrasLocked() {
	for fp, e := range n.extras {
		e.ls.close()
		delete(n.extras, fp)
	}
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// checkExtras is the extra-model part of a multi-model node's check:
// release idle extras, load one asked-for model beside its own when the
// budget holds it. changed: it loaded or released one; handled: a model
// asked for fits beside this node's own (loaded now, or left to another
// offering node this time): no switch for it.
func (c *placementController) checkExtras(ctx context.Context, loads []placement.ModelLoad) (changed, handled bool) {
	cur, nl := c.node.servedModel()
	win, _, serving := c.node.servedWindow()
	own, ok := c.catalogModel(cur)
	if !ok {
		return false, false
	}
	extras := c.node.extraFPs()
	need := map[string]int64{}
	for _, m := range c.models {
		need[m.fp] = m.sizing.Need(placement.Range{Start: 0, End: m.nLayer})
	}
	spare := c.budget - need[cur]
	for fp := range extras {
		spare -= need[fp]
	}
	now := time.Now()
	skip := func(fp string) bool {
		at, failed := c.extraFailedAt[fp]
		return failed && now.Sub(at) < ModelRetryBackoff
	}
	whole := serving && win.Start == 0 && win.End == nl
	load, release := extraPlan(own.fp, whole, spare, loads, extras, need, skip, c.cfg.ModelRules.IdleReleaseOrDefault())
	for _, fp := range release {
		m, _ := c.catalogModel(fp)
		ended := c.node.releaseExtra(ctx, fp)
		c.log.Info("placement: released an idle extra model", "model", m.name, "idle_for_at_least", c.cfg.ModelRules.IdleReleaseOrDefault(), "sessions_ended_by_drain", ended)
	}
	if len(release) > 0 {
		c.extrasChanged()
	}
	if load == "" {
		return len(release) > 0, false
	}
	m, _ := c.catalogModel(load)
	// Every node offering the model sees the same view: each loads it
	// with probability 1/(its offerers), and the first advertises it
	// planned at once, so they do not all load it.
	offerers := map[string]bool{c.swarm.ID().String(): true}
	for _, o := range c.table.Offers(m.fp) {
		offerers[o.Peer.String()] = true
	}
	if p := 1 / float64(len(offerers)); c.rng.Float64() >= p {
		c.log.Debug("placement: another offering node may serve the model; not this time", "model", m.name, "p", p)
		return len(release) > 0, true
	}
	c.log.Info("placement: serving another model whole beside this one (the budget holds both)", "model", m.name, "spare", mib(spare))
	c.setSwitching(&switchIntent{m: m, r: gguf.Range{Start: 0, End: m.nLayer}})
	if err := c.node.publish(); err != nil {
		c.log.Warn("advertise the planned extra model", "err", err)
	}
	err := c.node.loadExtra(ctx, m)
	c.setSwitching(nil)
	if perr := c.node.publish(); perr != nil {
		c.log.Warn("advertise the extra model", "err", perr)
	}
	if err != nil {
		c.extraFailedAt[m.fp] = now
		c.log.Warn("placement: could not serve the extra model; not trying it again for a while", "model", m.name, "for", ModelRetryBackoff, "err", err)
		return len(release) > 0, true
	}
	c.extrasChanged()
	c.mu.Lock()
	c.moves++
	c.modelWhy = fmt.Sprintf("%.16s is asked for: served whole beside %.16s (%s spare)", m.fp, own.fp, mib(spare))
	c.mu.Unlock()
	return true, true
}

// extrasNeed is the memory the extras served now take.
func (c *placementController) extrasNeed() int64 {
	extras := c.node.extraFPs()
	var used int64
	for _, e := range c.models {
		if extras[e.fp] {
			used += e.sizing.Need(placement.Range{Start: 0, End: e.nLayer})
		}
	}
	return used
}

// ownBudget is the budget left to the node's own window beside its
// extras: what its rebalancer and moves may use.
func (c *placementController) ownBudget() int64 {
	if len(c.models) < 2 {
		return c.budget
	}
	return c.budget - c.extrasNeed()
}

// extrasChanged rebuilds the own window's rebalancer with the budget the
// extras leave it.
func (c *placementController) extrasChanged() {
	if c.reb != nil {
		c.reb = placement.NewRebalancer(c.sizing, c.ownBudget(), c.rng)
	}
}

// errNoRoom: a switch would need the memory of an extra that holds the
// last route of a model still needed.
var errNoRoom = errors.New("switch needs the memory of an extra model still asked for")

// roomFor lists the extras to release before switching to model m, whose
// whole window must fit beside the extras kept: the least recently asked
// for first, only as many as needed. It refuses (errNoRoom) when that
// would release the last route of a model asked for within the idle
// release time.
func (c *placementController) roomFor(m catalogModel, loads []placement.ModelLoad) ([]string, error) {
	extras := c.node.extraFPs()
	if len(extras) == 0 {
		return nil, nil
	}
	room := c.budget - c.extrasNeed()
	want := m.sizing.Need(placement.Range{Start: 0, End: m.nLayer})
	byFP := map[string]placement.ModelLoad{}
	for _, l := range loads {
		byFP[l.Fingerprint] = l
	}
	order := sortedKeys(extras)
	slices.SortStableFunc(order, func(a, b string) int { return cmp.Compare(byFP[b].IdleFor, byFP[a].IdleFor) })
	var release []string
	for _, fp := range order {
		if room >= want {
			break
		}
		l := byFP[fp]
		if l.Routes <= 1 && (l.Demand > 0 || l.IdleFor < c.cfg.ModelRules.IdleReleaseOrDefault()) {
			return nil, fmt.Errorf("%w: %.16s", errNoRoom, fp)
		}
		e, _ := c.catalogModel(fp)
		room += e.sizing.Need(placement.Range{Start: 0, End: e.nLayer})
		release = append(release, fp)
	}
	return release, nil
}

// extraRouteShards are the extras as this node's own shards (the status
// document: its own shards are not in its table).
func (n *Node) extraRouteShards() []route.Shard {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []route.Shard
	for _, fp := range sortedKeys(n.extras) {
		e := n.extras[fp]
		info := e.ls.shard.Info()
		c := e.ls.shard.Capacity()
		out = append(out, route.Shard{Peer: n.p2p.ID(), Fingerprint: fp, ModelName: e.m.name, Arch: info.Arch, NLayer: e.m.nLayer, NEmbd: info.NEmbd,
			Start: info.Start, End: info.End, HasVocab: e.hasVocab, KernelClass: n.cfg.Device.KernelClass(),
			Capacity: &meshp2pb.ShardCapacity{FreeSessions: uint32(c.FreeSessions), MaxSessions: uint32(c.MaxSessions), FreeKvTokens: uint64(c.FreeKV)}})
	}
	return out
}
