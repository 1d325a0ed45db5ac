package node

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/multiformats/go-multiaddr"

	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/placement"
	"github.com/neuron-tai/meshp2p/route"
	"github.com/neuron-tai/meshp2p/session"
)

// PlacementConfig makes a node choose its own layers (start without
// --layers): it sizes its window from Memory and places and moves it by
// the rules in package placement (docs/placement.md).
type PlacementConfig struct {
	// Memory is the budget in bytes (0: placement.Budget, the available
	// RAM or cgroup room minus a reserve).
	Memory int64
	// Interval is the rebalance check period (DefaultRebalanceInterval),
	// jittered by ±RebalanceJitter.
	Interval time.Duration
	// Seed seeds the tie-breaks and jitter (0: random).
	Seed uint64
}

// Placement timings (docs/placement.md).
const (
	// DefaultRebalanceInterval is how often a node checks its window.
	DefaultRebalanceInterval = 2 * time.Minute
	// RebalanceJitter spreads the checks of nodes started together.
	RebalanceJitter = 0.25
	// PlacementSettle is how long a starting node waits to connect and
	// pull the swarm's adverts before choosing.
	PlacementSettle = 3 * time.Second
	// PlacementPause is the most a node waits between announcing its
	// choice and reconsidering it (random in [0, PlacementPause)), so
	// nodes starting together see each other's choices.
	PlacementPause = 2 * time.Second
	// DrainTimeout bounds how long a moving node lets sessions on its old
	// window finish before ending them (their origins re-route).
	DrainTimeout = 2 * time.Minute
	// LivenessDial bounds the dial that checks a peer we hold no
	// connection to before its adverts count (a crashed node's advert
	// lives until its TTL).
	LivenessDial = 2 * time.Second
	// LivenessDials is how many such dials run at once, and
	// MaxLivenessDials how many one check makes at most.
	LivenessDials    = 8
	MaxLivenessDials = 64
)

// PlacementStatus is what the node's placement is doing.
type PlacementStatus struct {
	Auto    bool
	Budget  int64
	Current gguf.Range
	// Moving is the window being left (draining), or the one being loaded
	// (Loading), during a move.
	Moving, Loading *gguf.Range
	Moves           int
	LastWhy         string
}

// places reports whether the node chooses its own window: Placement set,
// no Layers, and a whole model (a pre-cut shard holds fixed layers).
func (c Config) places() bool {
	if c.Placement == nil || c.Layers != nil || c.ModelPath == "" {
		return false
	}
	f, err := gguf.Open(c.ModelPath)
	if err != nil {
		return true // startPlaced reports it
	}
	defer f.Close()
	_, err = gguf.ReadShardInfo(f.Metadata)
	return err != nil
}

// placementState is the node's placement (nil without PlacementConfig).
type placementState struct {
	cfg    PlacementConfig
	sizing placement.Sizing
	budget int64
	rng    *rand.Rand
	reb    *placement.Rebalancer
	nEmbd  int
	arch   string
	// shardFor gets the shard file of a window: cut from the whole model
	// file (cutShard), or fetched from peers or a URL (fetchWindow).
	shardFor func(ctx context.Context, r gguf.Range) (string, error)
	// fetched is where a node without the model file fetches windows
	// from (nil for a node with the file).
	fetched *fetchedModel
}

// modelShape is n_embd and the architecture for a planned window's advert
// (n.mu held).
func (n *Node) modelShape() (int, string) {
	if n.shard != nil {
		return n.shard.Info().NEmbd, n.shard.Info().Arch
	}
	if n.placement != nil {
		return n.placement.nEmbd, n.placement.arch
	}
	return 0, ""
}

// ModelSizing sizes a whole GGUF model for engine config ec from its
// header (tensor types as stored): the input placement needs. A manifest
// of the same tensors gives the same Sizing (placement.FromTensors).
func ModelSizing(path string, ec engine.Config) (placement.Sizing, error) {
	sz, _, err := modelSizing(path, ec)
	return sz, err
}

func modelSizing(path string, ec engine.Config) (placement.Sizing, *gguf.Info, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return placement.Sizing{}, nil, err
	}
	defer f.Close()
	return fileSizing(f, ec)
}

// fileSizing is modelSizing from a parsed header (a fetch's manifest).
func fileSizing(f *gguf.File, ec engine.Config) (placement.Sizing, *gguf.Info, error) {
	in, err := f.Info()
	if err != nil {
		return placement.Sizing{}, nil, err
	}
	arch := f.Architecture()
	headDim := in.NEmbd / max(1, in.NHead)
	kdim, vdim := mdIntOr(f.Metadata, arch+".attention.key_length", headDim), mdIntOr(f.Metadata, arch+".attention.value_length", headDim)
	g := placement.Geometry{NLayer: in.NLayer, NEmbd: in.NEmbd, NHead: in.NHead, NFF: max(in.NFF, in.NFFExpert*in.NExpertUsed),
		NVocab: in.VocabSize, KVWidth: (kdim + vdim) * in.NHeadKV}
	ts := make([]placement.Tensor, len(f.Tensors))
	for i, t := range f.Tensors {
		ts[i] = placement.Tensor{Name: t.Name, Bytes: int64(t.Bytes)}
	}
	ec = withEngineDefaults(ec)
	sz, err := placement.FromTensors(g, ts, placement.EngineShape{NCtx: ec.NCtx, NBatch: ec.NBatch, FlashAttn: ec.FlashAttn})
	return sz, in, err
}

func mdIntOr(md gguf.Metadata, key string, def int) int {
	if v, ok := md.Uint(key); ok && v > 0 && v < 1<<20 {
		return int(v)
	}
	return def
}

// withEngineDefaults fills what engine.Config leaves to its defaults.
func withEngineDefaults(ec engine.Config) engine.Config {
	d := DefaultEngine()
	if ec.NCtx == 0 {
		ec.NCtx = d.NCtx
	}
	if ec.NBatch == 0 {
		ec.NBatch = d.NBatch
	}
	return ec
}

// startPlaced chooses a window, announces it, reconsiders after a random
// pause, loads it and starts serving and rebalancing.
func (n *Node) startPlaced(ctx, bg context.Context) error {
	cfg := n.cfg
	fp, nl, err := modelFingerprint(ctx, cfg.P2P.DataDir, cfg.ModelPath, n.log)
	if err != nil {
		return fmt.Errorf("placing layers: %w", err)
	}
	sz, in, err := modelSizing(cfg.ModelPath, cfg.Engine)
	if err != nil {
		return err
	}
	ps := &placementState{cfg: *cfg.Placement, sizing: sz, budget: cfg.Placement.Memory, nEmbd: in.NEmbd, arch: in.Architecture}
	ps.shardFor = n.cutShard
	src := "--memory"
	if ps.budget <= 0 {
		if ps.budget, src, err = placement.Budget(); err != nil {
			return err
		}
	}
	seed := ps.cfg.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	ps.rng = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	if len(placement.Candidates(sz, ps.budget)) == 0 {
		return fmt.Errorf("memory budget %s (%s) holds no layer of this model: one layer needs at least %s; pass a larger --memory or --layers",
			mib(ps.budget), src, mib(sz.Need(placement.Range{Start: nl / 2, End: nl/2 + 1})))
	}
	n.fp, n.nLayer, n.placement = fp, nl, ps
	n.log.Info("placing layers", "budget", mib(ps.budget), "budget_from", src, "n_layer", nl,
		"layers_that_fit", fmt.Sprintf("%d in the middle", sz.MaxWindow(nl/2, ps.budget)))
	n.settle(ctx)
	first, ok := placement.Choose(n.view(ctx), sz, ps.budget, 0, nil, ps.rng)
	if !ok {
		return errors.New("placing layers: no window fits the budget")
	}
	r, err := n.announceChoice(ctx, ps, first)
	if err != nil {
		return err
	}
	ls, err := n.loadRange(ctx, r)
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.model, n.shard, n.shardPath, n.calibration, n.loading = ls.model, ls.shard, ls.path, ls.calibration, nil
	n.mu.Unlock()
	n.cfg.Hop.Fingerprint = n.fp
	n.hop = newHop(n, ls)
	n.serveFetch(ctx, ls.path)
	// Every self-placing node holds the whole model file: it serves the
	// vocabulary whatever window it is on.
	vp := filepath.Join(cfg.P2P.DataDir, "shards", fp[:16], "vocab.gguf")
	if err := writeVocab(ctx, cfg.ModelPath, vp, fp); err == nil {
		if err := n.vocab.Add(fp, vp); err == nil {
			n.vocabPath = vp
		}
	} else {
		n.log.Warn("vocabulary not served", "err", err)
	}
	if err := n.publish(); err != nil {
		return err
	}
	ps.reb = placement.NewRebalancer(sz, ps.budget, ps.rng)
	n.wg.Add(2)
	go func() { defer n.wg.Done(); n.advertLoop(bg) }()
	go func() { defer n.wg.Done(); n.rebalanceLoop(bg) }()
	return nil
}

// announceChoice advertises the window first chose as planned (no
// session slot), waits a random part of PlacementPause, and reconsiders
// it against the swarm then, so that nodes starting together see each
// other's choices and spread; it returns the window to load (still
// advertised as planned until it is).
func (n *Node) announceChoice(ctx context.Context, ps *placementState, first placement.Choice) (gguf.Range, error) {
	r := gguf.Range{Start: first.Range.Start, End: first.Range.End}
	n.log.Info("placement: announcing", "range", r.String(), "why", choiceWhy(first))
	n.setLoading(&r)
	if err := n.publish(); err != nil {
		return r, err
	}
	select {
	case <-ctx.Done():
		return r, ctx.Err()
	case <-time.After(time.Duration(ps.rng.Int64N(int64(PlacementPause)))):
	}
	n.settle(ctx)
	if again, ok := placement.Choose(n.view(ctx), ps.sizing, ps.budget, 0, &first.Range, ps.rng); ok && again.Range != first.Range {
		r = gguf.Range{Start: again.Range.Start, End: again.Range.End}
		n.log.Info("placement: reconsidered after the pause", "range", r.String(), "why", choiceWhy(again))
		n.setLoading(&r)
		if err := n.publish(); err != nil {
			return r, err
		}
	}
	return r, nil
}

// loadedShard is one loaded layer window.
type loadedShard struct {
	model       *engine.Model
	shard       *engine.Shard
	path        string
	calibration time.Duration
}

func (ls *loadedShard) close() {
	ls.shard.Close()
	ls.model.Close()
}

// cutShard cuts (or finds cached) the shard for r from the whole model
// file.
func (n *Node) cutShard(ctx context.Context, r gguf.Range) (string, error) {
	path, fp, _, err := prepareShard(ctx, n.cfg.P2P.DataDir, n.cfg.ModelPath, r, n.cfg.SplitProgress, n.log)
	if err != nil {
		return "", err
	}
	if fp != n.fp {
		return "", fmt.Errorf("model file changed: fingerprint %.16s, serving %.16s", fp, n.fp)
	}
	return path, nil
}

// loadRange gets the shard for r (placementState.shardFor: cut from the
// whole file or fetched; cut for a node without placement), loads and
// calibrates it.
func (n *Node) loadRange(ctx context.Context, r gguf.Range) (*loadedShard, error) {
	shardFor := n.cutShard
	if ps := n.placement; ps != nil && ps.shardFor != nil {
		shardFor = ps.shardFor
	}
	path, err := shardFor(ctx, r)
	if err != nil {
		return nil, err
	}
	ls := &loadedShard{path: path}
	if ls.model, err = engine.LoadModel(ctx, path, engine.LoadOptions{NoMmap: n.cfg.NoMmap}); err != nil {
		return nil, err
	}
	if ls.shard, err = engine.NewShard(ctx, ls.model, n.cfg.Engine); err != nil {
		ls.model.Close()
		return nil, err
	}
	if ls.calibration, err = ls.shard.MeasureDecode(ctx, 8); err != nil {
		ls.close()
		return nil, fmt.Errorf("measuring decode speed: %w", err)
	}
	n.log.Info("shard ready", "range", r.String(), "decode_ms_per_token", float64(ls.calibration.Microseconds())/1000)
	return ls, nil
}

func newHop(n *Node, ls *loadedShard) *session.HopService {
	return session.NewHopService(n.host, shardEngine{ls.model, ls.shard}, n.cfg.Hop)
}

// writeVocab writes (once, checked when cached) the vocabulary of the
// model at path to vp.
func writeVocab(ctx context.Context, path, vp, fp string) error {
	if err := os.MkdirAll(filepath.Dir(vp), 0o755); err != nil {
		return err
	}
	if _, err := os.Stat(vp); err == nil {
		if gguf.CheckVocab(ctx, vp, fp) == nil {
			return nil
		}
		_ = os.Remove(vp)
	}
	return gguf.WriteVocab(ctx, path, vp)
}

// settle waits (up to PlacementSettle, not at all without bootstrap
// peers) until the node holds some peer's advert, pulling from connected
// peers meanwhile (a pull right after connecting can precede identify).
func (n *Node) settle(ctx context.Context) {
	if len(n.cfg.P2P.Bootstrap) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, PlacementSettle)
	defer cancel()
	for ctx.Err() == nil {
		if n.p2p.PeerCount() > 0 {
			n.p2p.Discovery().Sync(ctx)
			for _, a := range n.p2p.Discovery().Adverts() {
				if a.Peer != n.p2p.ID() {
					return
				}
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// view is the swarm for this node's model, from the adverts discovery
// holds now (not the route table, which follows them asynchronously):
// every other peer's windows, a peer we hold no connection to counted only
// if a short dial reaches it (a crashed node's advert outlives it by up to
// its TTL). Dials run LivenessDials at a time, at most MaxLivenessDials
// per check (peers beyond that count as gone until a later check).
func (n *Node) view(ctx context.Context) placement.View {
	v := placement.View{NLayer: n.nLayer}
	me := n.p2p.ID()
	var shards []route.Shard
	for _, a := range n.p2p.Discovery().Adverts() {
		if a.Peer == me {
			continue
		}
		ss, err := route.DecodeAdvert(a)
		if err != nil {
			continue
		}
		for _, s := range ss {
			if s.Fingerprint == n.fp && s.NLayer == n.nLayer {
				shards = append(shards, s)
			}
		}
	}
	alive := map[peer.ID]bool{}
	dials := 0
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, LivenessDials)
	for _, s := range shards {
		connected := n.p2p.ConnStatus(s.Peer).Path != p2p.PathNone
		mu.Lock()
		_, seen := alive[s.Peer]
		if !seen {
			alive[s.Peer] = connected
		}
		mu.Unlock()
		if seen || connected {
			continue
		}
		if dials++; dials > MaxLivenessDials {
			continue // counted as gone this check: adverts cannot make a check dial without end
		}
		wg.Add(1)
		sem <- struct{}{}
		go func(p peer.ID) {
			defer func() { <-sem; wg.Done() }()
			ok := n.reachable(ctx, p)
			mu.Lock()
			alive[p] = ok
			mu.Unlock()
		}(s.Peer)
	}
	wg.Wait()
	for _, s := range shards {
		if !alive[s.Peer] {
			continue
		}
		v.Servers = append(v.Servers, placement.Server{Peer: s.Peer.String(), Range: placement.Range{Start: s.Start, End: s.End},
			MsPerLayer: float64(s.DecodeMsPerLayer), Relayed: relayedOnly(s.Addrs), Planned: s.Capacity.GetMaxSessions() == 0})
	}
	return v
}

func (n *Node) reachable(ctx context.Context, p peer.ID) bool {
	if n.p2p.ConnStatus(p).Path != p2p.PathNone {
		return true
	}
	dctx, cancel := context.WithTimeout(ctx, LivenessDial)
	defer cancel()
	return n.p2p.Host().Connect(dctx, peer.AddrInfo{ID: p}) == nil
}

// relayedOnly: every address the peer advertises is a relay circuit (the
// same for every observer, so all nodes weigh it alike).
func relayedOnly(addrs []multiaddr.Multiaddr) bool {
	if len(addrs) == 0 {
		return false
	}
	for _, a := range addrs {
		if !strings.Contains(a.String(), "/p2p-circuit") {
			return false
		}
	}
	return true
}

func (n *Node) setLoading(r *gguf.Range) {
	n.mu.Lock()
	n.loading = r
	n.mu.Unlock()
}

// rebalanceLoop runs a placement check every jittered interval.
func (n *Node) rebalanceLoop(ctx context.Context) {
	ps := n.placement
	iv := n.RebalanceInterval()
	for {
		d := time.Duration(float64(iv) * (1 - RebalanceJitter + 2*RebalanceJitter*ps.rng.Float64()))
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
		cur := n.Info()
		ms := float64(n.hop.DecodeMsPerLayer())
		if ms == 0 {
			ms = float64(n.calibrationPerLayer())
		}
		dec := ps.reb.Check(n.view(ctx), n.p2p.ID().String(), placement.Range{Start: cur.Start, End: cur.End}, ms)
		n.mu.Lock()
		n.lastWhy = dec.Why
		n.mu.Unlock()
		if !dec.Move {
			n.log.Debug("placement check: staying", "range", fmt.Sprintf("%d-%d", cur.Start, cur.End), "why", dec.Why)
			continue
		}
		n.log.Info("placement: moving", "from", fmt.Sprintf("%d-%d", cur.Start, cur.End), "to", dec.To.String(), "reason", string(dec.Reason), "why", dec.Why)
		if err := n.move(ctx, gguf.Range{Start: dec.To.Start, End: dec.To.End}); err != nil {
			n.log.Warn("placement: move failed; staying", "to", dec.To.String(), "err", err)
		}
	}
}

// move is graceful: announce and load the new window, add it to the hop,
// advertise it, stop admitting on the old window, let its sessions finish
// (or end them after DrainTimeout so their origins re-route), release it.
func (n *Node) move(ctx context.Context, to gguf.Range) error {
	n.setLoading(&to)
	if err := n.publish(); err != nil {
		n.log.Warn("advertise planned window", "err", err)
	}
	ls, err := n.loadRange(ctx, to)
	if err != nil {
		n.setLoading(nil)
		_ = n.publish()
		return err
	}
	if err := n.hop.AddEngine(shardEngine{ls.model, ls.shard}); err != nil {
		ls.close()
		n.setLoading(nil)
		_ = n.publish()
		return err
	}
	n.mu.Lock()
	old := &loadedShard{model: n.model, shard: n.shard, path: n.shardPath, calibration: n.calibration}
	from := gguf.Range{Start: n.shard.Info().Start, End: n.shard.Info().End}
	n.model, n.shard, n.shardPath, n.calibration = ls.model, ls.shard, ls.path, ls.calibration
	n.loading, n.draining = nil, &from
	n.moves++
	n.mu.Unlock()
	n.hop.StopAdmitting(from.Start, from.End)
	n.serveFetch(ctx, ls.path)
	n.serveVocabOf(ctx, ls)
	if err := n.publish(); err != nil {
		n.log.Warn("advertise new window", "err", err)
	}
	dctx, cancel := context.WithTimeout(ctx, DrainTimeout)
	ended := n.hop.Drain(dctx, from.Start, from.End)
	cancel()
	old.close()
	n.mu.Lock()
	n.draining = nil
	n.mu.Unlock()
	n.log.Info("placement: moved", "from", from.String(), "to", to.String(), "sessions_ended_by_drain", ended)
	if _, err := n.WriteInfo(); err != nil {
		n.log.Warn("write node info", "err", err)
	}
	return nil
}

// serveVocabOf starts serving the vocabulary of a fetched node that had
// none (its first window was a middle one, which carries no tokenizer)
// once it loads a window that has it. A node that serves one keeps it
// whatever window it moves to.
func (n *Node) serveVocabOf(ctx context.Context, ls *loadedShard) {
	n.mu.Lock()
	have := n.vocabPath != ""
	n.mu.Unlock()
	if have || !ls.model.Info().HasVocab {
		return
	}
	vp := filepath.Join(n.cfg.P2P.DataDir, "shards", n.fp[:16], "vocab.gguf")
	if err := writeVocab(ctx, ls.path, vp, n.fp); err != nil {
		n.log.Warn("vocabulary not served", "err", err)
		return
	}
	if err := n.vocab.Add(n.fp, vp); err != nil {
		n.log.Warn("vocabulary not served", "err", err)
		return
	}
	n.mu.Lock()
	n.vocabPath = vp
	n.mu.Unlock()
	n.log.Info("serving the vocabulary of the new window", "file", vp)
}

func (n *Node) calibrationPerLayer() float32 {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.shard == nil {
		return 0
	}
	i := n.shard.Info()
	return float32(float64(n.calibration.Microseconds()) / 1000 / float64(max(1, i.End-i.Start)))
}

// Placement reports what automatic placement is doing (Auto false when
// the node was given --layers).
func (n *Node) Placement() PlacementStatus {
	n.mu.Lock()
	defer n.mu.Unlock()
	st := PlacementStatus{Auto: n.placement != nil, Moves: n.moves, LastWhy: n.lastWhy, Loading: n.loading, Moving: n.draining}
	if n.placement != nil {
		st.Budget = n.placement.budget
	}
	if n.shard != nil {
		st.Current = gguf.Range{Start: n.shard.Info().Start, End: n.shard.Info().End}
	}
	return st
}

// RebalanceInterval is the period of the placement checks (0 without
// placement).
func (n *Node) RebalanceInterval() time.Duration {
	if n.placement == nil {
		return 0
	}
	if iv := n.placement.cfg.Interval; iv > 0 {
		return iv
	}
	return DefaultRebalanceInterval
}

func choiceWhy(c placement.Choice) string {
	return fmt.Sprintf("layers missing from the best route %d → %d; weakest layer %.3g → %.3g tokens/s", c.DeficitBefore, c.Deficit, c.WeakestBefore, c.Weakest)
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
