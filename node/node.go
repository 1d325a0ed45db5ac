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
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/demand"
	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/fetch"
	"github.com/neuron-tai/meshp2p/metrics"
	"github.com/neuron-tai/meshp2p/node/shardengine"
	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/proofgossip"
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
	// Models are more whole model files the node may serve instead of
	// ModelPath's (start --model a.gguf,b.gguf or a directory; needs
	// Placement): it serves a window of one model at a time, offers the
	// others to the swarm and switches to the one demand asks for
	// (models.go, docs/placement.md "Many models").
	Models []string
	// DemandInterval is how often the node gossips the demand its origins
	// measured (DefaultDemandInterval).
	DemandInterval time.Duration
	ModelName      string // advertised name (default: the file name without .gguf)
	Engine         engine.Config
	NoMmap         bool // read the weights instead of mapping them (engine.LoadOptions.NoMmap)
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

// Node is a running meshp2p node.
type Node struct {
	cfg    Config
	log    *slog.Logger
	loader *windowLoader
	p2p    *p2p.Node
	host   *p2p.StreamHost
	table  *route.Table

	// mu guards model, shard, shardPath, calibration and vocabPath: a
	// move swaps the served window (window.go). Lock order: mu before
	// place.mu.
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
	// place controls the served window (placement.go): chosen and moved
	// by automatic placement, or fixed (--layers). nil on a client.
	place *placementController
	// failures is shared by every origin of this node (session.FailureMemory).
	failures *session.FailureMemory
	// draft proposes for speculative sessions that ask for it (DraftPath).
	draft *shardengine.Draft
	// auditor audits this node's origins' generations; auditEngines are
	// the layers it can replay (audit.go).
	auditor      *session.Auditor
	auditEngines *AuditEngines
	// proofs gossips fraud proofs (nil without a host).
	proofs *proofgossip.Gossip
	// catalog are the models this node may serve (Config.Models; set
	// under mu during Start, read-only after); meter counts its origins'
	// demand, demandRep is the last report, advertised (guarded by mu).
	catalog   []catalogModel
	meter     *demand.Meter
	demandRep *meshp2pb.DemandReport
	// pubMu makes building and setting the advert one step (publish).
	pubMu sync.Mutex
	// extras are other models served whole beside the node's own
	// (extras.go; guarded by mu).
	extras map[string]*extraModel

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
	n.cfg = n.observe(cfg)
	n.loader = newWindowLoader(n.cfg)
	if n.cfg.ModelPath == "" && n.cfg.Fetch != nil {
		if err := n.fetchFirst(ctx); err != nil {
			return nil, err
		}
	}
	if err := n.loadDraft(ctx); err != nil {
		if n.p2p != nil {
			_ = n.p2p.Close()
		}
		return nil, err
	}
	placing := n.cfg.places()
	if n.cfg.ModelPath != "" && !placing {
		if err := n.loadShard(ctx); err != nil {
			n.closeEngine()
			if n.p2p != nil {
				_ = n.p2p.Close()
			}
			return nil, err
		}
	}
	if err := n.startHost(ctx); err != nil {
		n.closeEngine()
		return nil, err
	}
	bg := n.startBackground()
	var err error
	switch {
	case n.shard != nil:
		err = n.serveLoaded(bg)
	case placing:
		err = n.startPlaced(ctx, bg)
	}
	if err != nil {
		n.Close()
		return nil, err
	}
	n.registerGauges()
	n.startAuditor()
	return n, nil
}

// startAuditor sets up the audits of this node's origins.
func (n *Node) startAuditor() {
	models := slices.Clone(n.cfg.AuditModels)
	if n.cfg.ModelPath != "" {
		models = append(models, n.cfg.ModelPath)
	}
	// One thread unless the node's engine says otherwise: an audit is one
	// hop's steps, and an origin's replays must not spin a thread pool
	// against the hops' (8 generate processes on 2 cores slowed to a crawl).
	n.auditEngines = &AuditEngines{Models: models, DataDir: n.cfg.P2P.DataDir, Threads: max(1, n.cfg.Engine.Threads), Logger: n.log,
		ServedClass: n.cfg.Device.KernelClass(),
		Served: func() (session.Engine, string) {
			n.mu.Lock()
			defer n.mu.Unlock()
			if n.shard == nil {
				return nil, ""
			}
			return shardengine.Engine{Model: n.model, Shard: n.shard}, n.fp
		}}
	n.auditor = &session.Auditor{Rate: n.cfg.AuditRate, Engines: n.auditEngines, OnReport: n.cfg.OnAudit,
		Protocol: n.host.ProtocolID(session.ProtoAudit, session.ProtoVersion)}
	if n.p2p == nil {
		return
	}
	// Fraud proofs travel without a tracker (proofgossip): this node's
	// convictions are published, and others' are replayed here when this
	// node holds the layers.
	g, err := proofgossip.Start(context.Background(), n.p2p.Discovery(), n.p2p.ID(), proofgossip.Config{
		Judge: func(ctx context.Context, p *meshp2pb.Proof) (session.Verdict, error) {
			return session.Judge(ctx, p, n.auditEngines)
		},
		Convict:   func(p peer.ID, _ string) { n.failures.Convict(p) },
		Suspect:   n.failures.Blame,
		Convicted: n.failures.Convicted,
		Serving: func(p peer.ID) bool {
			return slices.ContainsFunc(n.table.Shards(""), func(s route.Shard) bool { return s.Peer == p })
		},
		Logger: n.log,
	})
	if err != nil {
		n.log.Warn("fraud proofs will not be gossiped", "err", err)
		return
	}
	n.proofs = g
	n.auditor.OnReport = func(r session.AuditReport) {
		if r.Proof != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if err := g.Publish(ctx, r.Proof); err != nil {
				n.log.Warn("could not gossip the fraud proof", "peer", r.Peer, "err", err)
			}
			cancel()
		}
		if n.cfg.OnAudit != nil {
			n.cfg.OnAudit(r)
		}
	}
}

// AuditEngines are the layers this node can replay (proof checks).
func (n *Node) AuditEngines() *AuditEngines { return n.auditEngines }

// WaitAudits blocks until the audits this node's origins started ended.
func (n *Node) WaitAudits() { n.auditor.Wait() }

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

// fetchFirst downloads the node's shard before it serves (fetch.go,
// docs/fetch.md): the network comes up first, peers being the sources. A
// self-placing node (no Layers) chooses the window to fetch with its
// placement controller, which later fetches each window it moves to.
func (n *Node) fetchFirst(ctx context.Context) error {
	var err error
	if n.p2p, err = p2p.New(ctx, n.cfg.P2P); err != nil {
		return err
	}
	n.host = n.streamHost()
	f := &shardFetcher{cfg: *n.cfg.Fetch, dataDir: n.cfg.P2P.DataDir, name: n.cfg.ModelName, bootstrap: len(n.cfg.P2P.Bootstrap) > 0,
		host: n.host, table: n.table, swarm: p2pSwarm{n.p2p}, log: n.log}
	var pc *placementController
	if n.cfg.Layers == nil && n.cfg.Placement != nil {
		pcfg := *n.cfg.Placement
		pcfg.Device = n.cfg.Device
		pc = newPlacementController(n, n.loader, p2pSwarm{n.p2p}, n.log, &pcfg, f.bootstrap, nil)
		n.place = pc // its planned window is advertised while it fetches
		f.choose = func(ctx context.Context, hf *gguf.File, fp string) (gguf.Range, error) {
			sz, in, err := fileSizing(hf, n.cfg.Engine)
			if err != nil {
				return gguf.Range{}, err
			}
			nl, err := hf.NLayer()
			if err != nil {
				return gguf.Range{}, err
			}
			n.fp, n.nLayer = fp, nl
			return pc.chooseFetched(ctx, sz, in.NEmbd, in.Architecture, fp != "")
		}
	}
	stop := n.followTable()
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
			return f.fetchWindow(ctx, fm, r, n.servedPath())
		}
	}
	return nil
}

// followTable feeds the capability table while the node fetches (before
// Start's own follower runs); the returned func stops it.
func (n *Node) followTable() func() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); route.Follow(ctx, n.p2p.Discovery(), n.table) }()
	return func() { cancel(); <-done }
}

// servedPath is the shard file of the window served now.
func (n *Node) servedPath() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.shardPath
}

// startHost brings up the p2p host (unless a fetch did) and the data
// plane's view of it.
func (n *Node) startHost(ctx context.Context) error {
	if n.p2p == nil {
		var err error
		if n.p2p, err = p2p.New(ctx, n.cfg.P2P); err != nil {
			return err
		}
	}
	n.host = n.streamHost()
	n.table.Reach = func(p peer.ID) p2p.Path { return n.p2p.ConnStatus(p).Path }
	return nil
}

// startBackground starts what runs for the node's lifetime whatever it
// serves (the table's follower, the connection log, the vocabulary and
// fetch servers) and returns the context that ends with Close.
func (n *Node) startBackground() context.Context {
	bg, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	n.wg.Add(1)
	go func() { defer n.wg.Done(); route.Follow(bg, n.p2p.Discovery(), n.table) }()
	n.wg.Add(1)
	go func() { defer n.wg.Done(); n.logConnEvents(bg) }()
	n.wg.Add(1)
	go func() { defer n.wg.Done(); n.demandLoop(bg) }()
	n.vocab = vocab.NewService(n.host, n.cfg.Hop.Limits, n.log)
	n.fetchSrv = fetch.NewServerLimits(n.host, n.cfg.UploadLimit, n.cfg.UploadLimitPerPeer, n.log)
	return bg
}

// serveLoaded serves the shard loadShard loaded (given --layers, a pre-cut
// shard, or a fetched window): tensors to fetchers, the hop service, the
// vocabulary, the advert; a self-placing node that fetched its window
// rebalances like one with the whole file (a move fetches the new
// window).
func (n *Node) serveLoaded(bg context.Context) error {
	if err := n.fetchSrv.Add(n.fp, n.shardPath, n.manifest); err != nil {
		return err
	}
	n.cfg.Hop.Fingerprint = n.fp
	n.hop = session.NewHopService(n.host, n.cfg.hopEngine(shardengine.Engine{Model: n.model, Shard: n.shard}), n.cfg.Hop)
	if n.vocabPath != "" {
		if err := n.vocab.Add(n.fp, n.vocabPath); err != nil {
			return err
		}
	}
	pc := n.place
	if pc == nil {
		pc = newPlacementController(n, n.loader, p2pSwarm{n.p2p}, n.log, nil, len(n.cfg.P2P.Bootstrap) > 0, n.cutShard)
		n.place = pc
	}
	pc.setLoading(nil) // a fetched window was advertised as planned while it came
	if err := n.publish(); err != nil {
		return err
	}
	n.wg.Add(1)
	go func() { defer n.wg.Done(); n.advertLoop(bg) }()
	if pc.auto && pc.fetched != nil {
		if n.manifest == nil {
			n.manifest = pc.fetched.m.Marshal()
		}
		pc.startRebalancing()
		n.wg.Add(1)
		go func() { defer n.wg.Done(); pc.run(bg) }()
	}
	return nil
}

// loadShard loads the shard of cfg.ModelPath: a pre-cut shard as it is,
// else the Layers window cut from the whole model (cached); it also
// prepares the model's vocabulary when the shard has one.
func (n *Node) loadShard(ctx context.Context) error {
	if err := os.MkdirAll(n.cfg.P2P.DataDir, 0o700); err != nil {
		return err
	}
	path, fp, nl, err := n.shardFile(ctx)
	if err != nil {
		return err
	}
	n.fp, n.nLayer, n.shardPath = fp, nl, path
	ls, err := n.loader.load(ctx, path)
	if err != nil {
		return err
	}
	n.model, n.shard, n.calibration = ls.model, ls.shard, ls.calibration
	if n.model.Info().HasVocab {
		vp := n.loader.vocabFile(n.fp)
		if err := writeVocab(ctx, path, vp, fp, n.log); err != nil {
			return err
		}
		n.vocabPath = vp
	}
	return nil
}

// shardFile is the shard to serve: cfg.ModelPath itself when it is a
// pre-cut shard (its proof checked), else the Layers window split from
// the whole model into the data dir (cached). It also reads or builds the
// model's manifest, which peers fetching only their layers verify against.
func (n *Node) shardFile(ctx context.Context) (path, fp string, nl int, err error) {
	cfg := n.cfg
	f, err := gguf.Open(cfg.ModelPath)
	if err != nil {
		return "", "", 0, err
	}
	nl, err = f.NLayer()
	_, shardErr := gguf.ReadShardInfo(f.Metadata)
	f.Close()
	if err != nil {
		return "", "", 0, err
	}
	if shardErr == nil {
		// A pre-cut shard (meshp2p shard split): serve it as it is, after
		// checking its proof, so a machine needs only its own layers.
		si, err := gguf.VerifyShard(ctx, cfg.ModelPath)
		if err != nil {
			return "", "", 0, fmt.Errorf("%s: %w", cfg.ModelPath, err)
		}
		if cfg.Layers != nil && *cfg.Layers != si.Range {
			return "", "", 0, fmt.Errorf("%s holds layers %s, not --layers %s", cfg.ModelPath, si.Range, *cfg.Layers)
		}
		fp = si.ParentFingerprint
		n.log.Info("serving a pre-cut shard", "path", cfg.ModelPath, "range", si.Range.String(), "model", fp)
		if m, err := gguf.ReadManifestFile(manifestPath(cfg.P2P.DataDir, fp), fp); err == nil {
			n.manifest = m.Marshal()
		}
		return cfg.ModelPath, fp, si.ParentNLayer, nil
	}
	r := gguf.Range{Start: 0, End: nl}
	if cfg.Layers != nil {
		r = *cfg.Layers
	}
	if path, fp, nl, err = prepareShard(ctx, cfg.P2P.DataDir, cfg.ModelPath, r, cfg.SplitProgress, n.log); err != nil {
		return "", "", 0, err
	}
	if n.manifest, err = ensureManifest(ctx, cfg.P2P.DataDir, cfg.ModelPath, fp); err != nil {
		return "", "", 0, fmt.Errorf("manifest: %w", err)
	}
	return path, fp, nl, nil
}

// ModelName is the advertised model name.
func (n *Node) ModelName() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.modelNameLocked()
}

// modelNameLocked is ModelName with n.mu held (a multi-model node's model
// changes under it).
func (n *Node) modelNameLocked() string {
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

// advertBody is the advert and its discovery keys (the served model's
// fingerprint and name), from one snapshot under n.mu.
func (n *Node) advertBody() ([]byte, []string, error) {
	ca := &meshp2pb.CapabilityAdvert{
		PeerId: []byte(n.p2p.ID()), Network: n.cfg.P2P.Network, Roles: []meshp2pb.Role{meshp2pb.Role_ROLE_SHARD},
		Version: engine.Version,
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	var keys []string
	if n.fp != "" {
		keys = append(keys, n.fp)
		if name := n.modelNameLocked(); name != "" {
			keys = append(keys, NameKey(name))
		}
	}
	ca.Offers, ca.Demand = n.offersLocked(), n.demandRep
	if n.shard == nil && n.place == nil {
		ca.Roles = []meshp2pb.Role{meshp2pb.Role_ROLE_CLIENT}
	}
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
	ca.Shards = append(ca.Shards, n.extraShardsLocked()...)
	for _, fp := range sortedKeys(n.extras) {
		keys = append(keys, fp)
		if name := n.extras[fp].m.name; name != "" {
			keys = append(keys, NameKey(name))
		}
	}
	if n.place == nil {
		b, err := proto.Marshal(ca)
		return b, keys, err
	}
	if sw := n.place.switchingTo(); sw != nil {
		// A multi-model node about to switch: the new model's window,
		// planned, before it drains the old one (models.go), so other
		// nodes count it and do not all switch too.
		sa := n.shardAdvertOf(sw.m.fp, sw.m.name, sw.m.nLayer, sw.r.Start, sw.r.End, sw.m.nEmbd, sw.m.arch)
		sa.Capacity = &meshp2pb.ShardCapacity{}
		ca.Shards = append(ca.Shards, sa)
	}
	if r, embd, arch := n.place.planned(); r != nil {
		// A planned window: announced before it is loaded, with no session
		// slot, so planners skip it and placement counts it.
		if n.shard != nil {
			embd, arch = n.shard.Info().NEmbd, n.shard.Info().Arch
		}
		sa := n.shardAdvert(r.Start, r.End, embd, arch)
		sa.Capacity = &meshp2pb.ShardCapacity{}
		ca.Shards = append(ca.Shards, sa)
	}
	b, err := proto.Marshal(ca)
	return b, keys, err
}

// shardAdvert is a shard of the served model (n.mu held).
func (n *Node) shardAdvert(start, end, nEmbd int, arch string) *meshp2pb.ShardAdvert {
	return n.shardAdvertOf(n.fp, n.modelNameLocked(), n.nLayer, start, end, nEmbd, arch)
}

// shardAdvertOf is a shard of model fp (n.mu held).
func (n *Node) shardAdvertOf(fp, name string, nl, start, end, nEmbd int, arch string) *meshp2pb.ShardAdvert {
	return &meshp2pb.ShardAdvert{
		ModelFingerprint: fp, ModelName: name, NLayer: uint32(nl),
		Start: uint32(start), End: uint32(end), WireDtypes: frame.WireDTypeList(),
		HasVocab: n.vocabPath != "", NEmbd: uint32(nEmbd), Arch: arch,
		Runtime: "llama.cpp@" + engine.LlamaCommit, PlacementBudget: uint64(max(0, n.place.advertisedBudget())),
		KernelClass: n.cfg.Device.KernelClass(),
	}
}

// publish sets the local advert. pubMu makes building and setting one
// step: two goroutines publishing at once (the advert loop, placement,
// the demand loop) cannot leave the older body in place, nor keys of one
// model with the body of another.
func (n *Node) publish() error {
	n.pubMu.Lock()
	defer n.pubMu.Unlock()
	body, keys, err := n.advertBody()
	if err != nil {
		return err
	}
	return n.p2p.Discovery().SetLocalAdvert(keys, body)
}

// advertLoop re-publishes when free capacity or measured speed changes
// (checked every AdvertCheckInterval).
func (n *Node) advertLoop(ctx context.Context) {
	t := time.NewTicker(AdvertCheckInterval)
	defer t.Stop()
	last := n.capacity()
	lastSpeed := n.hop.DecodeMsPerLayer()
	lastExtras := n.extraCapacities()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c, sp, ex := n.capacity(), n.hop.DecodeMsPerLayer(), n.extraCapacities()
			// Re-publish on capacity changes (extra models' too), or when
			// the measured speed moved by more than a quarter (the
			// tracker's cost model).
			if c != last || !slices.Equal(ex, lastExtras) || math.Abs(float64(sp-lastSpeed)) > AdvertSpeedChange*float64(max(lastSpeed, 1e-6)) {
				last, lastSpeed, lastExtras = c, sp, ex
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
func (n *Node) Fingerprint() string {
	fp, _ := n.servedModel()
	return fp
}

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
	return &session.Origin{Dialer: n.ControlHost(), Key: n.host.Peerstore().PrivKey(n.host.ID()), Planner: planner, Protocol: n.host.ProtocolID(session.ProtoSession, session.ProtoVersion),
		Limits: n.cfg.Hop.Limits, Logger: n.log, Failures: n.failures, Observer: n.originObserver(), Covered: n.table.Covers, Audit: n.auditor,
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
}

// Info describes the node (addresses include /p2p/<id>).
func (n *Node) Info() Info {
	fp, nl := n.servedModel()
	in := Info{PeerID: n.p2p.ID().String(), Network: n.cfg.P2P.Network, Fingerprint: fp, Model: n.ModelName(), NLayer: nl}
	for _, a := range n.p2p.Addrs() {
		in.Addrs = append(in.Addrs, a.String())
	}
	if sh := n.Shard(); sh != nil {
		in.Start, in.End = sh.Info().Start, sh.Info().End
	}
	n.mu.Lock()
	for _, fp := range sortedKeys(n.extras) {
		in.AlsoServes = append(in.AlsoServes, n.extras[fp].m.name)
	}
	n.mu.Unlock()
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
	n.proofs.Close()
	var errs []error
	if n.p2p != nil {
		errs = append(errs, n.p2p.Close())
	}
	n.wg.Wait()
	n.auditor.Wait()
	if n.auditEngines != nil {
		n.auditEngines.Close()
	}
	n.closeEngine()
	return errors.Join(errs...)
}

// loadDraft loads the draft model (cfg.DraftPath) once its vocabulary is
// known to be the model's, and makes it the hop's proposer factory.
func (n *Node) loadDraft(ctx context.Context) error {
	p := n.cfg.DraftPath
	if p == "" {
		return nil
	}
	if n.cfg.ModelPath == "" {
		return fmt.Errorf("--draft %s: the node serves no model to draft for", p)
	}
	if err := shardengine.CheckDraftVocab(p, n.cfg.ModelPath); err != nil {
		return fmt.Errorf("--draft: %w", err)
	}
	ec, err := n.cfg.Engine.WithDefaults()
	if err != nil {
		return err
	}
	d, err := shardengine.LoadDraft(ctx, p, ec.MaxSessions, ec.NCtx, ec.Threads, n.log)
	if err != nil {
		return fmt.Errorf("--draft: %w", err)
	}
	n.draft = d
	n.cfg.Hop.Proposer = d.Proposer
	n.log.Info("draft model loaded", "path", p, "layers", d.Model.Info().NLayer)
	return nil
}

func (n *Node) closeEngine() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.draft != nil {
		n.draft.Close()
		n.draft = nil
	}
	n.closeExtrasLocked()
	if n.shard != nil {
		n.shard.Close()
		n.shard = nil
	}
	if n.model != nil {
		n.model.Close()
		n.model = nil
	}
}

// streamHost is the data plane's view of the node's host: its streams
// wait up to DirectWait (cfg.DirectWait when set; negative: do not wait)
// for a hole punch.
func (n *Node) streamHost() *p2p.StreamHost {
	wait := n.cfg.DirectWait
	if wait == 0 {
		wait = DirectWait
	}
	return &p2p.StreamHost{N: n.p2p, Wait: wait}
}

// Host returns the data-plane view of the host (streams, protocol IDs).
// Its streams start on the direct connection when a hole punch is about to
// give one (activation seams live long and carry megabytes).
func (n *Node) Host() session.Host { return n.host }

// ControlHost is Host for small, latency-bound exchanges (the origin's
// session stream, vocabulary and advert fetches): its streams open at once
// on the best connection there is, a relayed one included.
func (n *Node) ControlHost() session.Host { return &p2p.StreamHost{N: n.p2p} }

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
