package node

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/placement"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
)

// Extra models (docs/placement.md "Many models"): what to serve beside the
// node's own model is decided by placement.Extras; this file carries the
// decisions out (load, release, advertise).

// extraModel is one model served whole beside the node's own.
type extraModel struct {
	m        catalogModel
	ls       *loadedShard
	hasVocab bool
}

// addExtra serves model m whole beside the own model: cut (cached),
// checked against the device, loaded, added to the hop, its vocabulary
// and tensors served, advertised.
func (s *served) addExtra(ctx context.Context, m catalogModel) error {
	path, err := s.loader.cut(ctx, m.path, m.fp, gguf.Range{Start: 0, End: m.nLayer})
	if err != nil {
		return err
	}
	ls, err := s.loader.load(ctx, path)
	if err != nil {
		return err
	}
	if err := s.hopService().AddModel(m.fp, s.wrap(ls.engine())); err != nil {
		ls.close()
		return err
	}
	vp := s.loader.vocabFile(m.fp)
	hasVocab := false
	if err := writeVocab(ctx, m.path, vp, m.fp, s.log); err != nil {
		s.log.Warn("vocabulary of the extra model not served", "model", m.name, "err", err)
	} else if err := s.vocab.Add(m.fp, vp); err != nil {
		s.log.Warn("vocabulary of the extra model not served", "model", m.name, "err", err)
	} else {
		hasVocab = true
	}
	if mb, err := ensureManifest(ctx, s.loader.dataDir, m.path, m.fp); err == nil {
		_ = s.fetch.Add(m.fp, path, mb)
	}
	s.mu.Lock()
	s.extras[m.fp] = &extraModel{m: m, ls: ls, hasVocab: hasVocab}
	s.mu.Unlock()
	s.advertise("advertise the extra model")
	return nil
}

// releaseExtra stops serving extra model fp: its vocabulary and tensors
// are no longer served, it leaves the advert, its sessions drain (ended
// after DrainTimeout: their origins re-route), and it is closed. It
// returns how many sessions the drain ended.
func (s *served) releaseExtra(ctx context.Context, fp string) int {
	s.mu.Lock()
	e, hop := s.extras[fp], s.hop
	delete(s.extras, fp)
	s.mu.Unlock()
	if e == nil {
		return 0
	}
	s.vocab.Remove(fp)
	s.fetch.Remove(fp)
	s.advertise("advertise without the extra model")
	dctx, cancel := context.WithTimeout(ctx, DrainTimeout)
	ended := hop.DrainModel(dctx, fp, 0, e.m.nLayer)
	cancel()
	e.ls.close()
	return ended
}

// extraShardsLocked are the extras' shards for the advert (mu held).
func (s *served) extraShardsLocked(pl *placementController) []*meshp2pb.ShardAdvert {
	var out []*meshp2pb.ShardAdvert
	for _, fp := range sortedKeys(s.extras) {
		e := s.extras[fp]
		info, c := e.ls.shard.Info(), e.ls.shard.Capacity()
		sa := s.shardAdvertLocked(pl, e.m.fp, e.m.name, e.m.nLayer, info)
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
func (s *served) extraCapacities() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, fp := range sortedKeys(s.extras) {
		c := s.extras[fp].ls.shard.Capacity()
		out = append(out, fmt.Sprintf("%s:%d/%d:%d", fp[:8], c.FreeSessions, c.MaxSessions, c.FreeKV))
	}
	return out
}

// extraRouteShardsLocked are the extras as this node's (self's) own
// shards, for the status document (mu held).
func (s *served) extraRouteShardsLocked(self peer.ID) []route.Shard {
	var out []route.Shard
	for _, fp := range sortedKeys(s.extras) {
		e := s.extras[fp]
		info, c := e.ls.shard.Info(), e.ls.shard.Capacity()
		out = append(out, route.Shard{Peer: self, Fingerprint: fp, ModelName: e.m.name, Arch: info.Arch, NLayer: e.m.nLayer, NEmbd: info.NEmbd,
			Start: info.Start, End: info.End, HasVocab: e.hasVocab, KernelClass: s.kernel,
			Capacity: &meshp2pb.ShardCapacity{FreeSessions: uint32(c.FreeSessions), MaxSessions: uint32(c.MaxSessions), FreeKvTokens: uint64(c.FreeKV)}})
	}
	return out
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
	st := c.set.now()
	own, ok := c.catalogModel(st.fp)
	if !ok {
		return false, false
	}
	now := time.Now()
	ex := c.extras(st)
	ex.OwnWhole = st.serving && st.window.Start == 0 && st.window.End == st.nLayer
	ex.Skip = func(fp string) bool {
		at, failed := c.extraFailedAt[fp]
		return failed && now.Sub(at) < ModelRetryBackoff
	}
	spare := ex.Spare()
	load, release := ex.Plan(loads)
	for _, fp := range release {
		m, _ := c.catalogModel(fp)
		ended := c.set.releaseExtra(ctx, fp)
		c.moved()
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
	if err := c.publish(); err != nil {
		c.log.Warn("advertise the planned extra model", "err", err)
	}
	err := c.set.addExtra(ctx, m)
	if err == nil {
		c.moved()
	}
	c.setSwitching(nil)
	if perr := c.publish(); perr != nil {
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

// extras is placement's view of this node's extra models (st: what it
// serves now).
func (c *placementController) extras(st servedNow) placement.Extras {
	need := map[string]int64{}
	for _, m := range c.models {
		need[m.fp] = m.sizing.Need(placement.Range{Start: 0, End: m.nLayer})
	}
	return placement.Extras{Own: st.fp, Budget: c.budget, Need: need, Served: st.extras, IdleRelease: c.cfg.ModelRules.IdleReleaseOrDefault()}
}

// ownBudget is the budget left to the node's own window beside its
// extras: what its rebalancer and moves may use.
func (c *placementController) ownBudget() int64 {
	if len(c.models) < 2 {
		return c.budget
	}
	return c.budget - c.extras(c.set.now()).Used()
}

// extrasChanged rebuilds the own window's rebalancer with the budget the
// extras leave it.
func (c *placementController) extrasChanged() {
	if c.reb != nil {
		c.reb = placement.NewRebalancer(c.sizing, c.ownBudget(), c.rng)
	}
}
