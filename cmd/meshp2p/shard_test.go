package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/internal/testmodels"
)

func runShardArgs(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var out, errb bytes.Buffer
	err := runShard(context.Background(), &out, &errb, args)
	return out.String(), errb.String(), err
}

func TestShardCLI(t *testing.T) {
	dir := t.TempDir()
	model := filepath.Join(dir, "m.gguf")
	if _, _, err := runShardArgs(t, "synth", "--arch", "qwen2", "--layers", "5", "--embd", "64", "--heads", "4", "--kv-heads", "2", "--ff", "96", "--type", "f16", "--seed", "3", "-o", model); err != nil {
		t.Fatalf("synth: %v", err)
	}
	stdout, _, err := runShardArgs(t, "inspect", model, "--json")
	if err != nil {
		t.Fatalf("inspect: %v", err)
	}
	var in gguf.Info
	if err := json.Unmarshal([]byte(stdout), &in); err != nil {
		t.Fatalf("inspect --json output: %v\n%s", err, stdout)
	}
	if in.Architecture != "qwen2" || in.NLayer != 5 || in.NEmbd != 64 || in.NHeadKV != 2 || in.TensorTypes["F16"] == 0 || len(in.Fingerprint) != 64 {
		t.Errorf("inspect: %+v", in)
	}
	outDir := filepath.Join(dir, "out")
	stdout, _, err = runShardArgs(t, "split", "--ranges", "0-2,2-4,4-5", "-o", outDir, "--json", model)
	if err != nil {
		t.Fatalf("split: %v", err)
	}
	var res []gguf.SplitResult
	if err := json.Unmarshal([]byte(stdout), &res); err != nil || len(res) != 3 {
		t.Fatalf("split output %v: %s", err, stdout)
	}
	for _, r := range res {
		if r.Fingerprint != in.Fingerprint || filepath.Dir(r.Path) != outDir {
			t.Errorf("split result %+v", r)
		}
		if _, err := gguf.CheckShard(context.Background(), r.Path, in.Fingerprint, r.Range); err != nil {
			t.Errorf("CheckShard(%s): %v", r.Path, err)
		}
	}
	stdout, _, err = runShardArgs(t, "inspect", "--no-fingerprint", res[1].Path)
	if err != nil || !strings.Contains(stdout, "layers 2-4 of 5 (middle)") || strings.Contains(stdout, "fingerprint ") {
		t.Errorf("inspect shard: %v\n%s", err, stdout)
	}
	stdout, _, err = runShardArgs(t, "split", "--even", "2", "-o", outDir, model)
	if err != nil || !strings.Contains(stdout, "m.L0-3.gguf") || !strings.Contains(stdout, "m.L3-5.gguf") {
		t.Errorf("split --even 2: %v\n%s", err, stdout)
	}
}

func TestShardCLIUsage(t *testing.T) {
	dir := t.TempDir()
	model := filepath.Join(dir, "m.gguf")
	if _, _, err := runShardArgs(t, "synth", "--layers", "2", "--embd", "32", "-o", model); err != nil {
		t.Fatal(err)
	}
	cases := [][]string{
		{},
		{"bogus"},
		{"inspect"},
		{"inspect", "a", "b"},
		{"inspect", "--nope", model},
		{"split", model},
		{"split", "--ranges", "0-1", "--even", "2", model},
		{"split", "--ranges", "0-3", "-o", dir, model},
		{"split", "--ranges", "0-2,1-2", "-o", dir, model},
		{"split", "--ranges", "x", model},
		{"synth"},
		{"synth", "--arch", "gpt2", "-o", filepath.Join(dir, "x.gguf")},
		{"synth", "--arch", "qwen3moe", "--experts-used", "0", "-o", filepath.Join(dir, "x.gguf")},
		{"synth", "--heads", "3", "-o", filepath.Join(dir, "x.gguf")},
		{"synth", "--type", "q9", "-o", filepath.Join(dir, "x.gguf")},
		{"synth", "-o", filepath.Join(dir, "x.gguf"), "extra"},
	}
	for _, args := range cases {
		if _, _, err := runShardArgs(t, args...); !errors.Is(err, errUsage) {
			t.Errorf("shard %q: err = %v, want errUsage", args, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "x.gguf")); err == nil {
		t.Error("a failed synth left its output")
	}
	// Quantized synth goes through the engine; a geometry plain Q8_0 cannot
	// take is refused before quantizing, and no temporary file is left.
	q := filepath.Join(dir, "q.gguf")
	if _, _, err := runShardArgs(t, "synth", "--layers", "1", "--embd", "32", "--type", "q8_0", "-o", q); err != nil {
		t.Fatalf("synth --type q8_0: %v", err)
	}
	if in, err := gguf.Inspect(context.Background(), q, false); err != nil || in.TensorTypes["Q8_0"] == 0 {
		t.Errorf("synth --type q8_0: %v, types %v", err, in.TensorTypes)
	}
	bad := filepath.Join(dir, "bad.gguf")
	if _, _, err := runShardArgs(t, "synth", "--layers", "1", "--embd", "32", "--ff", "100", "--type", "q8_0", "-o", bad); !errors.Is(err, gguf.ErrNotQuantizable) {
		t.Errorf("synth --ff 100 --type q8_0: %v, want ErrNotQuantizable", err)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 2 {
		t.Errorf("dir holds %d entries after quantized synths, want the two models", len(ents))
	}
	if _, _, err := runShardArgs(t, "--help"); err != nil {
		t.Errorf("--help: %v", err)
	}
}

// shard split --first K writes the model cut to its first K layers, a
// whole model that loads; bad K and mixed flags are usage errors.
func TestShardSplitFirst(t *testing.T) {
	model := testmodels.Path(t, "stories260K.gguf")
	dir := t.TempDir()
	out, _, err := runShardArgs(t, "split", "--first", "3", "-o", dir, model)
	if err != nil || !strings.Contains(out, "stories260K.first3.gguf") {
		t.Fatalf("split --first 3: %v\n%s", err, out)
	}
	info, _, err := runShardArgs(t, "inspect", filepath.Join(dir, "stories260K.first3.gguf"))
	if err != nil || !strings.Contains(info, "layers        3") || !strings.Contains(info, "separate output.weight") {
		t.Fatalf("inspect: %v\n%s", err, info)
	}
	for _, args := range [][]string{{"--first", "5"}, {"--first", "-1"}, {"--first", "2", "--even", "2"}} {
		if _, _, err := runShardArgs(t, append(append([]string{"split"}, args...), "-o", dir, model)...); !errors.Is(err, errUsage) {
			t.Errorf("split %v: %v, want a usage error", args, err)
		}
	}
}
