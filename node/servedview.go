package node

import (
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/node/shardengine"
	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
	"github.com/neuron-tai/meshp2p/session"
	"github.com/neuron-tai/meshp2p/status"
)

// What the served set says about itself: the advert's shards, offers and
// keys, node.json, the status document, the audits' engine. Each is one
// snapshot under served.mu.

// describe fills ca with what the node serves (its window, its extras),
// what it plans (pl's planned window or model switch; nil: a node without
// placement), its offers and, for a node that serves nothing and places
// nothing, the client role; it returns the discovery keys (the served
// models' fingerprints and names).
func (s *served) describe(ca *meshp2pb.CapabilityAdvert, pl *placementController) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var keys []string
	if s.own.fp != "" {
		keys = append(keys, s.own.fp)
		if s.own.name != "" {
			keys = append(keys, NameKey(s.own.name))
		}
	}
	ca.Offers = s.offersLocked(pl)
	if s.win == nil && pl == nil {
		ca.Roles = []meshp2pb.Role{meshp2pb.Role_ROLE_CLIENT}
	}
	if s.win != nil {
		sh := s.win.shard
		info, c := sh.Info(), sh.Capacity()
		sa := s.shardAdvertLocked(pl, s.own.fp, s.own.name, s.own.nLayer, info)
		sa.Capacity = &meshp2pb.ShardCapacity{FreeSessions: uint32(c.FreeSessions), MaxSessions: uint32(c.MaxSessions),
			FreeKvTokens: uint64(c.FreeKV), NCtx: uint32(c.NCtx), NBatch: uint32(sh.Config().NBatch)}
		var msl float32
		if s.hop != nil {
			msl = s.hop.DecodeMsPerLayer()
		}
		if msl == 0 {
			msl = float32(float64(s.win.calibration.Microseconds()) / 1000 / float64(max(1, info.End-info.Start)))
		}
		sa.DecodeMsPerLayer = &msl
		ca.Shards = append(ca.Shards, sa)
	}
	ca.Shards = append(ca.Shards, s.extraShardsLocked(pl)...)
	for _, fp := range sortedKeys(s.extras) {
		keys = append(keys, fp)
		if name := s.extras[fp].m.name; name != "" {
			keys = append(keys, NameKey(name))
		}
	}
	if pl == nil {
		return keys
	}
	if sw := pl.switchingTo(); sw != nil {
		// A multi-model node about to switch: the new model's window,
		// planned, before it drains the old one (models.go), so other
		// nodes count it and do not all switch too.
		sa := s.shardAdvertLocked(pl, sw.m.fp, sw.m.name, sw.m.nLayer, engine.ModelInfo{Start: sw.r.Start, End: sw.r.End, NEmbd: sw.m.nEmbd, Arch: sw.m.arch})
		sa.Capacity = &meshp2pb.ShardCapacity{}
		ca.Shards = append(ca.Shards, sa)
	}
	if r, embd, arch := pl.planned(); r != nil {
		// A planned window: announced before it is loaded, with no session
		// slot, so planners skip it and placement counts it.
		if s.win != nil {
			embd, arch = s.win.shard.Info().NEmbd, s.win.shard.Info().Arch
		}
		sa := s.shardAdvertLocked(pl, s.own.fp, s.own.name, s.own.nLayer, engine.ModelInfo{Start: r.Start, End: r.End, NEmbd: embd, Arch: arch})
		sa.Capacity = &meshp2pb.ShardCapacity{}
		ca.Shards = append(ca.Shards, sa)
	}
	return keys
}

// shardAdvertLocked is a shard of model fp (name, nl layers) with the
// range and shape of in (mu held). It offers a vocabulary only for the
// own model's, which is served: a model being switched to has none here
// yet, and a client that fetched it from this node got MODEL_MISMATCH
// (a 503 without Retry-After from the API while the model warmed).
func (s *served) shardAdvertLocked(pl *placementController, fp, name string, nl int, in engine.ModelInfo) *meshp2pb.ShardAdvert {
	return &meshp2pb.ShardAdvert{
		ModelFingerprint: fp, ModelName: name, NLayer: uint32(nl),
		Start: uint32(in.Start), End: uint32(in.End), WireDtypes: frame.WireDTypeList(),
		HasVocab: fp == s.own.fp && s.own.vocab != "", NEmbd: uint32(in.NEmbd), Arch: in.Arch,
		Runtime: "llama.cpp@" + engine.LlamaCommit, PlacementBudget: uint64(max(0, pl.advertisedBudget())),
		KernelClass: s.kernel,
	}
}

// offersLocked are the catalog's models other than the ones served now,
// for the advert (mu held).
func (s *served) offersLocked(pl *placementController) []*meshp2pb.ModelOffer {
	var out []*meshp2pb.ModelOffer
	for _, m := range s.catalog {
		if m.fp == s.own.fp || s.extras[m.fp] != nil || len(out) == route.MaxOffers {
			continue
		}
		out = append(out, &meshp2pb.ModelOffer{ModelFingerprint: m.fp, ModelName: m.name, NLayer: uint32(m.nLayer), Bytes: uint64(m.bytes),
			Pinned: pl != nil && pl.pinnedNow()})
	}
	return out
}

// info fills node.json's model fields: the own model and the extras'
// names.
func (s *served) info(in *Info) {
	s.mu.Lock()
	defer s.mu.Unlock()
	in.Fingerprint, in.Model, in.NLayer = s.own.fp, s.own.name, s.own.nLayer
	for _, fp := range sortedKeys(s.extras) {
		in.AlsoServes = append(in.AlsoServes, s.extras[fp].m.name)
	}
}

// status fills st's model and serving fields for the status document and
// returns the node's own shards (its window and extras, as peer self:
// its own shards are not in its table; none while no window is served).
func (s *served) status(self peer.ID, st *status.Self) []route.Shard {
	s.mu.Lock()
	defer s.mu.Unlock()
	st.Model, st.Fingerprint, st.NLayer = s.own.name, s.own.fp, s.own.nLayer
	if s.win == nil || s.hop == nil {
		return nil
	}
	c, info := s.win.shard.Capacity(), s.win.shard.Info()
	st.Sessions, st.MaxSessions, st.KVUsed, st.KVTotal = s.hop.Sessions(), c.MaxSessions, c.NCtx-c.FreeKV, c.NCtx
	st.MsPerLayer = s.hop.DecodeMsPerLayer()
	st.Start, st.End = info.Start, info.End
	own := route.Shard{Peer: self, Fingerprint: s.own.fp, ModelName: s.own.name, Arch: info.Arch, NLayer: s.own.nLayer,
		NEmbd: info.NEmbd, Start: info.Start, End: info.End, HasVocab: s.own.vocab != "", DecodeMsPerLayer: st.MsPerLayer,
		KernelClass: s.kernel}
	return append([]route.Shard{own}, s.extraRouteShardsLocked(self)...)
}

// placement is pl's state with the window served now (one snapshot: a
// swap's commit changes both under mu).
func (s *served) placement(pl *placementController) PlacementStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	var st PlacementStatus
	if pl != nil {
		st = pl.status()
	}
	if s.win != nil {
		st.Current = s.win.window()
	}
	return st
}

// engine is the window served now as an engine and its model's
// fingerprint (nil: none), the layers audits may replay with.
func (s *served) engine() (session.Engine, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.win == nil {
		return nil, ""
	}
	return shardengine.Engine{Model: s.win.model, Shard: s.win.shard}, s.own.fp
}

// catalogNames are the names of a multi-model node's models (nil for a
// node with one model).
func (s *served) catalogNames() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.catalog) < 2 {
		return nil
	}
	out := make([]string, len(s.catalog))
	for i, m := range s.catalog {
		out[i] = m.name
	}
	return out
}

// window is r as a status window (nil for nil).
func window(r *gguf.Range) *status.Window {
	if r == nil {
		return nil
	}
	return &status.Window{Start: r.Start, End: r.End}
}
