package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/node"
	"github.com/neuron-tai/meshp2p/session"
	"github.com/neuron-tai/meshp2p/status"
)

const startUsage = `Usage: meshp2p start --model FILE|URL|NAME|FINGERPRINT [--layers A-B | --memory SIZE] [flags]

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
Once ready, the node prints its peer id and addresses and writes them to
<data-dir>/node.json. SIGINT/SIGTERM close sessions and withdraw the advert.

Flags:
`

func runStart(ctx context.Context, stdout, stderr io.Writer, args []string) error {
	fs := flag.NewFlagSet("start", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, startUsage); fs.PrintDefaults() }
	var nf netFlags
	nf.register(fs, node.PresetHome)
	var tf trackerFlags
	tf.registerHop(fs)
	model := fs.String("model", "", "whole GGUF model file, shard file, http(s) URL of one, or a model name or fingerprint to fetch from peers (required)")
	var ff fetchFlags
	ff.register(fs)
	layers := fs.String("layers", "", "layer range A-B to serve, half-open [A,B) (default: chosen from --memory and the swarm)")
	var plf placementFlags
	plf.register(fs)
	name := fs.String("name", "", "model name to advertise (default: file name)")
	def := node.DefaultEngine()
	maxSess := fs.Int("max-sessions", def.MaxSessions, "concurrent sessions this shard admits")
	nctx := fs.Int("ctx", def.NCtx, "KV cells shared by all sessions")
	nbatch := fs.Int("batch", def.NBatch, "most rows per llama_decode")
	threads := fs.Int("threads", 0, "compute threads (default: all CPUs)")
	flash := fs.Bool("flash-attn", false, "flash attention (faster on long contexts; not bit-exact across KV layouts)")
	idle := fs.Duration("idle-timeout", 60*time.Second, "free a session after this long without frames")
	sessKV := fs.Int("max-session-kv", 0, "KV cells (tokens) one session may reserve here (0: half of --ctx, so one client cannot take the whole cache; -1: up to --ctx)")
	peerQuota := fs.Int("max-sessions-per-client", 0, "sessions one client may hold at once when this node is the head (0: half of --max-sessions; -1: no quota)")
	var trusted listFlag
	fs.Var(&trusted, "trusted-client", "peer id of a client the per-client quota does not apply to, e.g. your API gateway (meshp2p serve), which carries many users' sessions (repeatable or comma-separated)")
	directWait := fs.Duration("direct-wait", node.DirectWait, "how long a new seam to a peer reached through a relay waits for a hole punch (0: start on the relay; the seam moves to the direct connection once it appears)")
	verbose := fs.Bool("v", false, "debug logging")
	var lf logFormat
	lf.register(fs)
	var mf metricsFlag
	mf.register(fs)
	mmap := fs.Bool("mmap", true, "map the shard file; --mmap=false reads it into memory (containers with a memory limit: mapped page cache is not charged to the container)")
	var af apiFlags
	af.register(fs, "", "also serve the OpenAI-compatible HTTP API on this host:port, e.g. 127.0.0.1:8080 (see meshp2p serve; default: off)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *model == "" {
		fs.Usage()
		return fmt.Errorf("%w: --model is required", errUsage)
	}
	pc, err := nf.config(node.PresetHome)
	if err != nil {
		return err
	}
	var rng *gguf.Range
	if *layers != "" {
		rs, err := gguf.ParseRanges(*layers)
		if err != nil || len(rs) != 1 {
			return fmt.Errorf("%w: --layers %q: want one range A-B", errUsage, *layers)
		}
		rng = &rs[0]
	}
	log, err := lf.logger(stderr, *verbose)
	if err != nil {
		return err
	}
	trustedIDs, err := parsePeerIDs("--trusted-client", trusted)
	if err != nil {
		return err
	}
	gwDir := gatewayDataDir(pc.DataDir)
	if af.addr != "" {
		if trustedIDs, err = trustGateway(gwDir, trustedIDs); err != nil {
			return err
		}
	}
	prog := newProgress(stderr, "splitting")
	cfg := node.Config{P2P: pc, ModelPath: *model, Layers: rng, ModelName: *name, Logger: log,
		Engine: def, Hop: session.HopConfig{Idle: *idle, MaxSessionKV: *sessKV, MaxSessionsPerPeer: *peerQuota, TrustedOrigins: trustedIDs},
		SplitProgress: prog.update, DirectWait: *directWait, NoMmap: !*mmap}
	if rng == nil {
		if cfg.Placement, err = plf.config(); err != nil {
			return err
		}
	}
	if *directWait <= 0 {
		cfg.DirectWait = -1 // do not wait
	}
	if err := tf.applyHop(&cfg.P2P, &cfg.Hop); err != nil {
		return err
	}
	if err := ff.apply(&cfg, *model, rng, stderr); err != nil {
		return err
	}
	cfg.Engine.MaxSessions, cfg.Engine.NCtx, cfg.Engine.NBatch, cfg.Engine.Threads, cfg.Engine.FlashAttn = *maxSess, *nctx, *nbatch, *threads, *flash
	mf.always = af.addr != "" // the API server serves /metrics too
	if cfg.Metrics, err = mf.metrics(); err != nil {
		return err
	}
	af.metrics = cfg.Metrics
	n, err := node.Start(ctx, cfg)
	prog.finish()
	if err != nil {
		return err
	}
	defer n.Close()
	info := n.Info()
	fmt.Fprintf(stdout, "peer id:  %s\nmodel:    %s (%.16s…) layers %d-%d of %d\n", info.PeerID, info.Model, info.Fingerprint, info.Start, info.End, info.NLayer)
	for _, a := range info.Addrs {
		fmt.Fprintf(stdout, "address:  %s\n", a)
	}
	stopMetrics, err := mf.serve(stdout, log, func(ctx context.Context) *status.Document { return n.Status(ctx, "node") })
	if err != nil {
		return err
	}
	defer stopMetrics()
	printPlacement(stdout, n)
	trackers, err := tf.addrInfos()
	if err != nil {
		return err
	}
	stopAPI, err := af.startAPI(ctx, stdout, log, n, pc, gwDir, trackers)
	if err != nil {
		return err
	}
	defer stopAPI()
	p, err := n.WriteInfo()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "ready; node info in %s\n", p)
	<-ctx.Done()
	log.Info("shutting down: closing sessions, withdrawing advert")
	stopMetrics()
	stopAPI()
	return n.Close()
}

func newLogger(w io.Writer, verbose bool) *slog.Logger {
	return newLoggerAt(w, verbose, slog.LevelInfo)
}

// newLoggerAt logs at level, or debug with verbose. Interactive commands
// (generate, status) log warnings only, so their output stays readable.
func newLoggerAt(w io.Writer, verbose bool, level slog.Level) *slog.Logger {
	if verbose {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}
