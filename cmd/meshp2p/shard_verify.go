package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"

	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/engine/gguf"
)

// errParity reports shard chains whose output differs from the whole model.
var errParity = errors.New("shard chain output differs from the whole model")

// verifySplit is the result for one even k-way split.
type verifySplit struct {
	K          int          `json:"k"`
	Ranges     []gguf.Range `json:"ranges"`
	MaxAbsDiff float64      `json:"max_abs_logit_diff"`
	// MaxAbsDiffStep is the step with the largest difference (-1 if none).
	MaxAbsDiffStep int  `json:"max_abs_logit_diff_step"`
	TokensMatch    bool `json:"tokens_match"`
	// FirstMismatch is the first step whose token differs (-1 if none).
	FirstMismatch int     `json:"first_token_mismatch"`
	Tokens        []int32 `json:"tokens"`
}

// verifyReport is what "shard verify --json" prints.
type verifyReport struct {
	Model        string        `json:"model"`
	Fingerprint  string        `json:"fingerprint"`
	NLayer       int           `json:"n_layer"`
	Prompt       string        `json:"prompt"`
	PromptTokens []int32       `json:"prompt_tokens"`
	Steps        int           `json:"steps"`        // logit rows compared: 1 after the prompt + --tokens
	KernelClass  string        `json:"kernel_class"` // engine.KernelClass of this build
	WholeTokens  []int32       `json:"whole_tokens"`
	Splits       []verifySplit `json:"splits"`
	OK           bool          `json:"ok"`
}

// parseSplits parses "2,3" into shard counts (each at least 1).
func parseSplits(s string) ([]int, error) {
	var ks []int
	for _, part := range strings.Split(s, ",") {
		k, err := strconv.Atoi(strings.TrimSpace(part))
		if err != nil || k < 1 || k > gguf.MaxLayers {
			return nil, fmt.Errorf("%w: --splits %q: want shard counts such as 2,3 (each 1..%d)", errUsage, s, gguf.MaxLayers)
		}
		ks = append(ks, k)
	}
	return ks, nil
}

// runShardVerify implements "meshp2p shard verify": the in-process parity
// check of whole model vs even splits (also what the CI parity tests run).
func runShardVerify(ctx context.Context, stdout, stderr io.Writer, args []string) error {
	fs := cmdFlagSet("shard verify", stdout, "")
	splitsFlag := fs.String("splits", defaultVerifySplits, "comma-separated shard counts: each is an even split (clamped to the layer count)")
	tokens := fs.Int("tokens", defaultVerifyTokens, "greedy decode steps after the prompt")
	prompt := fs.String("prompt", "Once upon a time", "prompt text (tokenized by the model)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	threads := fs.Int("threads", 0, "compute threads (default: number of CPUs)")
	pos, err := parseInterspersed(fs, args, 1, "one whole-model GGUF file")
	if err != nil {
		return err
	}
	ks, err := parseSplits(*splitsFlag)
	if err != nil {
		return err
	}
	if *tokens < 0 || *tokens > 4096 {
		return fmt.Errorf("%w: --tokens %d outside 0..4096", errUsage, *tokens)
	}
	if *threads < 0 || *threads > 1024 {
		return fmt.Errorf("%w: --threads %d", errUsage, *threads)
	}
	rep, err := verifyParity(ctx, pos[0], ks, *tokens, *prompt, *threads)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		printVerify(stdout, rep)
	}
	if !rep.OK {
		var bad []string
		for _, s := range rep.Splits {
			if !s.TokensMatch || s.MaxAbsDiff != 0 {
				bad = append(bad, fmt.Sprintf("%d-way (max |Δlogit| %g, tokens match %v)", s.K, s.MaxAbsDiff, s.TokensMatch))
			}
		}
		return fmt.Errorf("%w: %s", errParity, strings.Join(bad, "; "))
	}
	return nil
}

func printVerify(w io.Writer, r *verifyReport) {
	fmt.Fprintf(w, "model         %s (%d layers)\n", r.Model, r.NLayer)
	fmt.Fprintf(w, "fingerprint   %s\n", r.Fingerprint)
	fmt.Fprintf(w, "prompt        %q (%d tokens), %d greedy steps\nkernel class  %s\n", r.Prompt, len(r.PromptTokens), r.Steps-1, r.KernelClass)
	for _, s := range r.Splits {
		rs := make([]string, len(s.Ranges))
		for i, x := range s.Ranges {
			rs[i] = x.String()
		}
		match := "tokens match"
		if !s.TokensMatch {
			match = fmt.Sprintf("TOKENS DIFFER from step %d", s.FirstMismatch)
		}
		status := "ok"
		if !s.TokensMatch || s.MaxAbsDiff != 0 {
			status = "FAIL"
		}
		fmt.Fprintf(w, "split %-7s %-24s max |Δlogit| %-10g %s\t%s\n", strconv.Itoa(s.K)+"-way", strings.Join(rs, ","), s.MaxAbsDiff, match, status)
	}
}

// verifyParity runs the whole model and each even split's chain on the same
// prompt and greedy steps (f32 hidden states between
// shards) and compares tokens and logits.
func verifyParity(ctx context.Context, path string, ks []int, steps int, promptText string, threads int) (*verifyReport, error) {
	n, fp, md, err := wholeModelInfo(ctx, path)
	if err != nil {
		return nil, err
	}
	model, err := engine.LoadModel(ctx, path, engine.LoadOptions{})
	if err != nil {
		return nil, err
	}
	defer model.Close()
	prompt, err := model.Tokenize(promptText, true, false)
	if err != nil {
		return nil, err
	}
	if len(prompt) == 0 {
		return nil, fmt.Errorf("%w: --prompt %q has no tokens", errUsage, promptText)
	}
	if threads == 0 {
		threads = runtime.NumCPU()
	}
	need := len(prompt) + steps + 1
	cfg := engine.Config{NCtx: max(64, need+16), NBatch: 512, MaxSessions: 1, Threads: threads}
	opts := engine.ChainOptions{Steps: steps, Logits: true}

	whole, err := engine.NewShard(ctx, model, cfg)
	if err != nil {
		return nil, err
	}
	ref, err := engine.RunChain(ctx, []*engine.Shard{whole}, prompt, opts)
	whole.Close()
	if err != nil {
		return nil, fmt.Errorf("whole model: %w", err)
	}
	rep := &verifyReport{Model: path, Fingerprint: fp, NLayer: n, Prompt: promptText, PromptTokens: prompt,
		Steps: len(ref.Tokens), KernelClass: engine.KernelClass(), WholeTokens: ref.Tokens, OK: true}
	tmp, err := os.MkdirTemp("", "meshp2p-verify-*")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	seen := map[int]bool{}
	for _, k := range ks {
		// As even as the architecture's cut rules allow; clamped to one
		// shard per layer.
		ranges, err := gguf.LegalSplit(md, n, k)
		if err != nil {
			return nil, fmt.Errorf("%d-way split: %w", k, err)
		}
		if seen[len(ranges)] {
			continue
		}
		seen[len(ranges)] = true
		res, err := runSplitChain(ctx, path, fp, ranges, tmp, prompt, cfg, opts)
		if err != nil {
			return nil, fmt.Errorf("%d-way split: %w", k, err)
		}
		s, err := compareSplit(k, ranges, res, ref)
		if err != nil {
			return nil, err
		}
		rep.OK = rep.OK && s.TokensMatch && s.MaxAbsDiff == 0
		rep.Splits = append(rep.Splits, s)
	}
	return rep, nil
}

// wholeModelInfo checks that path is a whole model llama.cpp can load and
// returns its layer count, fingerprint and metadata.
func wholeModelInfo(ctx context.Context, path string) (n int, fp string, md gguf.Metadata, err error) {
	f, err := gguf.Open(path)
	if err != nil {
		return 0, "", nil, err
	}
	if f.Metadata.Index(gguf.KeyParentFingerprint) >= 0 {
		f.Close()
		return 0, "", nil, fmt.Errorf("%w: %s is a shard; verify the whole model it came from", errUsage, path)
	}
	err = gguf.ValidateForLoad(f)
	if err == nil {
		n, err = f.NLayer()
	}
	if err == nil {
		fp, err = gguf.Fingerprint(ctx, f)
	}
	f.Close()
	if err != nil {
		return 0, "", nil, fmt.Errorf("%s: %w", path, err)
	}
	return n, fp, f.Metadata, nil
}

// compareSplit compares the chain of the k-way split into ranges (res)
// with the whole model's run (ref), step by step: the first step whose
// token differs, and the largest |logit difference| and its step.
func compareSplit(k int, ranges []gguf.Range, res, ref *engine.ChainResult) (verifySplit, error) {
	s := verifySplit{K: len(ranges), Ranges: ranges, MaxAbsDiffStep: -1, TokensMatch: true, FirstMismatch: -1, Tokens: res.Tokens}
	if len(res.Tokens) != len(ref.Tokens) || len(res.Logits) != len(ref.Logits) {
		return s, fmt.Errorf("%d-way split: %d steps, whole model %d", k, len(res.Tokens), len(ref.Tokens))
	}
	for i := range ref.Tokens {
		if res.Tokens[i] != ref.Tokens[i] && s.TokensMatch {
			s.TokensMatch, s.FirstMismatch = false, i
		}
		if d := engine.MaxAbsDiff(res.Logits[i], ref.Logits[i]); d > s.MaxAbsDiff || (d != 0 && s.MaxAbsDiffStep < 0) {
			s.MaxAbsDiff, s.MaxAbsDiffStep = d, i
		}
	}
	return s, nil
}

// runSplitChain writes the shards of ranges into a fresh directory under
// tmp, checks each against the model fingerprint, runs the chain and
// removes the files again.
func runSplitChain(ctx context.Context, path, fp string, ranges []gguf.Range, tmp string, prompt []int32, cfg engine.Config, opts engine.ChainOptions) (*engine.ChainResult, error) {
	dir, err := os.MkdirTemp(tmp, "split-*")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	res, err := gguf.Split(ctx, path, ranges, dir, nil)
	if err != nil {
		return nil, err
	}
	var shards []*engine.Shard
	defer func() {
		for _, s := range shards {
			s.Close()
		}
	}()
	var models []*engine.Model
	defer func() {
		for _, m := range models {
			m.Close()
		}
	}()
	for _, r := range res {
		m, err := engine.LoadModel(ctx, r.Path, engine.LoadOptions{Validate: func(ctx context.Context, p string) error {
			_, err := gguf.CheckShard(ctx, p, fp, r.Range)
			return err
		}})
		if err != nil {
			return nil, err
		}
		models = append(models, m)
		s, err := engine.NewShard(ctx, m, cfg)
		if err != nil {
			return nil, err
		}
		shards = append(shards, s)
	}
	return engine.RunChain(ctx, shards, prompt, opts)
}

// shard verify's defaults: a two- and a three-way split, 16 greedy steps.
const (
	defaultVerifySplits = "2,3"
	defaultVerifyTokens = 16
)
