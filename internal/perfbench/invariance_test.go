package perfbench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/engine/gguf"
)

// The invariance section (issue 23): the batch-invariant engine against
// today's, i.e. the engine as it was before (llamafile's sgemm compiled in,
// attention without flash attention, freed cells reused in place). The
// two are different builds of llama.cpp, so each figure runs in child
// processes: this test binary, and a baseline test binary built with the
// old flags (make bench builds it: MESHP2P_BENCH_BASELINE names it; the
// section is skipped without it). Rounds alternate the two binaries.
//
// Figures, per model (the 154M F16 model and its Q8_0 and Q4_K_M
// quantizations):
// single-session decode, a 512-token prefill, 8 sessions decoding at once,
// and a 16-row verify step (16 rows with every row's logits, after a
// 128-token context: what speculative decoding's verifier runs).

// invFigures are the child's figure names, in print order.
var invFigures = []struct{ key, name, unit string }{
	{"decode", "1-row decode", "tok/s"},
	{"agg8", "8 sessions decoding, aggregate", "tok/s"},
	{"prefill512", "prefill 512 tokens", "ms"},
	{"verify16", "16-row verify (all logits)", "ms"},
}

func invariance(b *testing.B, t *Table, rounds int) {
	base := os.Getenv("MESHP2P_BENCH_BASELINE")
	if base == "" {
		fmt.Println("invariance section skipped: MESHP2P_BENCH_BASELINE (a test binary of this package built without -UGGML_USE_LLAMAFILE; make bench builds it) is not set")
		return
	}
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	models := []string{"f16", "q8_0", "q4_k_m"}
	run := func(bin string, baseline bool, model string) map[string]float64 {
		env := []string{"MESHP2P_INV_CHILD=" + model}
		if baseline {
			env = append(env, "MESHP2P_INV_BASELINE=1")
		}
		out := child(b, bin, "TestInvarianceChild", env...)
		got := map[string]float64{}
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			if len(f) == 3 && f[0] == "INVCHILD" {
				if v, err := strconv.ParseFloat(f[2], 64); err == nil {
					got[f[1]] = v
				}
			}
		}
		if len(got) != len(invFigures) {
			b.Fatalf("child %s printed %d of %d figures:\n%s", bin, len(got), len(invFigures), out)
		}
		return got
	}
	for _, m := range models {
		inv, old := map[string][]float64{}, map[string][]float64{}
		ratio := map[string][]float64{}
		for r := range rounds {
			var a, o map[string]float64
			for j := range 2 {
				if alternate(r, j, 2) == 0 {
					a = run(exe, false, m)
				} else {
					o = run(base, true, m)
				}
			}
			for k := range a {
				inv[k] = append(inv[k], a[k])
				old[k] = append(old[k], o[k])
				ratio[k] = append(ratio[k], a[k]/o[k])
			}
		}
		for _, f := range invFigures {
			goal := ""
			switch f.key {
			case "decode":
				goal = ">= 0.97"
			case "agg8":
				goal = ">= 0.9"
			}
			t.Add(Row{Name: fmt.Sprintf("%s: %s, invariant", m, f.name), Value: median(inv[f.key]), Unit: f.unit,
				Baseline: median(old[f.key]), BaseName: "today's engine (llamafile, no FA)", Goal: goal})
			t.Add(Row{Name: "  invariant / today, paired", Value: median(ratio[f.key]), Unit: "x"})
		}
	}
}

// invModel is the benchmark model in the child's type: the 154M F16 file,
// or its quantization (made once, next to it).
func invModel(ctx context.Context, typ string) (string, error) {
	whole, _, err := Files(ctx, 1)
	if err != nil || typ == "f16" {
		return whole, err
	}
	out := strings.TrimSuffix(whole, ".gguf") + "-" + typ + ".gguf"
	if f, err := gguf.Open(out); err == nil {
		f.Close()
		return out, nil
	}
	tmp := filepath.Join(filepath.Dir(out), "tmp-"+filepath.Base(out))
	if err := engine.Quantize(ctx, whole, tmp, engine.QuantType(typ)); err != nil {
		return "", err
	}
	return out, os.Rename(tmp, out)
}

// TestInvarianceChild is the invariance section's child (skipped
// otherwise): it prints one INVCHILD line per figure.
func TestInvarianceChild(t *testing.T) {
	typ := os.Getenv("MESHP2P_INV_CHILD")
	if typ == "" {
		t.Skip("child of BenchmarkPerf's invariance section")
	}
	ctx := context.Background()
	path, err := invModel(ctx, typ)
	if err != nil {
		t.Fatal(err)
	}
	cfg := engine.Config{NCtx: 2048, NBatch: 512, MaxSessions: 8, Threads: 2, Baseline: os.Getenv("MESHP2P_INV_BASELINE") != ""}
	l, err := Load(ctx, path, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	chain := []*engine.Shard{l.Shard}
	key := byte(0)
	next := func() engine.SessionKey { key++; return engine.SessionKey{ID: [16]byte{key}} }

	// Single-session decode: 32 steps after a 16-token prompt.
	res, err := engine.RunChain(ctx, chain, prompt(16), engine.ChainOptions{Steps: 32, Key: next()})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("INVCHILD decode %.4f\n", 32/res.Decode.Seconds())

	// 8 sessions at once, 16 steps each after 16-token prompts.
	var wg sync.WaitGroup
	errs := make([]error, 8)
	start := time.Now()
	for i := range 8 {
		k := next()
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = engine.RunChain(ctx, chain, prompt(16+i), engine.ChainOptions{Steps: 16, Key: k})
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	fmt.Printf("INVCHILD agg8 %.4f\n", 8*17/time.Since(start).Seconds())

	// A 512-token prefill.
	res, err = engine.RunChain(ctx, chain, prompt(512), engine.ChainOptions{Key: next()})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("INVCHILD prefill512 %.4f\n", float64(res.Prefill)/float64(time.Millisecond))

	// 16-row verify steps with all logits after a 128-token context:
	// median of 5.
	s, err := l.Shard.OpenSession(next(), engine.SessionParams{KVTokens: 128 + 5*16})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Forward(ctx, engine.Input{Tokens: prompt(128)}); err != nil {
		t.Fatal(err)
	}
	var ds []time.Duration
	for range 5 {
		t0 := time.Now()
		if _, err := s.Forward(ctx, engine.Input{Pos: s.NextPos(), Tokens: prompt(16), AllLogits: true}); err != nil {
			t.Fatal(err)
		}
		ds = append(ds, time.Since(t0))
	}
	fmt.Printf("INVCHILD verify16 %.4f\n", medianMs(ds))
}
