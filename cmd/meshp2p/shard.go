package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/engine/gguf"
)

const shardUsage = `Usage:
  meshp2p shard inspect [--json] [--no-fingerprint] FILE
        summarise a GGUF model or shard (architecture, geometry, fingerprint)
  meshp2p shard split (--ranges 0-3,3-6 | --even K | --first K) [-o DIR] [--json] FILE
        write one shard GGUF per half-open layer range [a,b) as DIR/<base>.L<a>-<b>.gguf;
        --first K: the model cut to its first K layers as DIR/<base>.first<K>.gguf, a whole
        model with the same vocabulary (a self-draft for start --draft)
  meshp2p shard synth [--arch llama|qwen2|qwen3|qwen3moe|...] [geometry flags] -o FILE
        write a random-weight model (see 'meshp2p shard synth --help')
  meshp2p shard verify [--splits 2,3] [--tokens N] [--prompt TEXT] [--json] FILE
        split a whole model evenly 2 and 3 ways (in a temp dir), run the whole model and
        each chain of shards in-process on the same prompt and greedy steps, and report
        the max |logit difference| per split; fails unless the results are identical
  meshp2p shard ls [--data-dir DIR] [--json]
        list the shard cache (<data-dir>/shards): shards, manifests, unfinished fetches
  meshp2p shard rm [--data-dir DIR] FILE | MODEL[:A-B]
        remove a cached file, a model's shard of layers A-B, or all of a model's cache
`

// runShard implements "meshp2p shard inspect|split|synth|verify".
func runShard(ctx context.Context, stdout, stderr io.Writer, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: shard needs a subcommand (inspect, split, synth, verify, ls or rm)", errUsage)
	}
	switch args[0] {
	case "inspect":
		return runShardInspect(ctx, stdout, stderr, args[1:])
	case "split":
		return runShardSplit(ctx, stdout, stderr, args[1:])
	case "synth":
		return runShardSynth(ctx, stdout, stderr, args[1:])
	case "verify":
		return runShardVerify(ctx, stdout, stderr, args[1:])
	case "ls":
		return runShardLs(ctx, stdout, stderr, args[1:])
	case "rm":
		return runShardRm(ctx, stdout, stderr, args[1:])
	case "-h", "--help", "help":
		fmt.Fprint(stdout, shardUsage)
		return nil
	default:
		return fmt.Errorf("%w: unknown shard subcommand %q", errUsage, args[0])
	}
}

// parseInterspersed parses flags that may come before or after positional
// arguments and returns the positionals, which must number exactly nPos.
func parseInterspersed(fs *flag.FlagSet, args []string, nPos int, what string) ([]string, error) {
	var pos []string
	for {
		if err := parseArgs(fs, args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(pos) != nPos {
		return nil, fmt.Errorf("%w: want %s, got %d argument(s)", errUsage, what, len(pos))
	}
	return pos, nil
}

func runShardInspect(ctx context.Context, stdout, stderr io.Writer, args []string) error {
	fs := cmdFlagSet("shard inspect", stdout, "")
	asJSON := fs.Bool("json", false, "print JSON")
	noFP := fs.Bool("no-fingerprint", false, "skip the fingerprint (it reads every tensor)")
	pos, err := parseInterspersed(fs, args, 1, "one GGUF file")
	if err != nil {
		return err
	}
	in, err := gguf.Inspect(ctx, pos[0], !*noFP)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeIndented(stdout, in)
	}
	printInfo(stdout, pos[0], in)
	return nil
}

func printInfo(w io.Writer, path string, in *gguf.Info) {
	row := func(k, format string, args ...any) {
		fmt.Fprintf(w, "%-13s "+format+"\n", append([]any{k}, args...)...)
	}
	row("file", "%s (%s)", path, humanBytes(in.FileSize))
	row("architecture", "%s", in.Architecture)
	row("support", "%s", in.Support)
	if in.Cuts != "" {
		row("cut points", "%s", in.Cuts)
	} else if in.Certified {
		row("cut points", "any layer")
	}
	if in.Name != "" {
		row("name", "%s", in.Name)
	}
	row("layers", "%d", in.NLayer)
	row("embd", "%d", in.NEmbd)
	row("heads", "%d (kv %d)", in.NHead, in.NHeadKV)
	row("ff", "%d", in.NFF)
	if in.NExpert > 0 {
		row("experts", "%d (used %d, ff %d)", in.NExpert, in.NExpertUsed, in.NFFExpert)
	}
	row("vocab", "%d (tokenizer %q)", in.VocabSize, in.Tokenizer)
	row("context", "%d", in.ContextLength)
	types := make([]string, 0, len(in.TensorTypes))
	for t, n := range in.TensorTypes {
		types = append(types, fmt.Sprintf("%s %d", t, n))
	}
	sort.Strings(types)
	row("tensors", "%d (%s)", in.TensorCount, strings.Join(types, ", "))
	row("params", "%s", humanCount(in.Params))
	if len(in.LayerBytes) > 0 {
		lo, hi := in.LayerBytes[0], in.LayerBytes[0]
		for _, b := range in.LayerBytes {
			lo, hi = min(lo, b), max(hi, b)
		}
		if lo == hi {
			row("layer bytes", "%s each", humanBytes(lo))
		} else {
			row("layer bytes", "%s .. %s", humanBytes(lo), humanBytes(hi))
		}
	}
	row("global bytes", "%s", humanBytes(in.GlobalBytes))
	if in.TiedOutput {
		row("output", "tied to token_embd")
	} else {
		row("output", "separate output.weight")
	}
	if in.Fingerprint != "" {
		row("fingerprint", "%s", in.Fingerprint)
	}
	if s := in.Shard; s != nil {
		row("shard", "layers %v of %d (%s), claimed parent %s", s.Range, s.ParentNLayer, s.Role, s.ParentFingerprint)
	}
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

func humanCount(n uint64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.2fB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.2fM", float64(n)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.1fK", float64(n)/1e3)
	}
	return fmt.Sprint(n)
}

func runShardSplit(ctx context.Context, stdout, stderr io.Writer, args []string) error {
	fs := cmdFlagSet("shard split", stdout, "")
	rangesFlag := fs.String("ranges", "", "comma-separated half-open layer ranges, e.g. 0-3,3-6")
	even := fs.Int("even", 0, "split into K ranges, as even as the architecture's cut rules allow, instead of --ranges")
	first := fs.Int("first", 0, "instead: write the model cut to its first K layers, a standalone model with the same vocabulary (a self-draft for start --draft)")
	outDir := fs.String("o", ".", "output directory")
	asJSON := fs.Bool("json", false, "print the results as JSON")
	pos, err := parseInterspersed(fs, args, 1, "one source GGUF file")
	if err != nil {
		return err
	}
	src := pos[0]
	var ranges []gguf.Range
	switch {
	case *first != 0 && (*rangesFlag != "" || *even != 0):
		return fmt.Errorf("%w: use --first alone, without --ranges or --even", errUsage)
	case *first != 0:
		return shardFirst(ctx, stdout, src, *first, *outDir, *asJSON)
	case *rangesFlag != "" && *even != 0:
		return fmt.Errorf("%w: use --ranges or --even, not both", errUsage)
	case *rangesFlag != "":
		if ranges, err = gguf.ParseRanges(*rangesFlag); err != nil {
			return fmt.Errorf("%w: --ranges: %v", errUsage, err)
		}
	case *even > 0:
		if ranges, err = legalEvenSplit(src, *even); err != nil {
			return err
		}
	default:
		return fmt.Errorf("%w: --ranges or --even K is required", errUsage)
	}
	prog := newProgress(stderr, "split "+filepath.Base(src))
	res, err := gguf.Split(ctx, src, ranges, *outDir, prog.update)
	prog.finish()
	if errors.Is(err, gguf.ErrBadRange) {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if err != nil {
		return err
	}
	if *asJSON {
		return writeIndented(stdout, res)
	}
	for _, r := range res {
		fmt.Fprintf(stdout, "%s\tlayers %v (%s)\t%s\tmodel %s\n", r.Path, r.Range, r.Role, humanBytes(r.Size), r.Fingerprint)
	}
	return nil
}

// shardFirst writes src cut to its first k layers (split --first).
func shardFirst(ctx context.Context, stdout io.Writer, src string, k int, outDir string, asJSON bool) error {
	res, err := gguf.Truncate(ctx, src, k, filepath.Join(outDir, gguf.TruncateName(src, k)))
	if errors.Is(err, gguf.ErrBadRange) {
		return fmt.Errorf("%w: --first: %v", errUsage, err)
	}
	if err != nil {
		return err
	}
	if asJSON {
		return writeIndented(stdout, res)
	}
	fmt.Fprintf(stdout, "%s\tfirst %d layers (a whole model)\t%s\tmodel %s\n", res.Path, res.Range.End, humanBytes(res.Size), res.Fingerprint)
	return nil
}

// writeIndented writes v as indented JSON (the --json outputs).
func writeIndented(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// legalEvenSplit is the model at path split k ways as evenly as its
// architecture's cut rules allow (gguf.LegalSplit).
func legalEvenSplit(path string, k int) ([]gguf.Range, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	n, err := f.NLayer()
	if err != nil {
		return nil, err
	}
	return gguf.LegalSplit(f.Metadata, n, k)
}

// quantTypes are the quantizations synth can produce through the engine
// (engine.Quantize; gguf.CheckQuantizable knows their geometry rules).
var quantTypes = map[string]bool{string(engine.QuantQ8_0): true, string(engine.QuantQ4_0): true, string(engine.QuantQ6_K): true, string(engine.QuantQ4_KM): true,
	string(engine.QuantMXFP4): true}

// quantizeFile quantizes the whole-model GGUF at in into out with llama.cpp
// (engine.Quantize: typ "q8_0", "q4_0", "q6_k", "q4_k_m", "mxfp4_moe" or "f16"), writing out atomically.
// A geometry or file the quantizer cannot take (plain Q8_0 needs rows that
// are multiples of 32, shards, already-quantized tensors, metadata that
// would abort llama.cpp) gets a clear error before any quantization work.
func quantizeFile(ctx context.Context, in, out, typ string) error {
	f, err := gguf.Open(in)
	if err != nil {
		return err
	}
	err = gguf.CheckQuantizable(f, typ)
	f.Close()
	if err != nil {
		return err
	}
	return engine.Quantize(ctx, in, out, engine.QuantType(strings.ToLower(typ)))
}

func runShardSynth(ctx context.Context, stdout, stderr io.Writer, args []string) error {
	fs := cmdFlagSet("shard synth", stdout, "")
	sf := registerSynthFlags(fs)
	if _, err := parseInterspersed(fs, args, 0, "no positional arguments"); err != nil {
		return err
	}
	if *sf.out == "" {
		return fmt.Errorf("%w: -o FILE is required", errUsage)
	}
	spec, quant, err := sf.spec(fs)
	if err != nil {
		return err
	}
	return synthFile(ctx, stdout, stderr, spec, quant, *sf.out)
}

// synthFlags are the flags of "shard synth". The geometry flags default
// to 0 or -1 (not set): the architecture's gguf.DefaultSpec applies then,
// and the help text quotes it.
type synthFlags struct {
	arch, vocabFrom, typ, name, out *string
	layers, embd, heads, kvHeads    *int
	ff, experts, expertsUsed        *int
	expertFF, ctxLen                *int
	tied                            *bool
	seed                            *uint64
	// the architectures' own (archFlags)
	ds map[string]*int
}

// archFlags are the architecture-specific geometry flags: the
// architecture whose default the help quotes, and the Spec field each
// sets.
var archFlags = []struct {
	arch, name, usage string
	field             func(*gguf.Spec) *int
}{
	{"deepseek2", "dense-lead", "deepseek2, glm4moe: leading dense layers", func(s *gguf.Spec) *int { return &s.DenseLead }},
	{"deepseek2", "shared-experts", "deepseek2, glm4moe, qwen3next: shared experts", func(s *gguf.Spec) *int { return &s.SharedExperts }},
	{"deepseek2", "q-lora", "q LoRA rank", func(s *gguf.Spec) *int { return &s.QLoraRank }},
	{"deepseek2", "kv-lora", "kv LoRA rank (the latent KV)", func(s *gguf.Spec) *int { return &s.KVLoraRank }},
	{"deepseek2", "rope-dim", "deepseek2, glm4moe, minimax-m2, qwen3next: roped dims of a q/k head", func(s *gguf.Spec) *int { return &s.RopeDim }},
	{"deepseek2", "nope-dim", "other dims of a q/k head", func(s *gguf.Spec) *int { return &s.NopeDim }},
	{"deepseek2", "v-dim", "value head dims", func(s *gguf.Spec) *int { return &s.VDim }},
	{"deepseek2", "expert-groups", "expert groups (0: none)", func(s *gguf.Spec) *int { return &s.ExpertGroups }},
	{"deepseek2", "expert-groups-used", "expert groups kept per token", func(s *gguf.Spec) *int { return &s.ExpertGroupsUsed }},
	{"gpt-oss", "head-dim", "gpt-oss, gemma3, glm4moe, qwen3next: q/k/v dims of a head", func(s *gguf.Spec) *int { return &s.HeadDim }},
	{"gpt-oss", "sliding-window", "gpt-oss, gemma3, llama4: the sliding layers' window (gemma3: 0 = none; llama4: > 0 = chunked attention)", func(s *gguf.Spec) *int { return &s.SlidingWindow }},
	{"llama4", "moe-step", "experts on every N-th layer (interleave_moe_layer_step)", func(s *gguf.Spec) *int { return &s.MoEStep }},
	{"qwen3next", "ssm-state", "gated delta net head dims (ssm.state_size)", func(s *gguf.Spec) *int { return &s.SSMState }},
	{"qwen3next", "ssm-groups", "gated delta net key heads (ssm.group_count)", func(s *gguf.Spec) *int { return &s.SSMGroups }},
	{"qwen3next", "ssm-heads", "gated delta net value heads, a multiple of --ssm-groups (ssm.time_step_rank)", func(s *gguf.Spec) *int { return &s.SSMHeads }},
	{"qwen3next", "ssm-conv", "gated delta net convolution taps (ssm.conv_kernel)", func(s *gguf.Spec) *int { return &s.SSMConv }},
	{"glm4moe", "nextn", "next-token-prediction (MTP) layers at the end, counted in --layers (nextn_predict_layers)", func(s *gguf.Spec) *int { return &s.NextN }},
}

// registerSynthFlags registers the flags of "shard synth" on fs.
func registerSynthFlags(fs *flag.FlagSet) *synthFlags {
	def, moe := gguf.DefaultSpec("llama"), gguf.DefaultSpec("qwen3moe")
	sf := &synthFlags{
		arch:        fs.String("arch", "llama", "architecture: "+strings.Join(gguf.Architectures(), ", ")+"; qwen3next (refused at start: to measure it)"),
		layers:      fs.Int("layers", 0, fmt.Sprintf("number of layers (default %d)", def.Layers)),
		embd:        fs.Int("embd", 0, fmt.Sprintf("embedding length (default %d)", def.Embd)),
		heads:       fs.Int("heads", 0, fmt.Sprintf("attention heads (default %d)", def.Heads)),
		kvHeads:     fs.Int("kv-heads", 0, fmt.Sprintf("key/value heads (default %d)", def.KVHeads)),
		ff:          fs.Int("ff", 0, fmt.Sprintf("feed-forward length; per expert for llama with experts (default %d)", def.FF)),
		experts:     fs.Int("experts", -1, fmt.Sprintf("expert count (qwen3moe default %d; llama default %d = dense)", moe.Experts, def.Experts)),
		expertsUsed: fs.Int("experts-used", -1, fmt.Sprintf("experts used per token (qwen3moe default %d)", moe.ExpertsUsed)),
		expertFF:    fs.Int("expert-ff", -1, fmt.Sprintf("expert feed-forward length, qwen3moe (default %d)", moe.ExpertFF)),
		ctxLen:      fs.Int("ctx", 0, fmt.Sprintf("context length (default %d)", def.ContextLength)),
		tied:        fs.Bool("tied", false, "tie the output to token_embd (default: qwen3 tied, others untied)"),
		vocabFrom:   fs.String("vocab-from", "", "copy tokenizer.* from this GGUF (default: a built-in 372-token SPM vocabulary)"),
		typ:         fs.String("type", strings.ToLower(def.Type.String()), "weight type: f32, f16, q8_0, q4_0, q6_k, q4_k_m or mxfp4_moe (experts in MXFP4, the rest Q8_0) (quantized from f16 by llama.cpp)"),
		seed:        fs.Uint64("seed", def.Seed, "random seed (same seed and flags, same file)"),
		name:        fs.String("name", "", "general.name"),
		out:         fs.String("o", "", "output file (required)"),
		ds:          map[string]*int{},
	}
	for _, f := range archFlags {
		d := gguf.DefaultSpec(f.arch)
		usage := f.usage
		if !strings.Contains(usage, ":") {
			usage = f.arch + ": " + usage
		}
		sf.ds[f.name] = fs.Int(f.name, -1, fmt.Sprintf("%s (default %d)", usage, *f.field(&d)))
	}
	return sf
}

// spec is the architecture's default spec with the flags set on fs
// applied, validated, and the quantization to apply afterwards ("": none;
// the spec is then f16).
func (sf *synthFlags) spec(fs *flag.FlagSet) (gguf.Spec, string, error) {
	spec := gguf.DefaultSpec(*sf.arch)
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if set["layers"] {
		spec.Layers = *sf.layers
	}
	if set["embd"] {
		spec.Embd = *sf.embd
	}
	if set["heads"] {
		spec.Heads = *sf.heads
	}
	if set["kv-heads"] {
		spec.KVHeads = *sf.kvHeads
	} else if set["heads"] && spec.Heads%spec.KVHeads != 0 {
		spec.KVHeads = spec.Heads
	}
	if set["ff"] {
		spec.FF = *sf.ff
	}
	if set["experts"] {
		spec.Experts = *sf.experts
		if !set["experts-used"] && spec.Experts > 0 && spec.ExpertsUsed == 0 {
			spec.ExpertsUsed = min(2, spec.Experts)
		}
	}
	if set["experts-used"] {
		spec.ExpertsUsed = *sf.expertsUsed
	}
	if set["expert-ff"] {
		spec.ExpertFF = *sf.expertFF
	}
	if set["ctx"] {
		spec.ContextLength = *sf.ctxLen
	}
	if set["tied"] {
		spec.Tied = *sf.tied
	}
	for _, f := range archFlags {
		if set[f.name] {
			*f.field(&spec) = *sf.ds[f.name]
		}
	}
	spec.VocabFrom, spec.Seed, spec.Name = *sf.vocabFrom, *sf.seed, *sf.name
	quant := ""
	switch t := strings.ToLower(*sf.typ); {
	case t == "f32":
		spec.Type = gguf.TypeF32
	case t == "f16":
		spec.Type = gguf.TypeF16
	case quantTypes[t]:
		spec.Type, quant = gguf.TypeF16, t
	default:
		return spec, "", fmt.Errorf("%w: --type %q (want f32, f16, q8_0, q4_0, q6_k, q4_k_m or mxfp4_moe)", errUsage, *sf.typ)
	}
	if err := spec.Validate(); err != nil {
		return spec, "", fmt.Errorf("%w: %v", errUsage, err)
	}
	return spec, quant, nil
}

// synthFile writes spec's random-weight model to out (through an f16
// temporary file quantized to quant, if any) and prints its summary.
func synthFile(ctx context.Context, stdout, stderr io.Writer, spec gguf.Spec, quant, out string) error {
	prog := newProgress(stderr, "synth "+filepath.Base(out))
	target := out
	if quant != "" {
		target = filepath.Join(filepath.Dir(out), "."+filepath.Base(out)+".f16.tmp")
		defer os.Remove(target)
	}
	spec.Progress = prog.update
	err := gguf.Synth(ctx, spec, target)
	prog.finish()
	if err != nil {
		return err
	}
	if quant != "" {
		if err := quantizeFile(ctx, target, out, quant); err != nil {
			return err
		}
	}
	in, err := gguf.Inspect(ctx, out, true)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s\t%s %d layers, %d embd, %s params\t%s\tmodel %s\n", out, in.Architecture, in.NLayer, in.NEmbd, humanCount(in.Params), humanBytes(in.FileSize), in.Fingerprint)
	return nil
}

// progress prints a progress line on stderr: a \r-updated line on a
// terminal, otherwise a line every 10% for large jobs; each with the rate
// and, once a second of work shows it, the time left.
type progress struct {
	w        io.Writer
	label    string
	tty      bool
	last     time.Time
	lastPct  int
	printed  bool
	minBytes int64
	began    time.Time // the first update
	now      func() time.Time
}

func newProgress(w io.Writer, label string) *progress {
	p := &progress{w: w, label: label, lastPct: -1, minBytes: 64 << 20, now: time.Now}
	if f, ok := w.(*os.File); ok {
		p.tty = isTerminal(f)
	}
	return p
}

func (p *progress) update(done, total int64) {
	if total <= 0 || total < p.minBytes {
		return
	}
	now := p.now()
	if p.began.IsZero() {
		p.began = now
	}
	pct := int(done * 100 / total)
	if p.tty {
		if now.Sub(p.last) >= 100*time.Millisecond || done == total {
			p.last = now
			fmt.Fprintf(p.w, "\r%s %3d%% %s / %s%s   ", p.label, pct, humanBytes(done), humanBytes(total), p.pace(done, total, now))
			p.printed = true
		}
		return
	}
	if pct/10 != p.lastPct/10 {
		p.lastPct = pct
		fmt.Fprintf(p.w, "%s %d%% (%s / %s%s)\n", p.label, pct, humanBytes(done), humanBytes(total), p.pace(done, total, now))
	}
}

// pace is ", RATE/s, ETA left" once a second of work gives a rate ("" before).
func (p *progress) pace(done, total int64, now time.Time) string {
	el := now.Sub(p.began)
	if el < time.Second || done <= 0 {
		return ""
	}
	rate := float64(done) / el.Seconds()
	if done >= total {
		return fmt.Sprintf(", %s/s, took %s", humanBytes(int64(rate)), el.Round(time.Second))
	}
	left := time.Duration(float64(total-done) / rate * float64(time.Second))
	return fmt.Sprintf(", %s/s, %s left", humanBytes(int64(rate)), left.Round(time.Second))
}

func (p *progress) finish() {
	if p.tty && p.printed {
		fmt.Fprintln(p.w)
	}
}
