// Package node composes a meshp2p node: the p2p host and discovery, an
// engine shard served to route sessions, the capability advert, the
// vocabulary service and the origin (route planning and generation).
package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	"github.com/libp2p/go-libp2p/core/protocol"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/fetch"
	"github.com/neuron-tai/meshp2p/metrics"
	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/placement"
	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
	"github.com/neuron-tai/meshp2p/session"
	"github.com/neuron-tai/meshp2p/status"
	"github.com/neuron-tai/meshp2p/vocab"
)

// Config configures a Node.
type Config struct {
	P2P p2p.Config
	// ModelPath is a whole GGUF model; with Layers, the node serves that
	// layer range (split into DataDir/shards on first start). It may also
	// be a shard file cut by `meshp2p shard split` (verified, served as is).
	// Empty: a client node that serves nothing.
	ModelPath string
	Layers    *gguf.Range // nil: all layers
	ModelName string      // advertised name (default: the file name without .gguf)
	Engine    engine.Config
	NoMmap    bool // read the weights instead of mapping them (engine.LoadOptions.NoMmap)
	Hop       session.HopConfig
	// DirectWait bounds how long a data-plane stream to a relayed peer
	// waits for a hole punch before starting on the relay (0: DirectWait;
	// negative: do not wait; the stream then moves once one succeeds).
	DirectWait time.Duration
	// Placement, if set (and Layers nil), makes the node choose and move
	// its own window (placement.go).
	Placement *PlacementConfig
	// SplitProgress, if set, reports shard splitting progress.
	SplitProgress func(done, total int64)
	// Fetch, with ModelPath empty, downloads only the tensors of Layers
	// from peers or a URL (node/fetch.go, docs/fetch.md).
	Fetch *FetchConfig
	// UploadLimit caps the bytes per second this node sends to peers
	// fetching tensors from it, over all of them (0: unlimited).
	UploadLimit int64
	// UploadLimitPerPeer caps what each fetching peer gets (0: unlimited).
	UploadLimitPerPeer int64
	Logger             *slog.Logger
	// Metrics, if set, is the process's registry: go-libp2p's, the hop's
	// and the origin's metrics and the node's gauges go there (observe.go).
	Metrics *metrics.Metrics
	// Recorder, if set, receives this node's routes and totals for its
	// status document (shared by `start --api`'s gateway peer and its
	// node); nil: a recorder of its own.
	Recorder *status.Recorder
}

// Node is a running meshp2p node.
type Node struct {
	cfg   Config
	log   *slog.Logger
	p2p   *p2p.Node
	host  *hostAdapter
	table *route.Table

	// mu guards model, shard, shardPath, calibration and the placement
	// fields below: a move swaps the served window.
	mu        sync.Mutex
	model     *engine.Model
	shard     *engine.Shard
	hop       *session.HopService
	fp        string
	nLayer    int
	shardPath string
	vocabPath string
	vocab     *vocab.Service
	manifest  []byte // the model's manifest, when this node has it
	fetchSrv  *fetch.Server
	// calibration is the decode time per row measured at start, the
	// advertised speed until live traffic refines it.
	calibration time.Duration
	recorder    *status.Recorder // totals and recent routes for the status document
	// placement is nil for a node given --layers; loading is a window
	// being loaded (advertised as planned), draining one being left.
	placement         *placementState
	loading, draining *gguf.Range
	moves             int
	lastWhy           string
	// failures is shared by every origin of this node (session.FailureMemory).
	failures *session.FailureMemory

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// Start brings a node up: host, discovery, and (with a model) the shard,
// its hop service and its advert.
func Start(ctx context.Context, cfg Config) (*Node, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.P2P.Logger == nil {
		cfg.P2P.Logger = cfg.Logger
	}
	if cfg.Hop.Logger == nil {
		cfg.Hop.Logger = cfg.Logger
	}
	if cfg.Engine.Logger == nil {
		cfg.Engine.Logger = cfg.Logger
	}
	if cfg.P2P.MemberAdvert == nil { // an open relay's members (--relay-service)
		cfg.P2P.MemberAdvert = route.MemberAdvert
	}
	n := &Node{log: cfg.Logger, table: route.NewTable(), failures: session.NewFailureMemory(0, 0)}
	cfg = n.observe(cfg)
	n.cfg = cfg
	var err error
	if cfg.ModelPath == "" && cfg.Fetch != nil {
		// Fetching needs the network first: peers are the sources.
		if n.p2p, err = p2p.New(ctx, cfg.P2P); err != nil {
			return nil, err
		}
		n.host = &hostAdapter{n: n.p2p, directWait: cfg.DirectWait}
		stop := n.followTable()
		path, err := n.fetchShard(ctx)
		stop()
		if err != nil {
			_ = n.p2p.Close()
			return nil, err
		}
		n.cfg.ModelPath, cfg.ModelPath = path, path
	}
	if !cfg.places() {
		cfg.Placement = nil
	}
	if cfg.ModelPath != "" && cfg.Placement == nil {
		if err := n.loadShard(ctx); err != nil {
			n.closeEngine()
			if n.p2p != nil {
				_ = n.p2p.Close()
			}
			return nil, err
		}
	}
	if n.p2p == nil {
		if n.p2p, err = p2p.New(ctx, cfg.P2P); err != nil {
			n.closeEngine()
			return nil, err
		}
	}
	n.host = &hostAdapter{n: n.p2p, directWait: cfg.DirectWait}
	n.table.Reach = func(p peer.ID) p2p.Path { return n.p2p.ConnStatus(p).Path }
	bg, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	n.wg.Add(1)
	go func() { defer n.wg.Done(); route.Follow(bg, n.p2p.Discovery(), n.table) }()
	n.wg.Add(1)
	go func() { defer n.wg.Done(); n.logConnEvents(bg) }()
	n.vocab = vocab.NewService(n.host, cfg.Hop.Limits, n.log)
	n.fetchSrv = fetch.NewServerLimits(n.host, cfg.UploadLimit, cfg.UploadLimitPerPeer, n.log)
	if n.shard != nil {
		if err := n.fetchSrv.Add(n.fp, n.shardPath, n.manifest); err != nil {
			n.Close()
			return nil, err
		}
		cfg.Hop.Fingerprint = n.fp
		n.hop = session.NewHopService(n.host, shardEngine{n.model, n.shard}, cfg.Hop)
		if n.vocabPath != "" {
			if err := n.vocab.Add(n.fp, n.vocabPath); err != nil {
				n.Close()
				return nil, err
			}
		}
		n.setLoading(nil) // a fetched window was advertised as planned while it came
		if err := n.publish(); err != nil {
			n.Close()
			return nil, err
		}
		n.wg.Add(1)
		go func() { defer n.wg.Done(); n.advertLoop(bg) }()
		if ps := n.placement; ps != nil && ps.fetched != nil {
			// A self-placing node that fetched its window (fetch.go)
			// rebalances like one with the whole file; a move fetches
			// the new window (fetchWindow).
			if n.manifest == nil {
				n.manifest = ps.fetched.m.Marshal()
			}
			ps.reb = placement.NewRebalancer(ps.sizing, ps.budget, ps.rng)
			n.wg.Add(1)
			go func() { defer n.wg.Done(); n.rebalanceLoop(bg) }()
		}
	} else if cfg.ModelPath != "" {
		if err := n.startPlaced(ctx, bg); err != nil {
			n.Close()
			return nil, err
		}
	}
	n.registerGauges()
	return n, nil
}

func (n *Node) loadShard(ctx context.Context) error {
	cfg := n.cfg
	dataDir := cfg.P2P.DataDir
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return err
	}
	f, err := gguf.Open(cfg.ModelPath)
	if err != nil {
		return err
	}
	nl, err := f.NLayer()
	si, shardErr := gguf.ReadShardInfo(f.Metadata)
	f.Close()
	if err != nil {
		return err
	}
	var path, fp string
	if shardErr == nil {
		// A pre-cut shard (meshp2p shard split): serve it as it is, after
		// checking its proof, so a machine needs only its own layers.
		if si, err = gguf.VerifyShard(ctx, cfg.ModelPath); err != nil {
			return fmt.Errorf("%s: %w", cfg.ModelPath, err)
		}
		if cfg.Layers != nil && *cfg.Layers != si.Range {
			return fmt.Errorf("%s holds layers %s, not --layers %s", cfg.ModelPath, si.Range, *cfg.Layers)
		}
		path, fp, nl = cfg.ModelPath, si.ParentFingerprint, si.ParentNLayer
		n.log.Info("serving a pre-cut shard", "path", path, "range", si.Range.String(), "model", fp)
		if m, err := gguf.ReadManifestFile(manifestPath(dataDir, fp), fp); err == nil {
			n.manifest = m.Marshal()
		}
	} else {
		r := gguf.Range{Start: 0, End: nl}
		if cfg.Layers != nil {
			r = *cfg.Layers
		}
		if path, fp, nl, err = prepareShard(ctx, dataDir, cfg.ModelPath, r, cfg.SplitProgress, n.log); err != nil {
			return err
		}
		// Peers that fetch only their layers verify against this.
		if n.manifest, err = ensureManifest(ctx, dataDir, cfg.ModelPath, fp); err != nil {
			return fmt.Errorf("manifest: %w", err)
		}
	}
	n.fp, n.nLayer, n.shardPath = fp, nl, path
	n.model, err = engine.LoadModel(ctx, path, engine.LoadOptions{NoMmap: cfg.NoMmap})
	if err != nil {
		return err
	}
	n.shard, err = engine.NewShard(ctx, n.model, cfg.Engine)
	if err != nil {
		return err
	}
	if n.calibration, err = n.shard.MeasureDecode(ctx, 8); err != nil {
		return fmt.Errorf("measuring decode speed: %w", err)
	}
	n.log.Info("shard ready", "range", fmt.Sprintf("%d-%d", n.shard.Info().Start, n.shard.Info().End),
		"decode_ms_per_token", float64(n.calibration.Microseconds())/1000)
	if n.model.Info().HasVocab {
		vp := filepath.Join(dataDir, "shards", fp[:16], "vocab.gguf")
		if err := os.MkdirAll(filepath.Dir(vp), 0o755); err != nil {
			return err
		}
		// A cached vocabulary is served to peers: check it belongs to this
		// model (a truncated write or a file swapped in the data dir would
		// otherwise be handed out); rewrite it when it does not.
		if _, err := os.Stat(vp); err == nil {
			if cerr := gguf.CheckVocab(ctx, vp, fp); cerr != nil {
				n.log.Warn("cached vocabulary does not match the model; rewriting it", "file", vp, "err", cerr)
				_ = os.Remove(vp)
			}
		}
		if _, err := os.Stat(vp); err != nil {
			if err := gguf.WriteVocab(ctx, path, vp); err != nil {
				return fmt.Errorf("write vocabulary: %w", err)
			}
		}
		n.vocabPath = vp
	}
	return nil
}

// ModelName is the advertised model name.
func (n *Node) ModelName() string {
	if n.cfg.ModelName != "" {
		return n.cfg.ModelName
	}
	if n.cfg.ModelPath == "" {
		return ""
	}
	b := filepath.Base(n.cfg.ModelPath)
	b = b[:len(b)-len(filepath.Ext(b))]
	// A shard file cut by `shard split` is named <model>.L<a>-<b>.gguf:
	// advertise the model's name, as the nodes holding the whole file do.
	if m := shardSuffix.FindStringSubmatch(b); m != nil {
		return m[1]
	}
	return b
}

var shardSuffix = regexp.MustCompile(`^(.+)\.L\d+-\d+$`)

// NameKey is the discovery key under which a model name is announced.
func NameKey(name string) string { return route.NameKey(name) }

func (n *Node) advertBody() ([]byte, error) {
	ca := &meshp2pb.CapabilityAdvert{
		PeerId: []byte(n.p2p.ID()), Network: n.cfg.P2P.Network, Roles: []meshp2pb.Role{meshp2pb.Role_ROLE_SHARD},
		Version: engine.Version,
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.shard != nil {
		info := n.shard.Info()
		c := n.shard.Capacity()
		sa := n.shardAdvert(info.Start, info.End, info.NEmbd, info.Arch)
		sa.Capacity = &meshp2pb.ShardCapacity{FreeSessions: uint32(c.FreeSessions), MaxSessions: uint32(c.MaxSessions),
			FreeKvTokens: uint64(c.FreeKV), NCtx: uint32(c.NCtx), NBatch: uint32(n.shard.Config().NBatch)}
		var msl float32
		if n.hop != nil {
			msl = n.hop.DecodeMsPerLayer()
		}
		if msl == 0 {
			msl = float32(float64(n.calibration.Microseconds()) / 1000 / float64(max(1, info.End-info.Start)))
		}
		sa.DecodeMsPerLayer = &msl
		ca.Shards = append(ca.Shards, sa)
	}
	if r := n.loading; r != nil {
		// A planned window: announced before it is loaded, with no session
		// slot, so planners skip it and placement counts it.
		embd, arch := n.modelShape()
		sa := n.shardAdvert(r.Start, r.End, embd, arch)
		sa.Capacity = &meshp2pb.ShardCapacity{}
		ca.Shards = append(ca.Shards, sa)
	}
	return proto.Marshal(ca)
}

func (n *Node) shardAdvert(start, end, nEmbd int, arch string) *meshp2pb.ShardAdvert {
	return &meshp2pb.ShardAdvert{
		ModelFingerprint: n.fp, ModelName: n.ModelName(), NLayer: uint32(n.nLayer),
		Start: uint32(start), End: uint32(end), WireDtypes: frame.WireDTypeList(),
		HasVocab: n.vocabPath != "", NEmbd: uint32(nEmbd), Arch: arch,
		Runtime: "llama.cpp@" + engine.LlamaCommit,
	}
}

func (n *Node) publish() error {
	body, err := n.advertBody()
	if err != nil {
		return err
	}
	keys := []string{n.fp}
	if name := n.ModelName(); name != "" {
		keys = append(keys, NameKey(name))
	}
	return n.p2p.Discovery().SetLocalAdvert(keys, body)
}

// advertLoop re-publishes when free capacity or measured speed changes
// (checked every AdvertCheckInterval).
func (n *Node) advertLoop(ctx context.Context) {
	t := time.NewTicker(AdvertCheckInterval)
	defer t.Stop()
	last := n.Shard().Capacity()
	lastSpeed := n.hop.DecodeMsPerLayer()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c, sp := n.Shard().Capacity(), n.hop.DecodeMsPerLayer()
			// Re-publish on capacity changes, or when the measured speed
			// moved by more than a quarter (the tracker's cost model).
			if c != last || math.Abs(float64(sp-lastSpeed)) > AdvertSpeedChange*float64(max(lastSpeed, 1e-6)) {
				last, lastSpeed = c, sp
				if err := n.publish(); err != nil {
					n.log.Warn("re-publish advert", "err", err)
				}
			}
		}
	}
}

// P2P returns the network node.
func (n *Node) P2P() *p2p.Node { return n.p2p }

// Table returns the capability table fed by discovery.
func (n *Node) Table() *route.Table { return n.table }

// Fingerprint of the served model ("" on a client).
func (n *Node) Fingerprint() string { return n.fp }

// Shard returns the served engine shard (nil on a client).
func (n *Node) Shard() *engine.Shard {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.shard
}

// Hop returns the hop service (nil on a client).
func (n *Node) Hop() *session.HopService { return n.hop }

// Origin returns an origin that plans over this node's table.
func (n *Node) Origin(planner route.Planner) *session.Origin {
	if planner == nil {
		planner = &route.LocalPlanner{Table: n.table}
	}
	// The origin's stream carries token ids one way and tokens the other:
	// it opens at once on any connection, relayed included, instead of
	// waiting for a hole punch as activation seams do.
	return &session.Origin{Dialer: n.ControlHost(), Planner: planner, Protocol: n.host.ProtocolID(session.ProtoSession, session.ProtoVersion),
		Limits: n.cfg.Hop.Limits, Logger: n.log, Failures: n.failures, Observer: n.originObserver(),
		Rediscover: func(ctx context.Context, fp string) {
			// A replacement may be known to a peer but not to us yet:
			// re-pull adverts from connected peers and ask the DHT.
			for ctx.Err() == nil {
				lctx, cancel := context.WithTimeout(ctx, LookupTimeout)
				n.p2p.Discovery().Sync(lctx)
				_, _ = n.p2p.Discovery().Lookup(lctx, fp)
				cancel()
				select {
				case <-ctx.Done():
				case <-time.After(RediscoverPause):
				}
			}
		}}
}

// Info is what node.json holds.
type Info struct {
	PeerID      string   `json:"peer_id"`
	Addrs       []string `json:"addrs"`
	Network     string   `json:"network"`
	Fingerprint string   `json:"fingerprint,omitempty"`
	Model       string   `json:"model,omitempty"`
	Start       int      `json:"start"`
	End         int      `json:"end"`
	NLayer      int      `json:"n_layer,omitempty"`
}

// Info describes the node (addresses include /p2p/<id>).
func (n *Node) Info() Info {
	in := Info{PeerID: n.p2p.ID().String(), Network: n.cfg.P2P.Network, Fingerprint: n.fp, Model: n.ModelName(), NLayer: n.nLayer}
	for _, a := range n.p2p.Addrs() {
		in.Addrs = append(in.Addrs, a.String())
	}
	if sh := n.Shard(); sh != nil {
		in.Start, in.End = sh.Info().Start, sh.Info().End
	}
	return in
}

// WriteInfo writes node.json into the data dir atomically.
func (n *Node) WriteInfo() (string, error) {
	b, err := json.MarshalIndent(n.Info(), "", "  ")
	if err != nil {
		return "", err
	}
	p := filepath.Join(n.cfg.P2P.DataDir, "node.json")
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return "", err
	}
	return p, os.Rename(tmp, p)
}

// Close withdraws the advert, ends sessions and stops everything.
func (n *Node) Close() error {
	if n.cancel != nil {
		n.cancel()
	}
	if n.hop != nil {
		n.hop.Close()
	}
	if n.vocab != nil {
		n.vocab.Close()
	}
	if n.fetchSrv != nil {
		n.fetchSrv.Close()
	}
	var errs []error
	if n.p2p != nil {
		errs = append(errs, n.p2p.Close())
	}
	n.wg.Wait()
	n.closeEngine()
	return errors.Join(errs...)
}

func (n *Node) closeEngine() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.shard != nil {
		n.shard.Close()
		n.shard = nil
	}
	if n.model != nil {
		n.model.Close()
		n.model = nil
	}
}

// hostAdapter gives the data plane the few host calls it needs.
type hostAdapter struct {
	n *p2p.Node
	// directWait overrides DirectWait (negative: do not wait).
	directWait time.Duration
}

func (h *hostAdapter) ID() peer.ID                           { return h.n.ID() }
func (h *hostAdapter) ProtocolID(name, v string) protocol.ID { return h.n.ProtocolID(name, v) }
func (h *hostAdapter) Peerstore() peerstore.Peerstore        { return h.n.Host().Peerstore() }
func (h *hostAdapter) Protect(p peer.ID, tag string)         { h.n.Protect(p, tag) }
func (h *hostAdapter) Unprotect(p peer.ID, tag string) bool  { return h.n.Unprotect(p, tag) }
func (h *hostAdapter) RemoveStreamHandler(pid protocol.ID)   { h.n.Host().RemoveStreamHandler(pid) }
func (h *hostAdapter) SetStreamHandler(pid protocol.ID, f network.StreamHandler) {
	h.n.Host().SetStreamHandler(pid, f)
}
func (h *hostAdapter) SubscribeConn(ctx context.Context) <-chan p2p.ConnEvent {
	return h.n.SubscribeConn(ctx)
}
func (h *hostAdapter) PathTo(p peer.ID) p2p.Path { return h.n.ConnStatus(p).Path }
func (h *hostAdapter) NewStream(ctx context.Context, p peer.ID, pids ...protocol.ID) (network.Stream, error) {
	// Data-plane streams live long: start them on the direct connection
	// when a hole punch is about to provide one.
	wait := h.directWait
	if wait == 0 {
		wait = DirectWait
	}
	return h.n.NewStreamPreferDirect(ctx, p, max(wait, 0), pids...)
}

// Host returns the data-plane view of the host (streams, protocol IDs).
// Its streams start on the direct connection when a hole punch is about to
// give one (activation seams live long and carry megabytes).
func (n *Node) Host() session.Host { return n.host }

// ControlHost is Host for small, latency-bound exchanges (the origin's
// session stream, vocabulary and advert fetches): its streams open at once
// on the best connection there is, a relayed one included.
func (n *Node) ControlHost() session.Host { return &hostAdapter{n: n.p2p, directWait: -1} }

// logConnEvents makes NAT traversal observable in the node's log: hole
// punches and their outcome, and a peer's path moving between relayed and
// direct.
func (n *Node) logConnEvents(ctx context.Context) {
	for ev := range n.p2p.SubscribeConn(ctx) {
		switch ev.Kind {
		case p2p.PathChanged:
			n.log.Info("peer path changed", "peer", ev.Peer, "path", ev.Status.Path.String())
		case p2p.HolePunchFinished:
			if ev.Success {
				n.log.Info("hole punch succeeded", "peer", ev.Peer, "attempts", ev.Status.HolePunch.Attempts)
			} else {
				n.log.Info("hole punch failed; staying relayed", "peer", ev.Peer, "err", ev.Error, "failures", ev.Status.HolePunch.Failures)
			}
		}
	}
}
