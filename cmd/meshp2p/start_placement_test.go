package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/node"
	"github.com/neuron-tai/meshp2p/placement"
	"github.com/neuron-tai/meshp2p/status"
)

// Three `start` processes without --layers, each with a --memory that
// holds 6 of the model's 12 layers, choose windows that cover the model;
// status shows them, and generate through them equals --local.
func TestStartChoosesLayers(t *testing.T) {
	dir := t.TempDir()
	model := filepath.Join(dir, "auto.gguf")
	if _, _, err := runShardArgs(t, "synth", "--layers", "12", "--embd", "64", "--ff", "128", "--name", "auto", "-o", model); err != nil {
		t.Fatal(err)
	}
	// The engine flags below size the KV cache and buffers; the budget is
	// what 6 layers anywhere need with them.
	// PrefixCacheCells: start's default --prefix-cache, half of --ctx.
	sz, err := node.ModelSizing(model, engine.Config{NCtx: 512, NBatch: 64, PrefixCacheCells: 256})
	if err != nil {
		t.Fatal(err)
	}
	var budget int64
	for s := 0; s+6 <= 12; s++ {
		budget = max(budget, sz.Need(placement.Range{Start: s, End: s + 6}))
	}
	net := []string{"--network", "placetest", "--listen", "/ip4/127.0.0.1/tcp/0"}
	type proc struct {
		cancel context.CancelFunc
		done   chan error
		out    *syncBuf
	}
	var procs []*proc
	var boot string
	for i := range 3 {
		ctx, cancel := context.WithCancel(context.Background())
		p := &proc{cancel: cancel, done: make(chan error, 1), out: &syncBuf{}}
		procs = append(procs, p)
		args := append([]string{"--model", model, "--memory", fmt.Sprint(budget), "--rebalance-interval", "2s", "--ctx", "512", "--batch", "64",
			"--data-dir", filepath.Join(dir, fmt.Sprint("n", i))}, net...)
		if boot != "" {
			args = append(args, "--bootstrap", boot)
		}
		go func() { p.done <- runStart(ctx, p.out, &syncBuf{}, args) }()
		nj := filepath.Join(dir, fmt.Sprint("n", i), "node.json")
		deadline := time.Now().Add(60 * time.Second)
		for {
			b, err := os.ReadFile(nj)
			var info struct {
				Addrs []string `json:"addrs"`
			}
			if err == nil && json.Unmarshal(b, &info) == nil && len(info.Addrs) > 0 {
				if boot == "" {
					boot = info.Addrs[0]
				}
				break
			}
			select {
			case err := <-p.done:
				t.Fatalf("start %d exited: %v", i, err)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("start %d: no node.json", i)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if !strings.Contains(p.out.String(), "placement: chose layers") {
			t.Fatalf("start printed %q", p.out.String())
		}
	}
	// status: every layer covered, the windows and replica counts shown.
	var models []status.Model
	deadline := time.Now().Add(30 * time.Second)
	for {
		var out, errb syncBuf
		if err := runStatus(context.Background(), &out, &errb, append([]string{"--bootstrap", boot, "--json"}, net...)); err != nil {
			t.Fatalf("status: %v\n%s", err, errb.String())
		}
		var doc status.Document
		if err := json.Unmarshal([]byte(out.String()), &doc); err != nil {
			t.Fatal(err)
		}
		models = doc.Models
		if len(models) == 1 && models[0].Routable && len(models[0].Shards) == 3 && !hasZero(models[0].Replicas) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status never showed the model covered by 3 windows: %+v", models)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("windows %+v, replicas %v", models[0].Shards, models[0].Replicas)
	local := generateTokens(t, 16, "--local", "--model", model)
	if swarm := generateTokens(t, 16, append([]string{"--model", "auto", "--bootstrap", boot, "--wait", "20s"}, net...)...); swarm != local {
		t.Fatalf("swarm %s, local %s", swarm, local)
	}
	for i, p := range procs {
		p.cancel()
		select {
		case err := <-p.done:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Fatalf("start %d shutdown: %v", i, err)
			}
		case <-time.After(15 * time.Second):
			t.Fatalf("start %d did not shut down", i)
		}
	}
}

func hasZero(x []int) bool {
	for _, v := range x {
		if v == 0 {
			return true
		}
	}
	return len(x) == 0
}

// A budget that holds no layer is a clear error before anything loads.
func TestStartMemoryTooSmall(t *testing.T) {
	dir := t.TempDir()
	model := filepath.Join(dir, "m.gguf")
	if _, _, err := runShardArgs(t, "synth", "--layers", "2", "--embd", "32", "-o", model); err != nil {
		t.Fatal(err)
	}
	err := runStart(context.Background(), &syncBuf{}, &syncBuf{}, []string{"--model", model, "--memory", "1M", "--data-dir", dir, "--listen", "/ip4/127.0.0.1/tcp/0", "--network", "tiny"})
	if err == nil || !strings.Contains(err.Error(), "holds no layer") {
		t.Fatalf("err = %v", err)
	}
	for _, bad := range []string{"--memory=lots", "--rebalance-interval=0s"} {
		if err := runStart(context.Background(), &syncBuf{}, &syncBuf{}, []string{"--model", model, bad, "--data-dir", dir}); !errors.Is(err, errUsage) {
			t.Errorf("%s: err = %v, want a usage error", bad, err)
		}
	}
}

// Several models on `start` (a list or a directory): each bad input is a
// clear error before the node advertises anything.
func TestStartManyModelsErrors(t *testing.T) {
	dir := t.TempDir()
	small, big := filepath.Join(dir, "small.gguf"), filepath.Join(dir, "big.gguf")
	if _, _, err := runShardArgs(t, "synth", "--layers", "2", "--embd", "32", "-o", small); err != nil {
		t.Fatal(err)
	}
	if _, _, err := runShardArgs(t, "synth", "--layers", "1", "--embd", "1024", "--ff", "128", "-o", big); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.Mkdir(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		args  []string
		usage bool
		want  string
	}{
		{"a model too big for the budget", []string{"--model", small + "," + big, "--memory", "64M", "--ctx", "65536"}, false, "model big"},
		{"--layers with several models", []string{"--model", small + "," + big, "--layers", "0-1"}, true, "drop --layers"},
		{"--name with several models", []string{"--model", small + "," + big, "--name", "x"}, true, "drop --name"},
		{"--draft with several models", []string{"--model", small + "," + big, "--draft", small}, true, "drop --draft"},
		{"a missing file in the list", []string{"--model", small + "," + filepath.Join(dir, "nope.gguf")}, true, "nope.gguf: no such file"},
		{"an empty entry", []string{"--model", small + ","}, true, "empty entry"},
		{"a directory without models", []string{"--model", empty + "," + small}, true, "holds no .gguf"},
		{"one model twice", []string{"--model", small + "," + small, "--memory", "64M"}, false, "same model"},
		{"a list naming a file with a comma that does not exist", []string{"--model", filepath.Join(dir, "a,b.gguf")}, true, "no such file"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			data := t.TempDir()
			args := append(c.args, "--data-dir", data, "--listen", "/ip4/127.0.0.1/tcp/0", "--network", "manyerr")
			err := runStart(context.Background(), &syncBuf{}, &syncBuf{}, args)
			if err == nil || !strings.Contains(err.Error(), c.want) || errors.Is(err, errUsage) != c.usage {
				t.Fatalf("err = %v, want one containing %q (usage error: %v)", err, c.want, c.usage)
			}
			if _, serr := os.Stat(filepath.Join(data, "node.json")); serr == nil {
				t.Fatal("node.json written: the node started")
			}
		})
	}
}

// A single model file whose path has a comma is that file, not a list
// (test directories are named after subtests, which may hold commas).
func TestExpandModelsCommaPath(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "five nodes, two killed")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	one := filepath.Join(dir, "m.gguf")
	if err := os.WriteFile(one, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := expandModels(one); err != nil || len(got) != 1 || got[0] != one {
		t.Fatalf("expandModels(%q) = %v, %v", one, got, err)
	}
	if got, err := expandModels(one + "," + one); err == nil {
		t.Fatalf("a list of two files with commas in their paths: %v, want an error naming the part that does not exist", got)
	}
}
