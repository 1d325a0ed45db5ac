package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/neuron-tai/meshp2p/client"
	"github.com/neuron-tai/meshp2p/client/enginevocab"
	"github.com/neuron-tai/meshp2p/demand"
	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/internal/failfile"
	"github.com/neuron-tai/meshp2p/node"
	"github.com/neuron-tai/meshp2p/node/cpushare"
	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
	"github.com/neuron-tai/meshp2p/session"
)

const generateUsage = `Usage:
  meshp2p generate --model NAME_OR_FINGERPRINT --prompt TEXT --join TOKEN|--bootstrap ADDR [flags]
  meshp2p generate --local --model FILE --prompt TEXT [flags]
  echo TEXT | meshp2p generate --model NAME_OR_FINGERPRINT --join TOKEN|--bootstrap ADDR [flags]

Generates text through the swarm: finds a route of shards covering every
layer, fetches the model's vocabulary from a peer (verified against the
fingerprint) unless --model is a local file, and streams text as it
arrives, and nothing else: --stats adds the run's statistics on stderr
(tokens, time to first token, ms/token, the route and each hop's timing),
--json prints it all as one object. The prompt comes from stdin with
--prompt -, or without --prompt when stdin is a pipe or a file (a final
newline is dropped). If a hop dies, the generation re-routes and
continues; greedy output is identical to --local, which runs the whole
model in-process.
The HTTP API (serve) runs the same code (package client): given the same
sampling flags it writes the same text. Only the defaults differ: here
top-k 40, top-p 0.95, min-p 0.05, greedy, 64 tokens, seed 42; the API
follows OpenAI's (temperature 1, top_p 1, no top-k/min-p, a random seed;
docs/api.md). The client's identity is <data-dir>/client.key (a node's
is identity.key), the same on every run.
`

func wireDTypeHelp() string {
	var parts []string
	for _, w := range frame.WireDTypes() {
		parts = append(parts, w.Name+" ("+w.Doc+")")
	}
	return strings.Join(parts, " or ")
}

type genResult struct {
	Text       string         `json:"text"`
	Tokens     []int32        `json:"tokens"`
	Route      []routeHopJSON `json:"route"`
	Reroutes   int            `json:"reroutes"`
	Stop       string         `json:"stop"`
	TTFTms     float64        `json:"ttft_ms"`
	MsPerToken float64        `json:"ms_per_token"`
	TotalMs    float64        `json:"total_ms"`
	// FirstTokenMs is from the command's start to the first token:
	// discovery, vocabulary, route and prefill included.
	FirstTokenMs float64           `json:"first_token_ms"`
	Hops         []session.HopStat `json:"hops,omitempty"`
	// NetworkMsPerToken is ms_per_token minus every hop's busy time.
	NetworkMsPerToken float64  `json:"network_ms_per_token"`
	Failures          []string `json:"failures,omitempty"`
	// RecoveryMs is each re-route's stall, from the failure to the next
	// token; Standbys the epochs that had a hot standby, Takeovers the
	// re-routes a standby took over without a prefill.
	RecoveryMs []float64 `json:"recovery_ms,omitempty"`
	Standbys   int       `json:"standbys,omitempty"`
	Takeovers  int       `json:"takeovers,omitempty"`
	Model      string    `json:"model"`
	// PromptTokens of the prompt; CachedTokens of them every hop reused
	// from its prefix cache (not computed again).
	PromptTokens int `json:"prompt_tokens"`
	CachedTokens int `json:"cached_tokens"`
	// Speculation is what speculative decoding did (swarm runs).
	Speculation *specJSON `json:"speculation,omitempty"`
	// Audit is the spot-check of this generation, when --audit-rate drew it.
	Audit *auditJSON `json:"audit,omitempty"`
}

// auditJSON reports an audit: which hop, the outcome and why.
type auditJSON struct {
	Hop      int     `json:"hop"`
	Peer     string  `json:"peer"`
	Layers   [2]int  `json:"layers"`
	Outcome  string  `json:"outcome"`
	Reason   string  `json:"reason,omitempty"`
	Windows  int     `json:"windows"`
	Exact    bool    `json:"exact"`
	ReplayMs float64 `json:"replay_ms"`
}

// specJSON reports speculation: the mode asked for, verification windows,
// proposals verified and accepted, and the most proposals one window
// carried (K) and windows in flight at once (W).
type specJSON struct {
	Mode              string  `json:"mode"`
	Proposer          string  `json:"proposer"` // what proposed: ngram, or the head's draft model
	Windows           int     `json:"windows"`
	Proposed          int     `json:"proposed"`
	Accepted          int     `json:"accepted"`
	AcceptanceRate    float64 `json:"acceptance_rate"`
	AcceptedPerWindow float64 `json:"accepted_per_window"`
	K                 int     `json:"k"`
	W                 int     `json:"w"`
}

type routeHopJSON struct {
	Peer  string `json:"peer"`
	Start int    `json:"start"`
	End   int    `json:"end"`
	Reach string `json:"reach,omitempty"`
}

func runGenerate(ctx context.Context, stdout, stderr io.Writer, args []string) error {
	g, err := parseGenerate(stdout, stderr, args)
	if err != nil {
		return err
	}
	out := &genResult{}
	start := time.Now()
	gen, err := g.open(ctx, out)
	if err != nil {
		return err
	}
	first, err := gen.run(ctx, g.promptOf(), g.textOut(stdout), out)
	gen.close()
	if err != nil {
		return err
	}
	out.TotalMs = ms(time.Since(start))
	if !first.IsZero() {
		out.FirstTokenMs = ms(first.Sub(start))
	}
	if g.asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	fmt.Fprintln(stdout)
	if g.stats {
		printSummary(stderr, out)
	}
	return nil
}

// generator runs prompts (generate runs one, chat one per turn): the whole
// model in-process (--local) or a client peer of the swarm.
type generator interface {
	// run generates for p, streaming text to onText (nil: none), and
	// reports into out; it returns when the first token came.
	run(ctx context.Context, p client.Prompt, onText func(string), out *genResult) (time.Time, error)
	close()
}

// open loads the --local model or joins the swarm.
func (g *genFlags) open(ctx context.Context, out *genResult) (generator, error) {
	if g.local {
		return g.openLocal(ctx)
	}
	return g.openSwarm(ctx, out)
}

// genFlags are generate's parsed flags.
type genFlags struct {
	fs         *flag.FlagSet
	nf         netFlags
	tf         trackerFlags
	pf         perfFlags
	af         auditFlags
	model      string
	prompt     string
	chat       bool
	chatTmpl   string // --chat-template
	maxTokens  int
	sampling   *meshp2pb.SamplingParams
	stops      []string
	local      bool
	df         deviceFlags
	mmap       bool
	asJSON     bool
	stats      bool // --stats: the summary and per-hop table on stderr
	wire       meshp2pb.DType
	spec       *meshp2pb.Speculation // --speculative (nil: off)
	standby    bool                  // --standby
	noStandby  bool                  // --standby=false given: not even for a long prompt
	wait       time.Duration
	log        *slog.Logger
	explicitDD bool // --data-dir given
}

// parseGenerate parses and checks generate's flags.
func parseGenerate(stdout, stderr io.Writer, args []string) (*genFlags, error) {
	g := &genFlags{fs: cmdFlagSet("generate", stdout, generateUsage)}
	finish := g.register(defaultGenMaxTokens)
	if err := parseFlags(g.fs, args); err != nil {
		return nil, err
	}
	if err := g.stdinPrompt(os.Stdin); err != nil {
		return nil, err
	}
	if g.model == "" || g.prompt == "" {
		return nil, fmt.Errorf("%w: --model and --prompt are required (--prompt - reads it from stdin)", errUsage)
	}
	return g, finish(stderr)
}

// register registers the flags generate and chat share on g.fs (maxTokens:
// --max-tokens' default); finish, after parsing, checks them and fills in
// what they give.
func (g *genFlags) register(maxTokens int) (finish func(stderr io.Writer) error) {
	fs := g.fs
	g.nf.register(fs, node.PresetClient)
	g.tf.registerOrigin(fs)
	fs.StringVar(&g.model, "model", "", "model name, fingerprint (or unique prefix of 16+ hex chars), or a local GGUF file")
	fs.StringVar(&g.prompt, "prompt", "", "prompt text (required); - reads it from stdin, as does no --prompt when stdin is a pipe or a file")
	fs.BoolVar(&g.chat, "chat", false, "wrap the prompt as a user message with the model's chat template")
	fs.StringVar(&g.chatTmpl, "chat-template", "", "chat template for a model whose GGUF has none (its chats are refused otherwise): chatml, or a Jinja template file; a model with its own keeps it")
	fs.IntVar(&g.maxTokens, "max-tokens", maxTokens, "most tokens to generate")
	temp := fs.Float64("temperature", 0, "sampling temperature (0: greedy)")
	topK := fs.Int("top-k", defaultGenTopK, "top-k filter when sampling (0: off)")
	topP := fs.Float64("top-p", defaultGenTopP, "top-p filter when sampling (1: off)")
	minP := fs.Float64("min-p", defaultGenMinP, "min-p filter when sampling (0: off)")
	rep := fs.Float64("repeat-penalty", 1, "repetition penalty (1: off)")
	repLastN := fs.Int("repeat-last-n", engine.DefaultRepeatLastN, "tokens the penalties look back (-1: the whole context)")
	freq := fs.Float64("frequency-penalty", 0, "OpenAI's frequency penalty over the last --repeat-last-n tokens (0: off)")
	pres := fs.Float64("presence-penalty", 0, "OpenAI's presence penalty over the last --repeat-last-n tokens (0: off)")
	seed := fs.Uint64("seed", defaultGenSeed, "sampling seed, 64 bits (same seed, same output)")
	stop := fs.String("stop", "", "comma-separated stop strings")
	fs.BoolVar(&g.local, "local", false, "run the whole --model FILE in-process (the reference for the swarm)")
	g.df.register(fs, "with --local: where the whole model runs")
	fs.BoolVar(&g.mmap, "mmap", true, "with --local: map the model file (--mmap=false reads it into memory)")
	fs.BoolVar(&g.asJSON, "json", false, "print one JSON object instead of streaming text")
	fs.BoolVar(&g.stats, "stats", false, "after the text, print the run's statistics on stderr: tokens, time to first token, ms/token, the route and each hop's timing table, speculation and audit")
	wire := fs.String("wire-dtype", frame.WireDTypes()[0].Name, "activation dtype between hops: "+wireDTypeHelp())
	specMode := fs.String("speculative", client.SpecAuto, "speculative decoding: "+client.SpecModes()+" (the head proposes tokens, by n-gram lookup or with its --draft model, and the tail verifies several per pass; auto only while it pays; the output is the same)")
	fs.BoolVar(&g.standby, "standby", false, fmt.Sprintf("keep a hot standby of one hop (a replica peer serving its layers computes the same frames), so that hop's failure costs no prefill; prompts of %d+ tokens get one anyway when a replica exists, unless --standby=false", session.DefaultStandbyAbove))
	fs.DurationVar(&g.wait, "wait", client.DefaultWait, "how long to wait for peers covering the model; a model or layers nobody serves fail sooner, once every connected peer's adverts are in (under 2 s), unless nodes are still choosing their layers")
	verbose := fs.Bool("v", false, "debug logging")
	g.pf.register(fs)
	g.af.register(fs)
	return func(stderr io.Writer) error {
		if err := g.pf.check(); err != nil {
			return err
		}
		if err := g.af.check(); err != nil {
			return err
		}
		wd, err := frame.ParseWireDType(*wire)
		if err != nil {
			return fmt.Errorf("%w: --wire-dtype: %w", errUsage, err)
		}
		g.wire = wd
		if g.spec, err = client.ParseSpeculation(*specMode); err != nil {
			return fmt.Errorf("%w: --speculative: %w", errUsage, err)
		}
		// The one sampling representation, from here to the tail (and to
		// the in-process reference): the wire's SamplingParams.
		g.sampling = &meshp2pb.SamplingParams{Temperature: float32(*temp), TopK: int32(*topK), TopP: float32(*topP), MinP: float32(*minP),
			RepeatPenalty: float32(*rep), RepeatLastN: int32(*repLastN), FrequencyPenalty: float32(*freq), PresencePenalty: float32(*pres),
			Seed: *seed}
		g.stops = splitList(*stop)
		g.log = newLoggerAt(stderr, *verbose, slog.LevelWarn)
		fs.Visit(func(f *flag.Flag) {
			g.explicitDD = g.explicitDD || f.Name == "data-dir"
			g.noStandby = g.noStandby || (f.Name == "standby" && !g.standby)
		})
		return nil
	}
}

// maxStdinPrompt is the most a prompt read from stdin may hold.
const maxStdinPrompt = 1 << 20

// stdinPrompt reads the prompt from in with --prompt -, or without
// --prompt when in is a pipe or a file (not a terminal, not /dev/null):
// `echo TEXT | meshp2p generate ...`. A final newline is dropped, so the
// prompt tokenizes as the same --prompt TEXT would.
func (g *genFlags) stdinPrompt(in *os.File) error {
	given := false
	g.fs.Visit(func(f *flag.Flag) { given = given || f.Name == "prompt" })
	if given && g.prompt != "-" {
		return nil
	}
	if !given {
		st, err := in.Stat()
		if err != nil || (st.Mode()&os.ModeNamedPipe == 0 && !st.Mode().IsRegular()) {
			return nil // a terminal or nothing: --prompt is required
		}
	}
	b, err := io.ReadAll(io.LimitReader(in, maxStdinPrompt+1))
	switch {
	case err != nil:
		return fmt.Errorf("reading the prompt from stdin: %w", err)
	case len(b) > maxStdinPrompt:
		return fmt.Errorf("%w: the prompt on stdin is over %d bytes", errUsage, maxStdinPrompt)
	}
	g.prompt = strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if g.prompt == "" && given {
		return fmt.Errorf("%w: --prompt -: stdin held no prompt", errUsage)
	}
	return nil
}

// The CLI's sampling defaults (the API follows OpenAI's: docs/api.md).
const (
	defaultGenMaxTokens = 64
	defaultGenTopK      = 40
	defaultGenTopP      = 0.95
	defaultGenMinP      = 0.05
	defaultGenSeed      = 42
)

// promptOf is the prompt --prompt and --chat ask for.
func (g *genFlags) promptOf() client.Prompt {
	if g.chat {
		return client.UserPrompt(g.prompt)
	}
	return client.Prompt{Text: g.prompt}
}

// textOut is where streamed text goes: stdout, unless --json prints it
// once at the end.
func (g *genFlags) textOut(stdout io.Writer) func(string) {
	if g.asJSON {
		return nil
	}
	return func(d string) {
		if d != "" {
			fmt.Fprint(stdout, d)
		}
	}
}

// localGen runs the whole model file in-process: the reference the
// swarm's greedy output must equal. Prompt and text go through the same
// client code as the swarm's.
type localGen struct {
	g     *genFlags
	m     *engine.Model
	v     client.Vocab
	share *cpushare.Member // this process's share of the CPUs (nil: --threads given)
}

func (g *genFlags) openLocal(ctx context.Context) (*localGen, error) {
	dev, err := g.df.choose(g.log)
	if err != nil {
		return nil, err
	}
	m, err := engine.LoadModel(ctx, g.model, engine.LoadOptions{NoMmap: !g.mmap, Device: dev})
	if err != nil {
		return nil, err
	}
	lg := &localGen{g: g, m: m, v: enginevocab.Vocab{Model: m}}
	if g.chatTmpl != "" {
		if lg.v, err = g.vocabLoad(ctx, g.model); err != nil {
			m.Close()
			return nil, err
		}
	}
	if *g.pf.threads == 0 { // auto, as start's default: this process's share of the machine
		if sm, err := cpushare.Join(cpushare.DefaultDir()); err == nil {
			lg.share = sm
		}
	}
	return lg, nil
}

func (l *localGen) close() {
	if l.share != nil {
		l.share.Leave()
	}
	if l.v != nil && l.g.chatTmpl != "" {
		l.v.Close()
	}
	l.m.Close()
}

func (l *localGen) run(ctx context.Context, p client.Prompt, onText func(string), out *genResult) (time.Time, error) {
	g := l.g
	toks, err := p.Tokens(l.v)
	if err != nil {
		return time.Time{}, promptError(err)
	}
	ec := node.DefaultEngine()
	ec.MaxSessions, ec.NCtx, ec.Logger, ec.Threads = 1, len(toks)+g.maxTokens+16, g.log, *g.pf.threads
	ec.PrefixCacheCells = 0 // one generation: nothing to reuse
	ec.NBatch = max(ec.NBatch, 2)
	if l.share != nil {
		var g *cpushare.Gate
		if ec.Threads, g = l.share.Pool(ctx); g != nil {
			ec.Gate = g
		}
	}
	sh, err := engine.NewShard(ctx, l.m, ec)
	if err != nil {
		return time.Time{}, err
	}
	defer sh.Close()
	st := client.NewStream(l.v, g.stops, onText)
	res, err := engine.RunChain(ctx, []*engine.Shard{sh}, toks, engine.ChainOptions{Steps: g.maxTokens - 1,
		Sampling: engine.SamplingFromProto(g.sampling), Chunk: *g.pf.chunk,
		Stop: func(t int32) bool { return st.Token(t) || l.m.IsEOG(t) }})
	st.End()
	if err != nil {
		return time.Time{}, err
	}
	out.Tokens, out.PromptTokens = res.Tokens, len(toks)
	out.TTFTms = ms(res.Prefill)
	if len(res.Tokens) > 1 {
		out.MsPerToken = ms(res.Decode) / float64(len(res.Tokens)-1)
	}
	out.Stop, out.Text, out.Model = st.Finish(g.maxTokens), st.Text(), g.model
	return st.FirstToken(), nil
}

// swarmGen generates through the swarm from a client peer of its own.
// A --model naming a local file is fingerprinted here and its vocabulary
// used as is; the client never opens files.
type swarmGen struct {
	g      *genFlags
	c      *client.Client
	model  string
	closer []func() // run in reverse by close
}

func (s *swarmGen) close() {
	for i := len(s.closer) - 1; i >= 0; i-- {
		s.closer[i]()
	}
}

func (g *genFlags) openSwarm(ctx context.Context, out *genResult) (_ *swarmGen, err error) {
	pc, err := g.nf.config(node.PresetClient)
	if err != nil {
		return nil, err
	}
	pc.Logger = g.log
	trackers, err := g.tf.applyOrigin(&pc)
	if err != nil {
		return nil, err
	}
	if len(pc.Bootstrap) == 0 { // nothing else finds a swarm: say so now, not after --wait
		return nil, fmt.Errorf("%w: %s", errUsage, noBootstrapHelp)
	}
	release, err := clientIdentity(&pc, g.log)
	if err != nil {
		return nil, err
	}
	s := &swarmGen{g: g, closer: []func(){release}}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	failures, saveFailures := g.failureMemory(pc.DataDir)
	s.closer = append(s.closer, saveFailures) // on errors too: a failed run is the one that learned most
	ncfg := node.Config{P2P: pc, Logger: g.log, Failures: failures}
	var models []string
	if st, err := os.Stat(g.model); err == nil && st.Mode().IsRegular() {
		models = []string{g.model} // the origin replays audited hops with it
	}
	bind := g.af.apply(&ncfg, proofBase(g.nf.network, pc.DataDir, g.explicitDD), models, trackers, g.log, func(r session.AuditReport) { out.Audit = auditOf(r) })
	n, err := node.Start(ctx, ncfg)
	if err != nil {
		return nil, err
	}
	bind(n)
	// n.WaitAudits runs before n.Close, and before the summary: the
	// audit's outcome is part of it.
	s.closer = append(s.closer, func() { n.Close() }, n.WaitAudits)
	var planner route.Planner
	if len(trackers) > 0 {
		planner = n.TrackerPlanner(trackers, g.tf.requireTracker)
	}
	o := n.Origin(planner)
	o.Chunk = *g.pf.chunk
	load, err := g.vocabLoader()
	if err != nil {
		return nil, err
	}
	if s.c, err = newClient(n, o, pc.DataDir, g.log, false, demand.WarmConfig{}, load); err != nil {
		return nil, err
	}
	s.closer = append(s.closer, func() { s.c.Close() })
	if s.model, err = g.localModel(ctx, s.c, load); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *swarmGen) run(ctx context.Context, p client.Prompt, onText func(string), out *genResult) (time.Time, error) {
	g := s.g
	var first time.Time
	res, err := s.c.Generate(ctx, client.Request{Model: s.model, Wait: g.wait, WaitForRoute: true, Prompt: p, MaxTokens: g.maxTokens,
		Sampling: g.sampling, Stops: g.stops, WireDType: g.wire, Speculation: g.spec, Standby: g.standby, NoStandby: g.noStandby, OnText: onText})
	if res != nil {
		first = res.FirstToken
		fillSwarmResult(out, res, client.SpecModeName(g.spec))
	}
	return first, promptError(err)
}

// vocabLoader loads vocabularies, giving models without a chat template
// --chat-template's.
func (g *genFlags) vocabLoader() (client.VocabLoader, error) { return chatTemplateLoader(g.chatTmpl) }

// vocabLoad loads the vocabulary of the model file at path (vocabLoader).
func (g *genFlags) vocabLoad(ctx context.Context, path string) (client.Vocab, error) {
	load, err := g.vocabLoader()
	if err != nil {
		return nil, err
	}
	return load(ctx, path)
}

// noBootstrapHelp is the error of a client started without a swarm to
// join.
const noBootstrapHelp = `--join and --bootstrap are not set, and there is no --tracker: nothing to join. Give a join token (meshp2p invite on a node's machine prints one: --join TOKEN) or a node's address: an "address:" line that meshp2p start printed (or "addrs" in its node.json), e.g. --bootstrap /ip4/192.0.2.7/tcp/4001/p2p/12D3KooW...`

// failureMemory is the client's memory of peers blamed for failed
// generations, restored from its failure file, and save, which merges it
// back into the file (internal/failfile): so a peer that made one run wait
// out the token or vocabulary timeout is avoided by the next runs until
// its avoidance ends. The file is <data dir>/failures.json with
// --data-dir, else <user cache dir>/meshp2p/<network>/failures.json (per
// network, which the default data dir is not). Without either the memory
// lasts one run.
func (g *genFlags) failureMemory(dataDir string) (m *session.FailureMemory, save func()) {
	m = session.NewFailureMemory(0, 0)
	path := filepath.Join(dataDir, failfile.FileName)
	if !g.explicitDD {
		var err error
		if path, err = failfile.CachePath(g.nf.network); err != nil {
			g.log.Warn("the failure memory lasts this run only: no cache directory", "err", err)
			return m, func() {}
		}
	}
	failfile.Load(path, m, g.log)
	return m, func() {
		if err := failfile.Save(path, m, g.log); err != nil {
			g.log.Warn("could not save the failure memory", "file", path, "err", err)
		}
	}
}

// localModel is the model name to resolve: --model as given, or the
// fingerprint of the local file it names, whose vocabulary is then used
// instead of fetching one.
func (g *genFlags) localModel(ctx context.Context, c *client.Client, load client.VocabLoader) (string, error) {
	st, err := os.Stat(g.model)
	if err != nil || !st.Mode().IsRegular() {
		return g.model, nil
	}
	f, err := gguf.Open(g.model)
	if err != nil {
		return "", err
	}
	dg, err := gguf.ComputeDigests(ctx, f, nil)
	f.Close()
	if err != nil {
		return "", err
	}
	fp := dg.Fingerprint()
	v, err := load(ctx, g.model)
	if err != nil {
		return "", err
	}
	if err := c.AddVocab(fp, len(dg.Layers), v); err != nil {
		v.Close()
		return "", err
	}
	return fp, nil
}

// newClient is the client over a client peer n (generate, serve).
func newClient(n *node.Node, o *session.Origin, dataDir string, log *slog.Logger, refresh bool, wc demand.WarmConfig, load client.VocabLoader) (*client.Client, error) {
	return client.New(client.Config{Swarm: n.P2P(), Host: n.ControlHost(), Table: n.Table(), Origin: o,
		LoadVocab: load, VocabDir: filepath.Join(dataDir, "vocab"), RefreshAdverts: refresh, Logger: log, Demand: n.DemandMeter(), Warming: wc})
}

// fillSwarmResult copies a swarm generation's report into out.
func fillSwarmResult(out *genResult, res *client.Result, mode string) {
	out.Model, out.Tokens, out.Stop, out.Text = res.Model.Fingerprint, res.Tokens, res.Finish, res.Text
	out.PromptTokens, out.CachedTokens = res.PromptTokens, res.CachedTokens
	s := res.Session
	if s == nil {
		return
	}
	out.Reroutes, out.Failures, out.Hops = s.Reroutes, s.Failures, s.HopStats
	out.Standbys, out.Takeovers = s.Standbys, s.Takeovers
	for _, d := range s.Recoveries {
		out.RecoveryMs = append(out.RecoveryMs, ms(d))
	}
	if mode != client.SpecOff {
		sp := s.Spec
		out.Speculation = &specJSON{Mode: mode, Proposer: sp.Proposer, Windows: sp.Windows, Proposed: sp.Proposed, Accepted: sp.Accepted,
			AcceptanceRate: sp.AcceptanceRate(), AcceptedPerWindow: sp.AcceptedPerWindow(), K: sp.K, W: sp.W}
	}
	out.TTFTms = ms(s.TTFT)
	if len(s.Tokens) > 1 {
		out.MsPerToken = (ms(s.Total) - ms(s.TTFT)) / float64(len(s.Tokens)-1)
		out.NetworkMsPerToken = networkMs(out.MsPerToken, out.Hops)
	}
	if s.Route != nil {
		for _, h := range s.Route.Hops {
			out.Route = append(out.Route, routeHopJSON{Peer: h.Peer.String(), Start: h.Start, End: h.End, Reach: h.Reach.String()})
		}
	}
}

// promptError names the flag at fault for the prompt's errors.
func promptError(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, client.ErrNoChatTemplate) || errors.Is(err, client.ErrChatTemplate) {
		return fmt.Errorf("--chat: %w", err)
	}
	return err
}

// printSummary is the report on stderr after the streamed text.
func printSummary(stderr io.Writer, out *genResult) {
	fmt.Fprintf(stderr, "%d tokens, stop=%s, TTFT %.1f ms, %.2f ms/token", len(out.Tokens), out.Stop, out.TTFTms, out.MsPerToken)
	if len(out.Route) == 0 {
		fmt.Fprintln(stderr)
		return
	}
	fmt.Fprintf(stderr, ", reroutes %d", out.Reroutes)
	if len(out.RecoveryMs) > 0 {
		fmt.Fprintf(stderr, " (stalled %s ms; %d taken over by a standby)", joinMs(out.RecoveryMs), out.Takeovers)
	}
	fmt.Fprintln(stderr)
	perWhat := "token"
	if sp := out.Speculation; sp != nil {
		if sp.Windows > 0 && sp.Proposed > 0 {
			perWhat = "window"
		}
		fmt.Fprintf(stderr, "speculation %s (proposer %s): %d windows, %d proposed, %d accepted (%.0f%%), %.2f accepted/window, K %d W %d\n",
			sp.Mode, sp.Proposer, sp.Windows, sp.Proposed, sp.Accepted, 100*sp.AcceptanceRate, sp.AcceptedPerWindow, sp.K, sp.W)
	}
	if a := out.Audit; a != nil {
		fmt.Fprintf(stderr, "audit: hop %d (%s, layers %d-%d) %s", a.Hop, a.Peer, a.Layers[0], a.Layers[1], a.Outcome)
		if a.Windows > 0 {
			fmt.Fprintf(stderr, ", %d windows replayed in %.0f ms (exact %v)", a.Windows, a.ReplayMs, a.Exact)
		}
		if a.Reason != "" {
			fmt.Fprintf(stderr, ": %s", a.Reason)
		}
		fmt.Fprintln(stderr)
	}
	fmt.Fprintln(stderr, "route:")
	for i, h := range out.Route {
		line := fmt.Sprintf("  %s layers %d-%d (%s)", h.Peer, h.Start, h.End, h.Reach)
		if i < len(out.Hops) {
			line += fmt.Sprintf(": %.2f ms/%s compute, prefill %.2f ms", out.Hops[i].MeanUs/1000, perWhat, float64(out.Hops[i].PrefillUs)/1000)
		}
		fmt.Fprintln(stderr, line)
	}
	printHopBreakdown(stderr, out.Hops, out.NetworkMsPerToken)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func auditOf(r session.AuditReport) *auditJSON {
	return &auditJSON{Hop: r.Hop, Peer: r.Peer.String(), Layers: [2]int{r.Start, r.End}, Outcome: string(r.Outcome), Reason: r.Reason,
		Windows: r.Windows, Exact: r.Exact, ReplayMs: ms(r.Replay)}
}

// joinMs lists durations in ms, rounded.
func joinMs(v []float64) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = strconv.FormatFloat(x, 'f', 0, 64)
	}
	return strings.Join(parts, ", ")
}
