package main

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/internal/testmodels"
)

func runVerifyJSON(t *testing.T, args ...string) verifyReport {
	t.Helper()
	stdout, stderr, err := runShardArgs(t, append([]string{"verify", "--json"}, args...)...)
	if err != nil {
		t.Fatalf("verify %q: %v\n%s%s", args, err, stdout, stderr)
	}
	var rep verifyReport
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("verify --json output: %v\n%s", err, stdout)
	}
	return rep
}

func checkReport(t *testing.T, rep verifyReport, wantK []int, steps int) {
	t.Helper()
	if !rep.OK || rep.Steps != steps+1 || len(rep.WholeTokens) != steps+1 || len(rep.Fingerprint) != 64 || len(rep.PromptTokens) < 2 {
		t.Fatalf("report %+v", rep)
	}
	if len(rep.Splits) != len(wantK) {
		t.Fatalf("%d splits, want %v", len(rep.Splits), wantK)
	}
	for i, s := range rep.Splits {
		if s.K != wantK[i] || len(s.Ranges) != wantK[i] || s.MaxAbsDiff != 0 || !s.TokensMatch || s.FirstMismatch != -1 {
			t.Errorf("split %+v", s)
		}
		if s.Ranges[0].Start != 0 || s.Ranges[len(s.Ranges)-1].End != rep.NLayer {
			t.Errorf("split %d ranges %v do not cover %d layers", s.K, s.Ranges, rep.NLayer)
		}
		for j := range s.Tokens {
			if s.Tokens[j] != rep.WholeTokens[j] {
				t.Errorf("split %d token %d: %d vs %d", s.K, j, s.Tokens[j], rep.WholeTokens[j])
			}
		}
	}
}

func TestShardVerifyStories(t *testing.T) {
	model := testmodels.Path(t, "stories260K.gguf")
	before, _ := filepath.Glob(filepath.Join(os.TempDir(), "meshp2p-verify-*"))
	rep := runVerifyJSON(t, "--splits", "2,3", "--tokens", "8", model)
	checkReport(t, rep, []int{2, 3}, 8)
	if rep.NLayer != 5 || rep.Prompt != "Once upon a time" || rep.KernelClass != engine.KernelClass() {
		t.Errorf("report %+v", rep)
	}
	// Text form, a custom prompt, clamping to one shard per layer.
	stdout, _, err := runShardArgs(t, "verify", "--splits", "3,9", "--tokens", "2", "--prompt", "The cat", model)
	if err != nil || !strings.Contains(stdout, "split 3-way") || !strings.Contains(stdout, "split 5-way") || strings.Contains(stdout, "FAIL") {
		t.Errorf("verify text: %v\n%s", err, stdout)
	}
	after, _ := filepath.Glob(filepath.Join(os.TempDir(), "meshp2p-verify-*"))
	if len(after) > len(before) {
		t.Errorf("temporary split directories left behind: %v", after)
	}
}

// The command also verifies synthesized (here mixture-of-experts, Q8_0)
// models, which need no shared files.
func TestShardVerifySynth(t *testing.T) {
	dir := t.TempDir()
	model := filepath.Join(dir, "moe.gguf")
	if _, _, err := runShardArgs(t, "synth", "--arch", "qwen3moe", "--layers", "4", "--embd", "64", "--expert-ff", "64", "--type", "q8_0", "-o", model); err != nil {
		t.Fatal(err)
	}
	checkReport(t, runVerifyJSON(t, "--tokens", "4", "--prompt", "the end", model), []int{2, 3}, 4)
}

func TestShardVerifyUsage(t *testing.T) {
	dir := t.TempDir()
	model := filepath.Join(dir, "m.gguf")
	if _, _, err := runShardArgs(t, "synth", "--layers", "2", "--embd", "32", "-o", model); err != nil {
		t.Fatal(err)
	}
	res, err := runShardArgsSplit(t, model, dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"verify"},
		{"verify", "--splits", "0", model},
		{"verify", "--splits", "2,x", model},
		{"verify", "--tokens", "-1", model},
		{"verify", model, model},
		{"verify", res},
	} {
		if _, _, err := runShardArgs(t, args...); !errors.Is(err, errUsage) {
			t.Errorf("%q: %v, want errUsage", args, err)
		}
	}
	garbage := filepath.Join(dir, "garbage.gguf")
	if err := os.WriteFile(garbage, []byte("GGUF\x03\x00\x00\x00garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := runShardArgs(t, "verify", garbage); err == nil || errors.Is(err, errUsage) {
		t.Errorf("verify garbage: %v", err)
	}
}

// runShardArgsSplit splits model in two and returns the head shard's path.
func runShardArgsSplit(t *testing.T, model, dir string) (string, error) {
	t.Helper()
	_, _, err := runShardArgs(t, "split", "--even", "2", "-o", dir, model)
	return filepath.Join(dir, "m.L0-1.gguf"), err
}
