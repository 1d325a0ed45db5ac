package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/node"
	"github.com/neuron-tai/meshp2p/node/cpushare"
	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/route"
	"github.com/neuron-tai/meshp2p/session"
	"github.com/neuron-tai/meshp2p/status"
)

const startUsage = `Usage: meshp2p start --model FILE|URL|NAME|FINGERPRINT [--layers A-B | --memory SIZE] [flags]
       meshp2p start --model A.gguf,B.gguf|DIR [--memory SIZE] [flags]

Serves layers [A,B) of a GGUF model to the swarm (or a shard file cut by
meshp2p shard split, served as it is). Without --layers the node chooses
its own window: as many layers as --memory holds, where the swarm needs
them most (layers missing from every route first, then the slowest), and
moves it when the swarm changes (docs/placement.md). On first start the model
is fingerprinted and its shard file is cut into <data-dir>/shards (cached).
Without a local file, only the layers' tensors are downloaded (the
window from --layers, or chosen as above, and the next one when it
moves): from peers that serve
the model (--model NAME|FINGERPRINT), or
from an http(s) URL of the GGUF file by range requests, verified against a
peer's manifest of the model (docs/fetch.md); the shard is cached and the
fetch resumes where it stopped.
With several models (a comma-separated list of files, or a directory of
.gguf files) the node serves a window of one of them, and others whole
beside it when --memory holds them, offers the rest to the swarm
("warmable": GET /v1/models lists them) and loads or switches to the model
that requests ask for and nobody serves, never leaving the last route of a
model still asked for (docs/placement.md "Many models").
Once ready, the node prints its peer id and addresses and writes them to
<data-dir>/node.json. One node per data dir (it is locked: a second one is
refused, naming the first's pid) and per --listen port (a port in use is
refused). SIGINT/SIGTERM close sessions and withdraw the advert.
`

// Defaults of start's flags that neither node nor session names: what
// the zero values of engine.Config and session.HopConfig mean, and the
// two switches.
const (
	defaultThreads           = 0  // auto (node.Config.ThreadShare)
	defaultMaxSessionKV      = 0  // session: half of --ctx
	defaultSessionsPerClient = 0  // session: half of --max-sessions
	defaultPrefixCache       = -1 // engine: half of --ctx (node.DefaultPrefixCache with the default --ctx)
	defaultMmap              = true
	defaultVerbose           = false
)

// layersHelp explains --layers when it does not parse.
const layersHelp = "want one half-open range A-B of layer numbers, A < B: the node serves layers A to B-1 " +
	"(e.g. 0-12 serves layers 0..11 and the next node 12-24; a model's last range ends at its layer count)"

// startFlags are start's flags.
type startFlags struct {
	nf                    netFlags
	tf                    trackerFlags
	ff                    fetchFlags
	plf                   placementFlags
	lf                    logFormat
	mf                    metricsFlag
	af                    apiFlags
	df                    deviceFlags
	trusted               listFlag
	model, layers, name   string
	draft                 string
	maxSess, nctx, nbatch int
	prefixCache           int
	threads               int
	verbose, mmap         bool
	idle, directWait      time.Duration
	sessKV, peerQuota     int
}

func (f *startFlags) register(fs *flag.FlagSet) {
	f.nf.register(fs, node.PresetHome)
	f.tf.registerHop(fs)
	fs.StringVar(&f.model, "model", notGiven, "whole GGUF model file, shard file, http(s) URL of one, or a model name or fingerprint to fetch from peers (required); several whole files (a,b or a directory): served as demand asks, one (and others whole beside it when --memory holds them)")
	f.ff.register(fs)
	fs.StringVar(&f.layers, "layers", notGiven, "layer range A-B to serve, half-open [A,B) (default: chosen from --memory and the swarm)")
	f.plf.register(fs)
	fs.StringVar(&f.name, "name", notGiven, "model name to advertise (default: file name)")
	fs.StringVar(&f.draft, "draft", "", "a small whole GGUF model with the model's vocabulary that proposes tokens for speculative sessions this node heads and that ask for it (--speculative draft); e.g. the model cut to its first layers: shard split --first K")
	fs.IntVar(&f.maxSess, "max-sessions", node.DefaultMaxSessions, "concurrent sessions this shard admits")
	fs.IntVar(&f.nctx, "ctx", node.DefaultNCtx, "KV cells shared by all sessions")
	fs.IntVar(&f.nbatch, "batch", node.DefaultNBatch, "most rows per llama_decode")
	fs.IntVar(&f.prefixCache, "prefix-cache", defaultPrefixCache, "KV cells (tokens), on top of --ctx, that keep finished sessions' prefixes so a conversation's next turn computes only its new tokens; counted by placement like --ctx; reused only by the same client (-1: half of --ctx; 0: off)")
	fs.IntVar(&f.threads, "threads", defaultThreads, "compute threads (default 0: auto: the CPUs not busy with other programs, re-checked every 30 s; on Unix each decode takes those the machine's other meshp2p processes are not computing on at that moment (one for a model too small to gain from more), elsewhere a static share: the CPUs over the meshp2p processes)")
	fs.DurationVar(&f.idle, "idle-timeout", session.DefaultIdle, "free a session after this long without frames")
	fs.IntVar(&f.sessKV, "max-session-kv", defaultMaxSessionKV, "KV cells (tokens) one session may reserve here (0: half of --ctx, so one client cannot take the whole cache; -1: up to --ctx)")
	fs.IntVar(&f.peerQuota, "max-sessions-per-client", defaultSessionsPerClient, "sessions one client (the origin that signed them) may hold at once on this node, at any position of a route (0: half of --max-sessions; -1: no quota)")
	fs.Var(&f.trusted, "trusted-client", "peer id of a client the per-client quota and silent-session backoff do not apply to, e.g. your API gateway (meshp2p serve), which carries many users' sessions (repeatable or comma-separated)")
	fs.DurationVar(&f.directWait, "direct-wait", node.DirectWait, "how long a new seam to a peer reached through a relay waits for a hole punch (0: start on the relay; the seam moves to the direct connection once it appears)")
	fs.BoolVar(&f.verbose, "v", defaultVerbose, "debug logging")
	f.lf.register(fs)
	f.mf.register(fs)
	f.df.register(fs, "where this node runs its layers")
	fs.BoolVar(&f.mmap, "mmap", defaultMmap, "map the shard file; --mmap=false reads it into memory (containers with a memory limit: mapped page cache is not charged to the container)")
	f.af.register(fs, notGiven, "also serve the OpenAI-compatible HTTP API on this host:port, e.g. 127.0.0.1:8080 (see meshp2p serve; default: off)")
}

// startRun is a parsed start: the node's configuration and what serves
// next to it.
type startRun struct {
	cfg   node.Config
	log   *slog.Logger
	gwDir string
	prog  *progress
}

func runStart(ctx context.Context, stdout, stderr io.Writer, args []string) error {
	fs := cmdFlagSet("start", stdout, startUsage)
	var f startFlags
	f.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if f.model == "" {
		return fmt.Errorf("%w: --model is required", errUsage)
	}
	unlock, err := lockDataDir(f.nf.dataDir)
	if err != nil {
		return err
	}
	defer unlock()
	sr, err := f.config(stderr)
	if err != nil {
		return err
	}
	// Before the model is split and loaded: a port in use fails now.
	if err := p2p.CheckListenAddrs(sr.cfg.P2P.ListenAddrs); err != nil {
		return err
	}
	if f.threads == 0 && sr.cfg.Device.IsCPU() {
		// Auto: this process's share of the machine's CPUs, beside the
		// other meshp2p processes on it and whatever else is busy.
		if m, err := cpushare.Join(cpushare.DefaultDir()); err != nil {
			sr.log.Warn("cannot share the CPUs with other meshp2p processes here; using every CPU", "err", err)
		} else {
			defer m.Leave()
			sr.cfg.ThreadShare = m
		}
	}
	n, err := node.Start(ctx, sr.cfg)
	sr.prog.finish()
	if err != nil {
		return err
	}
	defer n.Close()
	return f.serve(ctx, stdout, sr, n)
}

// config turns the flags into the node's configuration.
func (f *startFlags) config(stderr io.Writer) (*startRun, error) {
	pc, err := f.nf.config(node.PresetHome)
	if err != nil {
		return nil, err
	}
	var rng *gguf.Range
	if f.layers != "" {
		rs, err := gguf.ParseRanges(f.layers)
		if err != nil || len(rs) != 1 {
			return nil, fmt.Errorf("%w: --layers %q: %s", errUsage, f.layers, layersHelp)
		}
		rng = &rs[0]
	}
	models, err := expandModels(f.model)
	if err != nil {
		return nil, err
	}
	if len(models) > 1 {
		switch {
		case rng != nil:
			return nil, fmt.Errorf("%w: --model with %d models: the node chooses which one and its layers; drop --layers (give --memory)", errUsage, len(models))
		case f.name != "":
			return nil, fmt.Errorf("%w: --model with %d models: each is advertised under its file name; drop --name", errUsage, len(models))
		case f.draft != "":
			return nil, fmt.Errorf("%w: --model with %d models: a --draft model proposes for one model's vocabulary; drop --draft", errUsage, len(models))
		case len(models) > route.MaxOffers+1:
			return nil, fmt.Errorf("%w: --model with %d models: a node serves one and offers at most %d others", errUsage, len(models), route.MaxOffers)
		}
	}
	sr := &startRun{gwDir: gatewayDataDir(pc.DataDir), prog: newProgress(stderr, "splitting")}
	if sr.log, err = f.lf.logger(stderr, f.verbose); err != nil {
		return nil, err
	}
	trustedIDs, err := parsePeerIDs("--trusted-client", f.trusted)
	if err != nil {
		return nil, err
	}
	if f.af.addr != "" {
		if trustedIDs, err = trustGateway(sr.gwDir, trustedIDs); err != nil {
			return nil, err
		}
	}
	dev, err := f.df.choose(sr.log)
	if err != nil {
		return nil, err
	}
	cfg := node.Config{Device: dev, P2P: pc, ModelPath: models[0], Models: models[1:], Layers: rng, ModelName: f.name, Logger: sr.log,
		Engine: node.DefaultEngine(), Hop: session.HopConfig{Idle: f.idle, MaxSessionKV: f.sessKV, MaxSessionsPerPeer: f.peerQuota, TrustedOrigins: trustedIDs},
		SplitProgress: sr.prog.update, DirectWait: f.directWait, NoMmap: !f.mmap, DraftPath: f.draft}
	if rng == nil {
		if cfg.Placement, err = f.plf.config(); err != nil {
			return nil, err
		}
	}
	if f.directWait <= 0 {
		cfg.DirectWait = -1 // do not wait
	}
	if err := f.tf.applyHop(&cfg.P2P, &cfg.Hop); err != nil {
		return nil, err
	}
	if err := f.ff.apply(&cfg, models[0], rng, stderr); err != nil {
		return nil, err
	}
	cfg.Engine.MaxSessions, cfg.Engine.NCtx, cfg.Engine.NBatch, cfg.Engine.Threads = f.maxSess, f.nctx, f.nbatch, f.threads
	cfg.Engine.PrefixCacheCells = f.prefixCache
	if f.prefixCache < 0 {
		cfg.Engine.PrefixCacheCells = f.nctx / 2
	}
	f.mf.always = f.af.addr != "" // the API server serves /metrics too
	if cfg.Metrics, err = f.mf.metrics(); err != nil {
		return nil, err
	}
	f.af.metrics = cfg.Metrics
	if f.model != "" {
		f.af.models = models // the gateway audits hops with the node's model files
	}
	sr.cfg = cfg
	return sr, nil
}

// serve prints the started node, serves its metrics and API, writes
// node.json and runs until ctx ends.
func (f *startFlags) serve(ctx context.Context, stdout io.Writer, sr *startRun, n *node.Node) error {
	info := n.Info()
	fmt.Fprintf(stdout, "peer id:  %s\nmodel:    %s (%.16s…) layers %d-%d of %d\n", info.PeerID, info.Model, info.Fingerprint, info.Start, info.End, info.NLayer)
	if cat := n.Catalog(); cat != nil {
		fmt.Fprintf(stdout, "models:   %s (serves the ones requests ask for: one, and others whole beside it when the budget holds them; the rest are offered)\n", strings.Join(cat, ", "))
	}
	for _, a := range info.Addrs {
		fmt.Fprintf(stdout, "address:  %s\n", a)
	}
	stopMetrics, err := f.mf.serve(stdout, sr.log, func(ctx context.Context) *status.Document { return n.Status(ctx, "node") })
	if err != nil {
		return err
	}
	defer stopMetrics()
	printPlacement(stdout, n)
	trackers, err := f.tf.addrInfos()
	if err != nil {
		return err
	}
	stopAPI, err := f.af.startAPI(ctx, stdout, sr.log, n, sr.cfg.P2P, sr.gwDir, trackers)
	if err != nil {
		return err
	}
	defer stopAPI()
	p, err := n.WriteInfo()
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, joinHint(f.nf.dataDir, info.Addrs, len(sr.cfg.P2P.SwarmKey) > 0))
	fmt.Fprintf(stdout, "ready; node info in %s\n", p)
	if len(sr.cfg.P2P.Bootstrap) > 0 && n.P2P().PeerCount() == 0 {
		sr.log.Warn("ready, but no peer of the swarm is reached yet: serving alone while the bootstrap peers are retried", "bootstrap", len(sr.cfg.P2P.Bootstrap))
	}
	unlist := registerLocal(sr.log, "start", sr.cfg.P2P.DataDir, n)
	defer unlist()
	<-ctx.Done()
	sr.log.Info("shutting down: closing sessions, withdrawing advert")
	stopMetrics()
	stopAPI()
	return n.Close()
}

// newLoggerAt logs at level, or debug with verbose. Interactive commands
// (generate, status) log warnings only, so their output stays readable.
func newLoggerAt(w io.Writer, verbose bool, level slog.Level) *slog.Logger {
	if verbose {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}
