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
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/demand"
	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/metrics"
	"github.com/neuron-tai/meshp2p/node/cpushare"
	"github.com/neuron-tai/meshp2p/node/shardengine"
	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/route"
	"github.com/neuron-tai/meshp2p/session"
	"github.com/neuron-tai/meshp2p/status"
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
	// Models are more whole model files the node may serve instead of
	// ModelPath's (start --model a.gguf,b.gguf or a directory; needs
	// Placement): it serves a window of one model at a time, offers the
	// others to the swarm and switches to the one demand asks for
	// (models.go, docs/placement.md "Many models").
	Models []string
	// DemandInterval is how often the node gossips the demand its origins
	// measured (DefaultDemandInterval).
	DemandInterval time.Duration
	// AdvertCheckInterval is how often the node compares its capacity and
	// speed with its advert (0: AdvertCheckInterval); a session's end
	// re-checks at once as well (advert.go).
	AdvertCheckInterval time.Duration
	ModelName           string // advertised name (default: the file name without .gguf)
	Engine              engine.Config
	// ThreadShare, with Engine.Threads 0, sizes the served windows'
	// compute threads as this process's share of the machine
	// (cpushare.Member.Threads), re-checked every ThreadShareInterval
	// (default 30 s) and applied between decodes. nil: Engine.Threads
	// (0: every CPU).
	ThreadShare         *cpushare.Member
	ThreadShareInterval time.Duration
	NoMmap              bool // read the weights instead of mapping them (engine.LoadOptions.NoMmap)
	// Device runs the served layers (engine.SelectDevice; the zero
	// Device: the CPU). It sets the kernel class the node advertises and,
	// for a GPU, the default placement budget (its free memory).
	Device engine.Device
	Hop    session.HopConfig
	// DraftPath, if set, is a small whole model with the model's
	// vocabulary that proposes tokens for the speculative sessions this
	// node heads and that ask for a draft (--speculative draft); checked
	// against the model's vocabulary at start (shardengine.ErrDraftVocab).
	DraftPath string
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
	// Failures, if set, is the memory of blamed peers this node's origins
	// share (a CLI client restores it from, and saves it to, its failure
	// file: internal/failfile); nil: one of the node's own.
	Failures *session.FailureMemory
	// AuditRate is the share of this node's origins' generations they
	// audit (docs/trust.md; 0: no audits, and sessions ask hops for no
	// transcripts). AuditModels are whole model files the origins may
	// replay hops with, besides ModelPath and the node's own window.
	// OnAudit, if set, sees every audit's report (proofs to save).
	AuditRate   float64
	AuditModels []string
	OnAudit     func(session.AuditReport)
	// WrapEngine, if set, wraps the engine the hop serves through. For
	// tests only: hostile hops (wrong activations) that audits must catch.
	WrapEngine func(session.Engine) session.Engine
}

// hopEngine is what the hop serves through: e, wrapped by WrapEngine.
func (c *Config) hopEngine(e session.Engine) session.Engine {
	if c.WrapEngine != nil {
		return c.WrapEngine(e)
	}
	return e
}

// Node is a running meshp2p node: the composition of its parts and their
// lifecycle. What it serves is the served set's (served.go: models,
// windows, extras and their registries); where its window goes, the
// placement controller's (placement.go); its advert, the advertiser's
// (advert.go); what it reports to, the observers' (observe.go); its
// origins' audits, the audits' (audit.go).
type Node struct {
	cfg Config
	log *slog.Logger
	p2p *p2p.Node
	// host is the data-plane view of the p2p host: its streams start on
	// the direct connection when a hole punch is about to give one
	// (activation seams live long and carry megabytes).
	host   *p2p.StreamHost
	table  *route.Table
	loader *windowLoader
	set    *served
	adv    *advertiser
	// place controls the served window: chosen and moved by automatic
	// placement, or fixed (--layers). nil on a client. Set during Start,
	// before the advert loops run.
	place *placementController
	obs   *observers
	// audits audits this node's origins' generations (set at the end of
	// Start).
	audits *audits
	// failures is shared by every origin of this node (session.FailureMemory).
	failures *session.FailureMemory
	// draft proposes for speculative sessions that ask for it (DraftPath).
	draft *shardengine.Draft
	// meter counts the demand this node's origins see (advertised).
	meter *demand.Meter

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// Start brings a node up: host, discovery, and (with a model) the shard,
// its hop service and its advert.
func Start(ctx context.Context, cfg Config) (*Node, error) {
	cfg = withLoggers(cfg)
	if err := cfg.checkModels(); err != nil {
		return nil, err
	}
	n := &Node{log: cfg.Logger, table: route.NewTable(), failures: cfg.Failures, meter: demand.NewMeter(time.Now())}
	if n.failures == nil {
		n.failures = session.NewFailureMemory(0, 0)
	}
	n.obs, n.cfg = newObservers(cfg)
	n.loader = newWindowLoader(n.cfg)
	n.set = newServed(n.cfg, n.loader)
	if n.cfg.ModelPath == "" && n.cfg.Fetch != nil {
		if err := n.fetchFirst(ctx); err != nil {
			return nil, err
		}
	}
	var fixed *loadedShard // the window of a node given its layers, loaded before the host starts
	abort := func(err error) (*Node, error) {
		if fixed != nil {
			fixed.close()
		}
		if n.draft != nil {
			n.draft.Close()
		}
		if n.p2p != nil {
			_ = n.p2p.Close()
		}
		return nil, err
	}
	var err error
	if n.draft, err = loadDraft(ctx, &n.cfg); err != nil {
		return abort(err)
	}
	placing := n.cfg.places()
	if n.cfg.ModelPath != "" && !placing {
		var own ownModel
		if fixed, own, err = n.loader.loadFixed(ctx, n.cfg.ModelPath, n.cfg.Layers, n.cfg.ModelName); err != nil {
			return abort(err)
		}
		n.set.identify(own)
	}
	if err := n.startHost(ctx); err != nil {
		return abort(err)
	}
	if fixed != nil || placing {
		n.placer(placing)
	}
	bg := n.startBackground()
	switch {
	case fixed != nil:
		err = n.serveFixed(ctx, bg, fixed)
	case placing:
		err = n.startPlaced(ctx, bg)
	}
	if err != nil {
		n.Close()
		return nil, err
	}
	n.obs.gauges(n.p2p, n.table, n.Hop(), n.set)
	n.audits = startAudits(n.cfg, n.p2p, n.host, n.table, n.failures, n.set.engine)
	return n, nil
}

// withLoggers gives every part of cfg a logger (slog.Default if none) and
// an open relay its member test.
func withLoggers(cfg Config) Config {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.P2P.Logger == nil {
		cfg.P2P.Logger = cfg.Logger
	}
	if cfg.Hop.Logger == nil {
		cfg.Hop.Logger = cfg.Logger
	}
	if cfg.Hop.KernelClass == "" {
		cfg.Hop.KernelClass = cfg.Device.KernelClass()
	}
	if cfg.Engine.Logger == nil {
		cfg.Engine.Logger = cfg.Logger
	}
	if cfg.P2P.MemberAdvert == nil { // an open relay's members (--relay-service)
		cfg.P2P.MemberAdvert = route.MemberAdvert
	}
	return cfg
}

// startHost brings up the p2p host, the data plane's view of it and the
// advertiser (once: a fetching node brings them up first).
func (n *Node) startHost(ctx context.Context) error {
	if n.p2p != nil {
		return nil
	}
	var err error
	if n.p2p, err = p2p.New(ctx, n.cfg.P2P); err != nil {
		return err
	}
	n.host = streamHost(n.p2p, n.cfg.DirectWait)
	n.table.Reach = func(p peer.ID) p2p.Path { return n.p2p.ConnStatus(p).Path }
	n.adv = &advertiser{local: n.p2p.Discovery(), self: n.p2p.ID(), network: n.cfg.P2P.Network, set: n.set, log: n.log, sessions: n.obs.sessions.c, every: n.cfg.AdvertCheckInterval}
	n.set.publish = n.adv.publish
	return nil
}

// fetchFirst downloads the node's shard before it serves (fetch.go,
// docs/fetch.md): the network comes up first, peers being the sources. A
// self-placing node (no Layers) chooses the window to fetch with its
// placement controller, which later fetches each window it moves to.
func (n *Node) fetchFirst(ctx context.Context) error {
	if err := n.startHost(ctx); err != nil {
		return err
	}
	f := &shardFetcher{cfg: *n.cfg.Fetch, dataDir: n.cfg.P2P.DataDir, name: n.cfg.ModelName, bootstrap: len(n.cfg.P2P.Bootstrap) > 0,
		host: n.host, table: n.table, swarm: p2pSwarm{n.p2p}, log: n.log}
	var pc *placementController
	if n.cfg.Layers == nil && n.cfg.Placement != nil {
		pc = n.placer(true) // its planned window is advertised while it fetches
		f.choose = func(ctx context.Context, hf *gguf.File, fp string) (gguf.Range, error) {
			sz, in, err := fileSizing(hf, n.cfg.Engine)
			if err != nil {
				return gguf.Range{}, err
			}
			nl, err := hf.NLayer()
			if err != nil {
				return gguf.Range{}, err
			}
			n.set.identify(ownModel{fp: fp, nLayer: nl, name: n.cfg.ModelName})
			return pc.chooseFetched(ctx, sz, in.NEmbd, in.Architecture, fp != "")
		}
	}
	stop := followTable(n.p2p, n.table)
	path, fm, err := f.fetch(ctx, n.cfg.Layers)
	stop()
	if err != nil {
		_ = n.p2p.Close()
		return err
	}
	n.cfg.ModelPath = path
	if pc != nil && fm != nil {
		pc.fetched = fm
		pc.shardFor = func(ctx context.Context, r gguf.Range) (string, error) {
			return f.fetchWindow(ctx, fm, r, n.set.now().path)
		}
	}
	return nil
}

// placer makes the node's placement controller (once): auto, it chooses
// and moves the window (start without --layers); otherwise it runs the
// moves it is asked for (tests) and reports the window. It gets a
// window's shard file by cutting the model file (a fetching node's fetches
// it instead: fetchFirst) and writes node.json after each move.
func (n *Node) placer(auto bool) *placementController {
	if n.place != nil {
		return n.place
	}
	var pcfg *PlacementConfig
	if auto && n.cfg.Placement != nil {
		c := *n.cfg.Placement
		c.Device = n.cfg.Device
		pcfg = &c
	}
	pc := newPlacementController(n.set, n.loader, n.adv, p2pSwarm{n.p2p}, n.log, pcfg, len(n.cfg.P2P.Bootstrap) > 0)
	pc.shardFor, pc.table = n.set.cutOwn, n.table
	pc.moved = func() {
		if _, err := n.WriteInfo(); err != nil {
			n.log.Warn("write node info", "err", err)
		}
	}
	n.place, n.adv.place = pc, pc
	return pc
}

// startBackground starts what runs for the node's lifetime whatever it
// serves (the table's follower, the connection and swarm logs, the demand reports,
// the vocabulary and fetch servers) and returns the context that ends
// with Close.
func (n *Node) startBackground() context.Context {
	bg, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	n.wg.Add(4)
	go func() { defer n.wg.Done(); route.Follow(bg, n.p2p.Discovery(), n.table) }()
	go func() { defer n.wg.Done(); logConnEvents(bg, n.p2p, n.log) }()
	go func() { defer n.wg.Done(); newSwarmLog(n.log, n.p2p.ID(), n.adv.ownShards).run(bg, n.p2p.Discovery()) }()
	go func() { defer n.wg.Done(); n.adv.demandLoop(bg, n.meter, n.table, n.cfg.DemandInterval) }()
	if n.loader.share != nil {
		n.wg.Add(1)
		go func() { defer n.wg.Done(); n.loader.share.run(bg, n.cfg.ThreadShareInterval) }()
	}
	n.set.listen(n.host, n.cfg.Hop, n.cfg.UploadLimit, n.cfg.UploadLimitPerPeer)
	return bg
}

// serveFixed serves the window Start loaded (given --layers, a pre-cut
// shard, or a fetched window) and advertises it; a self-placing node that
// fetched its window rebalances like one with the whole file (a move
// fetches the new window).
func (n *Node) serveFixed(ctx, bg context.Context, ls *loadedShard) error {
	pc := n.place
	if pc.fetched != nil {
		n.set.knowManifest(pc.fetched.m.Marshal())
	}
	// A fetched window was advertised as planned while it came.
	if _, err := n.set.serveWindow(ctx, ls, pc.firstServed); err != nil {
		ls.close()
		return err
	}
	n.wg.Add(1)
	go func() { defer n.wg.Done(); n.adv.loop(bg) }()
	if pc.auto && pc.fetched != nil {
		pc.startRebalancing()
		n.wg.Add(1)
		go func() { defer n.wg.Done(); pc.run(bg) }()
	}
	return nil
}

// startPlaced makes a node with the whole model file (or several) choose
// its model and window, announce it, reconsider after a random pause,
// load it, and start serving and rebalancing.
func (n *Node) startPlaced(ctx, bg context.Context) error {
	cfg, pc := n.cfg, n.place
	fp, nl, err := modelFingerprint(ctx, cfg.P2P.DataDir, cfg.ModelPath, n.log)
	if err != nil {
		return fmt.Errorf("placing layers: %w", err)
	}
	sz, in, err := modelSizing(cfg.ModelPath, cfg.Engine)
	if err != nil {
		return err
	}
	src, err := pc.size(sz, in.NEmbd, in.Architecture)
	if err != nil {
		return err
	}
	first := catalogModel{path: cfg.ModelPath, name: modelName(cfg.ModelName, cfg.ModelPath), fp: fp, nLayer: nl}
	if len(cfg.Models) > 0 {
		cat, err := loadCatalog(ctx, cfg)
		if err != nil {
			return err
		}
		n.set.setCatalog(cat)
		if first, err = pc.startCatalog(ctx, cat, src); err != nil {
			return err
		}
	}
	n.cfg.ModelPath = first.path // the model it starts on: its audits replay with this file
	n.set.setModel(ctx, first)
	ls, err := pc.placeFirst(ctx)
	if err != nil {
		return err
	}
	if _, err := n.set.serveWindow(ctx, ls, pc.firstServed); err != nil {
		ls.close()
		return err
	}
	pc.startRebalancing()
	n.wg.Add(2)
	go func() { defer n.wg.Done(); n.adv.loop(bg) }()
	go func() { defer n.wg.Done(); pc.run(bg) }()
	return nil
}

// P2P returns the network node.
func (n *Node) P2P() *p2p.Node { return n.p2p }

// Table returns the capability table fed by discovery.
func (n *Node) Table() *route.Table { return n.table }

// Fingerprint of the served model ("" on a client).
func (n *Node) Fingerprint() string { return n.set.now().fp }

// Shard returns the served engine shard (nil on a client).
func (n *Node) Shard() *engine.Shard { return n.set.shard() }

// Hop returns the hop service (nil on a client).
func (n *Node) Hop() *session.HopService { return n.set.hopService() }

// Origin returns an origin that plans over this node's table.
func (n *Node) Origin(planner route.Planner) *session.Origin {
	if planner == nil {
		planner = &route.LocalPlanner{Table: n.table}
	}
	// The origin's stream carries token ids one way and tokens the other:
	// it opens at once on any connection, relayed included, instead of
	// waiting for a hole punch as activation seams do.
	return &session.Origin{Dialer: n.ControlHost(), Key: n.host.Peerstore().PrivKey(n.host.ID()), Planner: planner, Protocol: n.host.ProtocolID(session.ProtoSession, session.ProtoVersion),
		Limits: n.cfg.Hop.Limits, Logger: n.log, Failures: n.failures, Observer: n.obs.origin(), Covered: n.table.Covers, Audit: n.audits.auditor, Shards: n.table.Shards,
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
	// AlsoServes names the models a multi-model node serves whole beside
	// its own (docs/placement.md "Many models").
	AlsoServes []string `json:"also_serves,omitempty"`
	// SwarmKeyFile is the absolute path of the swarm key file the node
	// was started with (--swarm-key; not the key), and
	// SwarmKeyFingerprint its key's fingerprint (any private swarm):
	// what meshp2p invite puts in a join token, and checks it against.
	SwarmKeyFile        string `json:"swarm_key_file,omitempty"`
	SwarmKeyFingerprint string `json:"swarm_key_fingerprint,omitempty"`
}

// Info describes the node (addresses include /p2p/<id>).
func (n *Node) Info() Info {
	in := Info{PeerID: n.p2p.ID().String(), Network: n.cfg.P2P.Network}
	for _, a := range n.p2p.Addrs() {
		in.Addrs = append(in.Addrs, a.String())
	}
	n.set.info(&in)
	if _, fp := n.p2p.Private(); fp != "" {
		in.SwarmKeyFingerprint = fp
		if p := n.cfg.P2P.SwarmKeyPath; p != "" {
			in.SwarmKeyFile, _ = filepath.Abs(p)
		}
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

// Placement reports what automatic placement is doing (Auto false when
// the node was given --layers).
func (n *Node) Placement() PlacementStatus { return n.set.placement(n.place) }

// RebalanceInterval is the period of the placement checks (0 without
// placement).
func (n *Node) RebalanceInterval() time.Duration {
	if n.place == nil {
		return 0
	}
	return n.place.interval()
}

// Catalog lists the names of the models a multi-model node may serve
// (nil for a node with one model).
func (n *Node) Catalog() []string { return n.set.catalogNames() }

// DemandMeter counts the demand this node's origins see (give it to the
// client.Config of a gateway or CLI client on this node); the node
// gossips it in its advert every DemandInterval.
func (n *Node) DemandMeter() *demand.Meter { return n.meter }

// Recorder holds the node's running totals and recent routes.
func (n *Node) Recorder() *status.Recorder { return n.obs.recorder }

// StatusCollector builds the node's status document (GET /api/status,
// `meshp2p status --json`).
func (n *Node) StatusCollector(role string) *status.Collector {
	return &status.Collector{P2P: n.p2p, Table: n.table, Recorder: n.obs.recorder, Self: func() (status.Self, []route.Shard) {
		s := status.Self{PeerID: n.p2p.ID().String(), Role: role, Network: n.cfg.P2P.Network}
		for _, a := range n.p2p.Addrs() {
			s.Addrs = append(s.Addrs, a.String())
		}
		if pl := n.Placement(); pl.Auto || pl.Moving != nil || pl.Loading != nil {
			s.Placement = &status.Placement{BudgetBytes: pl.Budget, Start: pl.Current.Start, End: pl.Current.End,
				Loading: window(pl.Loading), Draining: window(pl.Moving), Moves: pl.Moves, LastReason: pl.LastWhy, HealPlan: pl.Plan, ModelReason: pl.ModelWhy}
		}
		return s, n.set.status(n.p2p.ID(), &s)
	}}
}

// Status builds the node's status document now.
func (n *Node) Status(ctx context.Context, role string) *status.Document {
	return n.StatusCollector(role).Document(ctx)
}

// WaitAudits blocks until the audits this node's origins started ended.
func (n *Node) WaitAudits() { n.audits.wait() }

// Close withdraws the advert, ends sessions and stops everything.
func (n *Node) Close() error {
	if n.cancel != nil {
		n.cancel()
	}
	n.set.stop()
	n.audits.stop()
	var errs []error
	if n.p2p != nil {
		errs = append(errs, n.p2p.Close())
	}
	n.wg.Wait()
	n.audits.close()
	n.set.close()
	if n.draft != nil {
		n.draft.Close()
	}
	return errors.Join(errs...)
}

// ControlHost is the host for small, latency-bound exchanges (the origin's
// session stream, vocabulary and advert fetches): its streams open at once
// on the best connection there is, a relayed one included.
func (n *Node) ControlHost() session.Host { return &p2p.StreamHost{N: n.p2p} }

// loadDraft loads the draft model (cfg.DraftPath; nil: none) once its
// vocabulary is known to be the model's, and makes it the hop's proposer
// factory.
func loadDraft(ctx context.Context, cfg *Config) (*shardengine.Draft, error) {
	p := cfg.DraftPath
	if p == "" {
		return nil, nil
	}
	if cfg.ModelPath == "" {
		return nil, fmt.Errorf("--draft %s: the node serves no model to draft for", p)
	}
	if err := shardengine.CheckDraftVocab(p, cfg.ModelPath); err != nil {
		return nil, fmt.Errorf("--draft: %w", err)
	}
	ec, err := cfg.Engine.WithDefaults()
	if err != nil {
		return nil, err
	}
	d, err := shardengine.LoadDraft(ctx, p, ec.MaxSessions, ec.NCtx, ec.Threads, cfg.Logger)
	if err != nil {
		return nil, fmt.Errorf("--draft: %w", err)
	}
	cfg.Hop.Proposer = d.Proposer
	cfg.Logger.Info("draft model loaded", "path", p, "layers", d.Model.Info().NLayer)
	return d, nil
}

// streamHost is the data plane's view of host p: its streams wait up to
// wait (0: DirectWait; negative: do not wait) for a hole punch.
func streamHost(p *p2p.Node, wait time.Duration) *p2p.StreamHost {
	if wait == 0 {
		wait = DirectWait
	}
	return &p2p.StreamHost{N: p, Wait: wait}
}

// followTable feeds the capability table from p's discovery while a node
// fetches (before Start's own follower runs); the returned func stops it.
func followTable(p *p2p.Node, table *route.Table) func() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); route.Follow(ctx, p.Discovery(), table) }()
	return func() { cancel(); <-done }
}

// logConnEvents makes NAT traversal observable in the node's log: hole
// punches and their outcome, and a peer's path moving between relayed and
// direct.
func logConnEvents(ctx context.Context, p *p2p.Node, log *slog.Logger) {
	for ev := range p.SubscribeConn(ctx) {
		switch ev.Kind {
		case p2p.PathChanged:
			log.Info("peer path changed", "peer", ev.Peer, "path", ev.Status.Path.String())
		case p2p.HolePunchFinished:
			if ev.Success {
				log.Info("hole punch succeeded", "peer", ev.Peer, "attempts", ev.Status.HolePunch.Attempts)
			} else {
				log.Info("hole punch failed; staying relayed", "peer", ev.Peer, "err", ev.Error, "failures", ev.Status.HolePunch.Failures)
			}
		}
	}
}
