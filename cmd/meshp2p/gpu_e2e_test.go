package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/internal/testbin"
	"github.com/neuron-tai/meshp2p/internal/testgpu"
)

// TestVulkanSwarm: real `meshp2p start` processes with the README's
// --device flag on the Vulkan device (lavapipe where there is no GPU).
//   - A route whose three hops all run Vulkan equals `generate --local
//     --device vulkan0` token for token (one backend class), and `status`
//     shows every hop's backend.
//   - A CPU replica of the middle is started while a stream runs through
//     the Vulkan middle; the Vulkan middle is SIGKILLed: the stream
//     re-routes through the CPU hop (a mixed route), completes, and its
//     tokens stay within what the mixed-route tolerance test measured
//     (engine.TestMixedRouteTolerance): equal to the Vulkan reference up
//     to the kill; after it greedy text may part at a near tie.
func TestVulkanSwarm(t *testing.T) {
	if testing.Short() {
		t.Skip("starts five processes on a software Vulkan device")
	}
	backendDir := testgpu.Dir(t, "vulkan")
	bin := testbin.CLI(t)
	dir := t.TempDir()
	model := synthSix(t, dir, "gpu-f16")
	vk := []string{"--device", "vulkan0", "--backend-dir", backendDir}
	netArgs := []string{"--network", "gpuvk", "--listen", "/ip4/127.0.0.1/tcp/0"}
	node := func(name, layers string, extra []string, boot ...string) *cliProc {
		args := append(append([]string{"--model", model, "--layers", layers, "--threads", "1"}, extra...), netArgs...)
		return startCLI(t, bin, filepath.Join(dir, name), append(args, boot...)...)
	}
	head := node("head", "0-2", vk)
	boot := []string{"--bootstrap", head.addr}
	mid := node("midV", "2-4", vk, boot...)
	node("tail", "4-6", vk, boot...)
	serve := launch(t, bin, append(append([]string{"serve", "--api", "127.0.0.1:0"}, netArgs...), boot...)...)
	base := apiURL(t, serve)
	local := func(prompt string, n int, dev ...string) string {
		text, _ := localText(t, bin, append([]string{"--model", model, "--prompt", prompt, "--max-tokens", fmt.Sprint(n), "--temperature", "0"}, dev...)...)
		return text
	}
	s := &invSwarm{bin: bin, model: model, name: "gpu-f16", dir: dir, net: netArgs, boot: boot, serve: serve, base: base}
	ctx := context.Background()
	if _, err := s.complete(ctx, "warm up", 2); err != nil {
		t.Fatalf("swarm never served: %v\n%s", err, serve.log.String())
	}

	t.Run("all_vulkan_equals_local_vulkan", func(t *testing.T) {
		for _, p := range []string{"Once upon a time", "The cat", "One day a dog"} {
			want := local(p, 40, vk...)
			got, err := s.complete(ctx, p, 40)
			if err != nil || got != want {
				t.Fatalf("%q: %v\nswarm  %q\nlocal  %q", p, err, got, want)
			}
		}
		out, err := exec.Command(bin, append(append([]string{"status", "--json"}, netArgs...), boot...)...).Output()
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			Models []struct {
				Shards []struct {
					Peer        string `json:"peer"`
					KernelClass string `json:"kernel_class"`
				} `json:"shards"`
			} `json:"models"`
		}
		if err := json.Unmarshal(out, &doc); err != nil || len(doc.Models) != 1 {
			t.Fatalf("status --json: %v\n%s", err, out)
		}
		for _, sh := range doc.Models[0].Shards {
			if !strings.HasPrefix(sh.KernelClass, "vulkan/") {
				t.Fatalf("shard of %s advertises kernel class %q, want vulkan/…", sh.Peer, sh.KernelClass)
			}
		}
	})

	t.Run("failover_vulkan_to_cpu", func(t *testing.T) {
		const n, prompt = 200, "Once upon a time"
		want := local(prompt, n, vk...)
		c := openai.NewClient(option.WithBaseURL(base+"/"), option.WithMaxRetries(0))
		st := c.Completions.NewStreaming(ctx, openai.CompletionNewParams{Model: "gpu-f16",
			Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)},
			MaxTokens: openai.Int(n), Temperature: openai.Float(0)})
		var text string
		var spare *cliProc
		killed, killedAt := false, 0
		reroutes := 0
		for st.Next() {
			ch := st.Current()
			if len(ch.Choices) > 0 {
				text += ch.Choices[0].Text
			}
			if e := chunkExt(ch.RawJSON()); e != nil {
				reroutes = max(reroutes, e.Reroutes)
			}
			if spare == nil {
				// The CPU replica joins while the stream is on the Vulkan
				// middle (faster by measure, the CPU hop would have been
				// chosen at the start). The middle is frozen first, so
				// the stream cannot end while the spare starts (on a
				// quiet machine it could: the kill then came too late).
				freeze(t, mid)
				spare = node("midC", "2-4", []string{"--device", "cpu"}, boot...)
				s.waitListed(t, spare.peerID)
				if err := mid.cmd.Process.Kill(); err != nil { // SIGKILL, by PID; a stopped process dies too
					t.Fatal(err)
				}
				killed, killedAt = true, len(text)
				t.Logf("Vulkan middle killed after %d characters", len(text))
			}
		}
		if err := st.Err(); err != nil {
			t.Fatalf("stream: %v\n%s", err, serve.log.String())
		}
		if !killed || reroutes == 0 {
			t.Fatalf("the Vulkan middle was killed: %v; re-routes the stream reported: %d (the stream may have ended before the kill)", killed, reroutes)
		}
		// Up to the kill the route was all Vulkan: exact. After it, a
		// mixed route: its logits are within engine.MixedTolerance (the
		// engine's test), so greedy text may part from the reference at a
		// near tie, never before the kill.
		if len(text) <= killedAt || text[:killedAt] != want[:min(killedAt, len(want))] {
			t.Fatalf("text before the kill differs from the Vulkan reference, or nothing came after it\nswarm %q\nlocal %q", text, want)
		}
		same := 0
		for same < min(len(text), len(want)) && text[same] == want[same] {
			same++
		}
		t.Logf("failover vulkan→cpu after %d characters: the stream completed (%d characters); %d characters equal --local --device vulkan0 (all: %v)",
			killedAt, len(text), same, text == want)
	})
}

// TestStartDeviceErrors: a device that does not exist, a backend library
// that is missing or built from other sources, and layers that do not
// fit the device's memory each stop `meshp2p start` with a clear error
// before the node advertises anything (no node.json).
func TestStartDeviceErrors(t *testing.T) {
	backendDir := testgpu.Dir(t, "vulkan")
	bin := testbin.CLI(t)
	dir := t.TempDir()
	model := synthSix(t, dir, "dev")
	lib, err := os.ReadFile(filepath.Join(backendDir, "libggml-vulkan.so"))
	if err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(dir, "stale")
	if err := os.MkdirAll(stale, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stale, "libggml-vulkan.so"), lib, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stale, "libggml-vulkan.so.meshp2p"), []byte("ollama v0.17.3 llama.cpp 1111111\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, l := range engine.LoadBackends(backendDir) {
		if l.Err != nil {
			testgpu.Missing(t, l.Err.Error())
		}
	}
	vk, err := engine.SelectDevice("vulkan0")
	if err != nil {
		testgpu.Missing(t, err.Error())
	}
	vkFree := vk.FreeBytes
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no_such_index", []string{"--device", "vulkan7", "--backend-dir", backendDir}, `no device "vulkan7"`},
		{"no_such_backend", []string{"--device", "tpu0", "--backend-dir", backendDir}, "no tpu backend library is loaded"},
		{"library_missing", []string{"--device", "vulkan0", "--backend-dir", t.TempDir()}, "no vulkan backend library is loaded (searched: "},
		{"library_other_revision", []string{"--device", "vulkan0", "--backend-dir", stale}, "was built from \"ollama v0.17.3 llama.cpp 1111111\""},
		// A KV cache of twice the device's free memory: 6 layers × cells
		// × 256 values × 2 bytes (K and V, f16).
		{"does_not_fit", []string{"--device", "vulkan0", "--backend-dir", backendDir, "--ctx", fmt.Sprint(2 * vkFree / (6 * 256 * 2))}, "not enough device memory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			data := t.TempDir()
			args := append([]string{"start", "--data-dir", data, "--model", model, "--layers", "0-6", "--network", "deverr",
				"--listen", "/ip4/127.0.0.1/tcp/0", "--bootstrap", ""}, tc.args...)
			out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
			if err == nil || ctx.Err() != nil {
				t.Fatalf("start %v: %v (want a failure at start)\n%s", tc.args, err, out)
			}
			if !strings.Contains(string(out), tc.want) {
				t.Fatalf("start %v: output does not say %q:\n%s", tc.args, tc.want, out)
			}
			if _, err := os.Stat(filepath.Join(data, "node.json")); err == nil {
				t.Fatalf("start %v wrote node.json: it came up before failing", tc.args)
			}
			t.Logf("%s: %s", tc.name, lastLine(string(out)))
		})
	}
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// synthSix writes a 6-layer F16 random-weight model named name into dir.
func synthSix(t *testing.T, dir, name string) string {
	t.Helper()
	model := filepath.Join(dir, name+".gguf")
	if _, _, err := runShardArgs(t, "synth", "--layers", "6", "--embd", "256", "--heads", "4", "--kv-heads", "2", "--ff", "512",
		"--type", "f16", "--seed", "5", "--name", name, "-o", model); err != nil {
		t.Fatal(err)
	}
	return model
}
