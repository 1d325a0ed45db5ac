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
	"strings"
	"time"

	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/node"
	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
	"github.com/neuron-tai/meshp2p/session"
)

const generateUsage = `Usage:
  meshp2p generate --model NAME_OR_FINGERPRINT --prompt TEXT --bootstrap ADDR [flags]
  meshp2p generate --local --model FILE --prompt TEXT [flags]

Generates text through the swarm: finds a route of shards covering every
layer, fetches the model's vocabulary from a peer (verified against the
fingerprint) unless --model is a local file, and streams text as it
arrives. If a hop dies, the generation re-routes and continues; greedy
output is identical to --local, which runs the whole model in-process.

Flags:
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
	Model             string   `json:"model"`
}

type routeHopJSON struct {
	Peer  string `json:"peer"`
	Start int    `json:"start"`
	End   int    `json:"end"`
	Reach string `json:"reach,omitempty"`
}

func runGenerate(ctx context.Context, stdout, stderr io.Writer, args []string) error {
	fs := flag.NewFlagSet("generate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, generateUsage); fs.PrintDefaults() }
	var nf netFlags
	nf.register(fs, node.PresetClient)
	var tf trackerFlags
	tf.registerOrigin(fs)
	model := fs.String("model", "", "model name, fingerprint (or unique prefix of 16+ hex chars), or a local GGUF file")
	prompt := fs.String("prompt", "", "prompt text (required)")
	chat := fs.Bool("chat", false, "wrap the prompt as a user message with the model's chat template")
	maxTokens := fs.Int("max-tokens", 64, "most tokens to generate")
	temp := fs.Float64("temperature", 0, "sampling temperature (0: greedy)")
	topK := fs.Int("top-k", 40, "top-k filter when sampling (0: off)")
	topP := fs.Float64("top-p", 0.95, "top-p filter when sampling (1: off)")
	minP := fs.Float64("min-p", 0.05, "min-p filter when sampling (0: off)")
	rep := fs.Float64("repeat-penalty", 1, "repetition penalty (1: off)")
	repLastN := fs.Int("repeat-last-n", engine.DefaultRepeatLastN, "tokens the repetition penalty looks back (-1: the whole context)")
	seed := fs.Uint64("seed", 42, "sampling seed, 64 bits (same seed, same output)")
	stop := fs.String("stop", "", "comma-separated stop strings")
	local := fs.Bool("local", false, "run the whole --model FILE in-process (the reference for the swarm)")
	mmap := fs.Bool("mmap", true, "with --local: map the model file (--mmap=false reads it into memory)")
	asJSON := fs.Bool("json", false, "print one JSON object instead of streaming text")
	wire := fs.String("wire-dtype", frame.WireDTypes()[0].Name, "activation dtype between hops: "+wireDTypeHelp())
	wait := fs.Duration("wait", 30*time.Second, "how long to wait for peers covering the model")
	verbose := fs.Bool("v", false, "debug logging")
	var pf perfFlags
	pf.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := pf.check(); err != nil {
		return err
	}
	if *model == "" || *prompt == "" {
		fs.Usage()
		return fmt.Errorf("%w: --model and --prompt are required", errUsage)
	}
	wd, err := frame.ParseWireDType(*wire)
	if err != nil {
		return fmt.Errorf("%w: --wire-dtype: %w", errUsage, err)
	}
	// The one sampling representation, from here to the tail (and to the
	// in-process reference): the wire's SamplingParams.
	smp := &meshp2pb.SamplingParams{Temperature: float32(*temp), TopK: int32(*topK), TopP: float32(*topP), MinP: float32(*minP),
		RepeatPenalty: float32(*rep), RepeatLastN: int32(*repLastN), Seed: *seed}
	stops := splitList(*stop)
	log := newLoggerAt(stderr, *verbose, slog.LevelWarn)
	out := &genResult{}
	var vocab *engine.Model
	var printer *streamPrinter
	start := time.Now()

	if *local {
		m, err := engine.LoadModel(ctx, *model, engine.LoadOptions{NoMmap: !*mmap})
		if err != nil {
			return err
		}
		defer m.Close()
		vocab = m
		toks, err := promptTokens(m, *prompt, *chat)
		if err != nil {
			return err
		}
		ec := node.DefaultEngine()
		ec.MaxSessions, ec.NCtx, ec.Logger, ec.Threads = 1, len(toks)+*maxTokens+16, log, *pf.threads
		ec.NBatch = max(ec.NBatch, 2)
		sh, err := engine.NewShard(ctx, m, ec)
		if err != nil {
			return err
		}
		defer sh.Close()
		printer = newStreamPrinter(stdout, m, stops, !*asJSON)
		res, err := engine.RunChain(ctx, []*engine.Shard{sh}, toks, engine.ChainOptions{Steps: *maxTokens - 1, Sampling: engine.SamplingFromProto(smp), Chunk: *pf.chunk,
			Stop: func(t int32) bool { return printer.add(t) || m.IsEOG(t) }})
		if err != nil {
			return err
		}
		out.Tokens = res.Tokens
		out.TTFTms = ms(res.Prefill)
		if len(res.Tokens) > 1 {
			out.MsPerToken = ms(res.Decode) / float64(len(res.Tokens)-1)
		}
		out.Stop = stopReason(m, res.Tokens, printer, *maxTokens)
		out.Model = *model
	} else {
		pc, err := nf.config(node.PresetClient)
		if err != nil {
			return err
		}
		explicitDir := false
		fs.Visit(func(f *flag.Flag) { explicitDir = explicitDir || f.Name == "data-dir" })
		if !explicitDir { // an ephemeral identity: never collide with a local node's
			d, err := os.MkdirTemp("", "meshp2p-client-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(d)
			pc.DataDir = d
		}
		pc.Logger = log
		trackers, err := tf.applyOrigin(&pc)
		if err != nil {
			return err
		}
		n, err := node.Start(ctx, node.Config{P2P: pc, Logger: log})
		if err != nil {
			return err
		}
		defer n.Close()
		fp, nLayer, err := n.WaitForModel(ctx, *model, *wait)
		if err != nil {
			return err
		}
		out.Model = fp
		vocab, err = loadVocab(ctx, n, *model, fp, pc.DataDir)
		if err != nil {
			return err
		}
		defer vocab.Close()
		toks, err := promptTokens(vocab, *prompt, *chat)
		if err != nil {
			return err
		}
		printer = newStreamPrinter(stdout, vocab, stops, !*asJSON)
		var planner route.Planner
		if len(trackers) > 0 {
			planner = n.TrackerPlanner(trackers, tf.requireTracker)
		}
		o := n.Origin(planner)
		o.Chunk = *pf.chunk
		res, err := o.Generate(ctx, session.GenerateRequest{Fingerprint: fp, NLayer: nLayer, Prompt: toks, MaxTokens: *maxTokens,
			Sampling: smp, WireDType: wd, OnToken: printer.add})
		if res != nil {
			out.Tokens, out.Reroutes, out.Stop, out.Failures, out.Hops = res.Tokens, res.Reroutes, res.Stop, res.Failures, res.HopStats
			out.TTFTms = ms(res.TTFT)
			if len(res.Tokens) > 1 {
				out.MsPerToken = (ms(res.Total) - ms(res.TTFT)) / float64(len(res.Tokens)-1)
				out.NetworkMsPerToken = networkMs(out.MsPerToken, out.Hops)
			}
			if res.Route != nil {
				for _, h := range res.Route.Hops {
					out.Route = append(out.Route, routeHopJSON{Peer: h.Peer.String(), Start: h.Start, End: h.End, Reach: h.Reach.String()})
				}
			}
		}
		if err != nil {
			printer.flush()
			return err
		}
	}
	printer.flush()
	out.Text = printer.text()
	out.TotalMs = ms(time.Since(start))
	if !printer.first.IsZero() {
		out.FirstTokenMs = ms(printer.first.Sub(start))
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	fmt.Fprintln(stdout)
	fmt.Fprintf(stderr, "%d tokens, stop=%s, TTFT %.1f ms, %.2f ms/token", len(out.Tokens), out.Stop, out.TTFTms, out.MsPerToken)
	if len(out.Route) > 0 {
		fmt.Fprintf(stderr, ", reroutes %d\nroute:\n", out.Reroutes)
		for i, h := range out.Route {
			line := fmt.Sprintf("  %s layers %d-%d (%s)", h.Peer, h.Start, h.End, h.Reach)
			if i < len(out.Hops) {
				line += fmt.Sprintf(": %.2f ms/token compute, prefill %.2f ms", out.Hops[i].MeanUs/1000, float64(out.Hops[i].PrefillUs)/1000)
			}
			fmt.Fprintln(stderr, line)
		}
		printHopBreakdown(stderr, out.Hops, out.NetworkMsPerToken)
	} else {
		fmt.Fprintln(stderr)
	}
	return nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func promptTokens(m *engine.Model, prompt string, chat bool) ([]int32, error) {
	if chat {
		p, err := m.ApplyChatTemplate([]engine.ChatMessage{{Role: "user", Content: prompt}}, true)
		if err != nil {
			return nil, fmt.Errorf("--chat: %w", err)
		}
		return m.Tokenize(p, true, true)
	}
	return m.Tokenize(prompt, true, false)
}

func stopReason(m *engine.Model, toks []int32, p *streamPrinter, max int) string {
	switch {
	case p.stopped:
		return "stop"
	case len(toks) > 0 && m.IsEOG(toks[len(toks)-1]):
		return "eos"
	case len(toks) >= max:
		return "max_tokens"
	}
	return "stop"
}

// loadVocab uses a local model file's vocabulary when --model is one, else
// fetches the vocabulary from a peer serving the model.
func loadVocab(ctx context.Context, n *node.Node, model, fp, dir string) (*engine.Model, error) {
	if st, err := os.Stat(model); err == nil && !st.IsDir() {
		return engine.LoadModel(ctx, model, engine.LoadOptions{VocabOnly: true})
	}
	var errs []error
	for _, s := range n.Table().Shards(fp) {
		if !s.HasVocab {
			continue
		}
		fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		path, err := node.FetchVocab(fctx, n.ControlHost(), s.Peer, fp, dir)
		cancel()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		return engine.LoadModel(ctx, path, engine.LoadOptions{VocabOnly: true})
	}
	if len(errs) == 0 {
		return nil, fmt.Errorf("no peer serving model %.16s offers its vocabulary", fp)
	}
	return nil, errors.Join(errs...)
}

// streamPrinter turns tokens into text as they arrive and watches for stop
// strings. Text is held back only while it could be the start of a stop
// string.
type streamPrinter struct {
	w       io.Writer
	m       *engine.Model
	stops   []string
	live    bool
	buf     strings.Builder
	printed int
	stopped bool
	toks    []int32
	first   time.Time // when the first token arrived
}

func newStreamPrinter(w io.Writer, m *engine.Model, stops []string, live bool) *streamPrinter {
	return &streamPrinter{w: w, m: m, stops: stops, live: live}
}

// add records a token; it returns true when a stop string appeared.
func (p *streamPrinter) add(tok int32) bool {
	if p.first.IsZero() {
		p.first = time.Now()
	}
	p.toks = append(p.toks, tok)
	if p.stopped || p.m.IsEOG(tok) {
		return p.stopped
	}
	piece, err := p.m.TokenPiece(tok, false)
	if err != nil {
		return false
	}
	p.buf.WriteString(piece)
	s := p.buf.String()
	for _, st := range p.stops {
		if i := strings.Index(s[max(0, p.printed-len(st)):], st); i >= 0 {
			cut := max(0, p.printed-len(st)) + i
			p.buf.Reset()
			p.buf.WriteString(s[:cut])
			p.stopped = true
			p.flush()
			return true
		}
	}
	safe := len(s)
	for _, st := range p.stops {
		for k := min(len(st)-1, len(s)); k > 0; k-- {
			if strings.HasSuffix(s, st[:k]) {
				safe = min(safe, len(s)-k)
				break
			}
		}
	}
	if p.live && safe > p.printed {
		fmt.Fprint(p.w, s[p.printed:safe])
		p.printed = safe
	}
	return false
}

func (p *streamPrinter) flush() {
	s := p.buf.String()
	if p.live && len(s) > p.printed {
		fmt.Fprint(p.w, s[p.printed:])
		p.printed = len(s)
	}
}

func (p *streamPrinter) text() string { return p.buf.String() }
