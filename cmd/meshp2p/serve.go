package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/api"
	"github.com/neuron-tai/meshp2p/chattmpl"
	"github.com/neuron-tai/meshp2p/client"
	"github.com/neuron-tai/meshp2p/client/enginevocab"
	"github.com/neuron-tai/meshp2p/demand"
	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/internal/failfile"
	"github.com/neuron-tai/meshp2p/metrics"
	"github.com/neuron-tai/meshp2p/node"
	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/route"
)

const serveUsage = `Usage: meshp2p serve --join TOKEN|--bootstrap ADDR [--api 127.0.0.1:8080] [flags]

Serves the swarm over HTTP in the shapes agents, editors and SDKs speak
(docs/api.md), all through one backend: a long-lived client peer that holds
no weights, keeps its capability table warm and runs each request as a
route session, re-routing around hops that die.

  OpenAI     http://ADDR/v1      chat/completions (tools, response_format,
                                 logprobs), completions, models, responses
  Anthropic  http://ADDR         POST /v1/messages (Claude Code:
                                 ANTHROPIC_BASE_URL=http://ADDR)
  Ollama     http://ADDR         /api/chat, /api/generate, /api/tags,
                                 /api/show, /api/version

The API listens on loopback unless --api names another address; --api-key
(or $MESHP2P_API_KEY) then protects every model endpoint: "Authorization:
Bearer KEY" (Anthropic's "x-api-key: KEY" too). The gateway's peer id (for
the nodes' --trusted-client) lasts: its key is <data-dir>/client.key.
`

// apiFlags are the HTTP API flags of serve and start.
type apiFlags struct {
	addr      string
	key       string
	cors      string
	maxActive int
	maxQueue  int
	maxTokens int
	maxBody   int64
	spec      string // --speculative
	chatTmpl  string // --chat-template
	warmWait  time.Duration
	audit     auditFlags
	// models are whole model files the gateway may replay audited hops
	// with (start --api: the node's --model).
	models []string
	// metrics is the process's registry (start --api: the node's); the API
	// server serves it at /metrics with the status document and dashboard.
	metrics *metrics.Metrics
}

func (f *apiFlags) register(fs *flag.FlagSet, defAddr, what string) {
	fs.StringVar(&f.addr, "api", defAddr, what)
	fs.StringVar(&f.key, "api-key", "", "require Authorization: Bearer KEY (or x-api-key: KEY on /v1/messages) on every model endpoint (default: $MESHP2P_API_KEY; empty: no key)")
	fs.StringVar(&f.cors, "cors-origin", "", "comma-separated origins browsers may call the API from (* for any); default: no CORS headers")
	fs.IntVar(&f.maxActive, "api-max-active", api.DefaultMaxActive, "generations the API runs at once")
	fs.IntVar(&f.maxQueue, "api-queue", api.DefaultMaxQueue, "generations waiting for a slot; beyond that: 429 with Retry-After (-1: no queue)")
	fs.IntVar(&f.maxTokens, "api-max-tokens", api.DefaultChatMaxTokens, "a chat completion's max_tokens when the request gives none")
	fs.Int64Var(&f.maxBody, "api-max-body", api.DefaultMaxBody, "largest request body in bytes (413 beyond)")
	fs.DurationVar(&f.warmWait, "warm-timeout", demand.DefaultWarmTimeout, "how long requests for a model nobody serves but standby peers offer to load are answered 503 model_warming (Retry-After); after that, 404 for "+demand.DefaultWarmCooldown.String())
	fs.StringVar(&f.spec, "speculative", client.SpecAuto, "speculative decoding for API requests: "+client.SpecModes()+" (same output; auto only while it pays)")
	fs.StringVar(&f.chatTmpl, "chat-template", "", "chat template for models whose GGUF has none (their chats are refused otherwise): chatml, or a Jinja template file; models with their own keep it")
	f.audit.register(fs)
}

// vocabLoader loads the models' vocabularies, giving those without a chat
// template --chat-template's.
func (f *apiFlags) vocabLoader() (client.VocabLoader, error) { return chatTemplateLoader(f.chatTmpl) }

// chatTemplateLoader loads vocabularies, giving models without a chat
// template tmpl's (--chat-template: "" none, chatml, or a Jinja file).
func chatTemplateLoader(tmpl string) (client.VocabLoader, error) {
	src := tmpl
	switch src {
	case "":
		return enginevocab.Load, nil
	case "chatml":
		src = chattmpl.ChatML
	default:
		b, err := os.ReadFile(src)
		if err != nil {
			return nil, fmt.Errorf("--chat-template: %w", err)
		}
		src = string(b)
	}
	load, err := enginevocab.LoadWithTemplate(src)
	if err != nil {
		return nil, fmt.Errorf("%w: --chat-template %s: %w", errUsage, tmpl, err)
	}
	return load, nil
}

// run serves the API for gateway node c (a client peer; its vocabularies
// go under dataDir) until ctx ends (stop ends it sooner). It prints the base URL once listening. Each mount may add
// handlers beside /v1/ (api.Server.Handle; outside the API key).
func (f *apiFlags) run(ctx context.Context, stdout io.Writer, log *slog.Logger, c *node.Node, dataDir string, planner route.Planner, mounts ...func(*api.Server)) (stop func(), err error) {
	key := f.key
	if key == "" {
		key = os.Getenv("MESHP2P_API_KEY")
	}
	spec, err := client.ParseSpeculation(f.spec)
	if err != nil {
		return nil, fmt.Errorf("%w: --speculative: %w", errUsage, err)
	}
	ln, err := net.Listen("tcp", f.addr)
	if err != nil {
		return nil, fmt.Errorf("--api %s: %w", f.addr, err)
	}
	if tcp, ok := ln.Addr().(*net.TCPAddr); ok && !tcp.IP.IsLoopback() && key == "" {
		log.Warn("the API listens beyond loopback without --api-key: anyone who reaches it can use the swarm", "addr", ln.Addr().String())
	}
	if f.warmWait <= 0 {
		ln.Close()
		return nil, fmt.Errorf("%w: --warm-timeout must be positive", errUsage)
	}
	load, err := f.vocabLoader()
	if err != nil {
		ln.Close()
		return nil, err
	}
	cl, err := newClient(c, c.Origin(planner), dataDir, log, true, demand.WarmConfig{Timeout: f.warmWait}, load)
	if err != nil {
		ln.Close()
		return nil, err
	}
	g := api.NewSwarm(cl, api.SwarmConfig{MaxTokens: f.maxTokens, WireDType: frame.WireDTypes()[0].DType, Speculation: spec})
	srv := api.New(api.Config{Backend: g, APIKey: key, CORSOrigins: splitList(f.cors), MaxActive: f.maxActive, MaxQueue: f.maxQueue,
		MaxBody: f.maxBody, Logger: log, OllamaVersion: strings.TrimPrefix(engine.OllamaVersion, "v")})
	for _, m := range mounts {
		m(srv)
	}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(sctx, ln) }()
	fmt.Fprintf(stdout, "api:      http://%s/v1\n", ln.Addr())
	fmt.Fprintf(stdout, "anthropic and ollama: http://%s\n", ln.Addr())
	return func() {
		cancel()
		if err := <-done; err != nil {
			log.Warn("api server", "err", err)
		}
		cl.Close()
	}, nil
}

func runServe(ctx context.Context, stdout, stderr io.Writer, args []string) error {
	fs := cmdFlagSet("serve", stdout, serveUsage)
	var nf netFlags
	nf.register(fs, node.PresetClient)
	var tf trackerFlags
	tf.registerOrigin(fs)
	var af apiFlags
	af.register(fs, defaultAPIAddr, "HTTP address of the OpenAI-compatible API (host:port; loopback by default)")
	verbose := fs.Bool("v", false, "debug logging")
	var lf logFormat
	lf.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := af.audit.check(); err != nil {
		return err
	}
	pc, err := nf.config(node.PresetClient)
	if err != nil {
		return err
	}
	if len(pc.Bootstrap) == 0 && len(tf.trackers) == 0 {
		return fmt.Errorf("%w: --join or --bootstrap (or --tracker) is required: the gateway serves what the swarm serves", errUsage)
	}
	explicitDir := false
	fs.Visit(func(f *flag.Flag) { explicitDir = explicitDir || f.Name == "data-dir" })
	log, err := lf.logger(stderr, *verbose)
	if err != nil {
		return err
	}
	pc.Logger = log
	release, err := clientIdentity(&pc, log)
	if err != nil {
		return err
	}
	defer release()
	trackers, err := tf.applyOrigin(&pc)
	if err != nil {
		return err
	}
	m := metrics.New()
	ncfg := node.Config{P2P: pc, Logger: log, Metrics: m}
	bind := af.audit.apply(&ncfg, proofBase(nf.network, pc.DataDir, explicitDir), nil, trackers, log, nil)
	n, err := node.Start(ctx, ncfg)
	if err != nil {
		return err
	}
	bind(n)
	defer n.Close()
	var planner route.Planner
	if len(trackers) > 0 {
		planner = n.TrackerPlanner(trackers, tf.requireTracker)
	}
	stop, err := af.run(ctx, stdout, log, n, pc.DataDir, planner, dashboardMount(m, n, "gateway", log))
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "peer id:  %s\nready\n", n.P2P().ID())
	unlist := registerLocal(log, "serve", pc.DataDir, n)
	defer unlist()
	<-ctx.Done()
	log.Info("shutting down the API")
	stop()
	return nil
}

// startAPI serves the API from a `start` node (--api). A host cannot open
// a route session to itself, so the gateway is a client peer of its own,
// in this process, bootstrapped to the node (and to the node's bootstrap
// peers). It returns a stop function, or nil when --api is not set.
//
// The gateway peer keeps its identity in gatewayDir (gatewayDataDir), so
// its peer id is stable and the node can trust it (--trusted-client, set
// by runStart); with trackers it plans routes by ticket, as serve does.
func (f *apiFlags) startAPI(ctx context.Context, stdout io.Writer, log *slog.Logger, n *node.Node, hostCfg p2p.Config, gatewayDir string, trackers []peer.AddrInfo) (func(), error) {
	if f.addr == "" {
		return func() {}, nil
	}
	pc := node.Preset(node.PresetClient)
	pc.TestMode = hostCfg.TestMode // --test-mode's relaxations, as the node has them
	pc.Network, pc.SwarmKey, pc.SwarmKeyPath, pc.Logger = hostCfg.Network, hostCfg.SwarmKey, hostCfg.SwarmKeyPath, log
	pc.ListenAddrs = []string{"/ip4/127.0.0.1/tcp/0"}
	pc.PortMapping = false
	pc.Bootstrap = mergePeers([]peer.AddrInfo{n.P2P().AddrInfo()}, hostCfg.Bootstrap)
	pc.StaticRelays = hostCfg.StaticRelays
	pc.DataDir = gatewayDir
	// The gateway peer shares the node's metrics and status recorder: the
	// API server's /metrics and dashboard show the node and its origin.
	gcfg := node.Config{P2P: pc, Logger: log.With("part", "api-gateway"), Metrics: f.metrics, Recorder: n.Recorder()}
	bind := f.audit.apply(&gcfg, gatewayDir, f.models, trackers, log, nil)
	c, err := node.Start(ctx, gcfg)
	if err != nil {
		return nil, fmt.Errorf("--api: gateway peer: %w", err)
	}
	bind(c)
	fmt.Fprintf(stdout, "api peer: %s (trusted here; pass it to other heads as --trusted-client)\n", c.P2P().ID())
	var planner route.Planner
	if len(trackers) > 0 {
		planner = c.TrackerPlanner(trackers, false)
	}
	// Wait briefly for this node's own advert, so the API lists its model
	// as soon as the swarm covers it.
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	for wctx.Err() == nil && len(c.Table().Shards(n.Fingerprint())) == 0 {
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	stop, err := f.run(ctx, stdout, log, c, gatewayDir, planner, dashboardMount(f.metrics, n, "node", log))
	if err != nil {
		c.Close()
		return nil, err
	}
	var once sync.Once
	return func() { once.Do(func() { stop(); c.Close() }) }, nil
}

// gatewayDataDir is where a `start --api` node keeps its gateway peer's
// identity.
func gatewayDataDir(dataDir string) string { return filepath.Join(dataDir, "api-gateway") }

// trustGateway creates (or reads) the identity of the gateway peer that
// `start --api` runs in gatewayDir and adds its id to trusted: the node's
// own API is not held to its per-client quota.
func trustGateway(gatewayDir string, trusted map[peer.ID]bool) (map[peer.ID]bool, error) {
	key, _, err := p2p.LoadOrCreateIdentity(gatewayDir)
	if err != nil {
		return nil, fmt.Errorf("--api: gateway identity: %w", err)
	}
	id, err := peer.IDFromPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("--api: gateway identity: %w", err)
	}
	if trusted == nil {
		trusted = map[peer.ID]bool{}
	}
	trusted[id] = true
	return trusted, nil
}

// defaultAPIAddr is serve's --api: loopback, so nothing is exposed unless
// asked for.
const defaultAPIAddr = "127.0.0.1:8080"

// proofBase is the directory proofs go under: the data dir, or the user's
// cache directory when no --data-dir was given.
func proofBase(network, dataDir string, explicit bool) string {
	if !explicit {
		if p, err := failfile.CachePath(network); err == nil {
			return filepath.Dir(p)
		}
	}
	return dataDir
}
