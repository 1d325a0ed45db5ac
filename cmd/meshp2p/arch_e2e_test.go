package main

import (
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/neuron-tai/meshp2p/internal/testbin"
)

// archSwarms are the architectures certified beyond the first four
// (docs/architectures.md), each as `shard synth` makes it: the real
// structure at small widths.
var archSwarms = []struct {
	arch  string
	synth []string // shard synth flags beyond --arch
	cuts  []string // --layers of head, middle, tail: legal cut points
}{
	// DeepSeek-V3's structure: 2 dense lead layers, then experts with a
	// shared expert and expert groups, latent attention; the middle
	// shard starts where the experts do.
	{"deepseek2", []string{"--type", "q8_0"}, []string{"0-2", "2-4", "4-6"}},
	// MiniMax-M2's structure: experts in every layer, partial rotary.
	{"minimax-m2", []string{"--type", "q8_0"}, []string{"0-2", "2-3", "3-6"}},
	// Ministral 3: llama's layers, YaRN with attention temperature scaling.
	{"mistral3", []string{"--type", "q8_0"}, []string{"0-3", "3-5", "5-6"}},
	// gpt-oss's structure: experts in MXFP4 (the rest Q8_0), attention
	// sinks, a window of 8 on every even layer; shards start at even
	// layers.
	{"gpt-oss", []string{"--type", "mxfp4_moe"}, []string{"0-2", "2-4", "4-6"}},
	// Gemma 3's structure: 5 sliding layers (window 8) to 1 global, tied
	// output; shards start at multiples of 6 and hold a global layer.
	{"gemma3", []string{"--type", "q8_0", "--layers", "18"}, []string{"0-6", "6-12", "12-18"}},
	// Llama 4 Maverick's structure: top-1 experts and a shared one on
	// every 2nd layer, chunked attention 3:1, no rope on the 4th;
	// shards start at multiples of 4 and hold at least 4 layers.
	{"llama4", []string{"--type", "q8_0", "--layers", "12"}, []string{"0-4", "4-8", "8-12"}},
	// GLM-4.5's structure: a dense lead layer, sigmoid experts with a
	// shared one, partial rotary, and the MTP layer (5) with the tail;
	// the middle and the tail run M-RoPE (4 positions a row).
	{"glm4moe", []string{"--type", "q8_0"}, []string{"0-2", "2-4", "4-6"}},
}

// TestArchitectureSwarms: for each architecture, three `meshp2p start`
// processes at legal cut points (the README's flags) and a gateway equal
// `generate --local` token for token through `generate` and the API; then
// a stream survives its middle's SIGKILL (a spare of the middle joins while
// the middle is frozen) and still equals --local: one kernel class, exact.
func TestArchitectureSwarms(t *testing.T) {
	if testing.Short() {
		t.Skip("starts five processes per architecture")
	}
	t.Parallel() // its processes mostly wait on timers (make test: -parallel = cores)
	for _, a := range archSwarms {
		t.Run(a.arch, func(t *testing.T) {
			bin := testbin.CLI(t)
			dir := t.TempDir()
			s := &invSwarm{bin: bin, dir: dir, name: "arch-" + a.arch, model: filepath.Join(dir, "arch-"+a.arch+".gguf")}
			if _, _, err := runShardArgs(t, append([]string{"synth", "--arch", a.arch, "--seed", "3", "--name", s.name, "-o", s.model}, a.synth...)...); err != nil {
				t.Fatal(err)
			}
			s.net = []string{"--network", "arch" + a.arch, "--listen", "/ip4/127.0.0.1/tcp/0"}
			head := s.node(t, "head", a.cuts[0])
			s.boot = []string{"--bootstrap", head.addr}
			mid := s.node(t, "mid", a.cuts[1])
			s.node(t, "tail", a.cuts[2])
			s.serve = launch(t, bin, append(append([]string{"serve", "--api", "127.0.0.1:0"}, s.net...), s.boot...)...)
			s.base = apiURL(t, s.serve)
			ctx := context.Background()

			for _, p := range []string{"Once upon a time", "The cat", "He said"} {
				want, _ := s.local(t, p, 32)
				got, err := s.complete(ctx, p, 32)
				if err != nil || got != want {
					t.Fatalf("API %q: %v\nswarm %q\nlocal %q", p, err, got, want)
				}
				args := append([]string{"generate", "--json", "--model", s.name, "--prompt", p, "--max-tokens", "32", "--temperature", "0"}, append(s.net, s.boot...)...)
				out, err := exec.Command(bin, args...).Output()
				var res struct {
					Text string `json:"text"`
				}
				if err != nil || json.Unmarshal(out, &res) != nil || res.Text != want {
					t.Fatalf("generate %q: %v\nswarm %q\nlocal %q", p, err, res.Text, want)
				}
			}
			t.Logf("%s: 3 prompts, CLI and API equal --local", a.arch)

			const n, prompt = 120, "Once upon a time"
			want, _ := s.local(t, prompt, n)
			c := openai.NewClient(option.WithBaseURL(s.base+"/"), option.WithMaxRetries(0))
			st := c.Completions.NewStreaming(ctx, openai.CompletionNewParams{Model: openai.CompletionNewParamsModel(s.name),
				Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)},
				MaxTokens: openai.Int(n), Temperature: openai.Float(0)})
			var text string
			var spare *cliProc
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
					freeze(t, mid)
					spare = s.node(t, "spare", a.cuts[1])
					s.waitListed(t, spare.peerID)
					if err := mid.cmd.Process.Kill(); err != nil { // by PID
						t.Fatal(err)
					}
				}
			}
			if err := st.Err(); err != nil {
				t.Fatalf("stream: %v\n%s", err, s.serve.log.String())
			}
			if reroutes == 0 || text != want {
				t.Fatalf("after the middle's kill: %d re-routes\nswarm %q\nlocal %q", reroutes, text, want)
			}
			t.Logf("%s: the stream re-routed %d time(s) around the killed middle and equals --local (%d characters)", a.arch, reroutes, len(text))
		})
	}
}
