package main

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/neuron-tai/meshp2p/internal/testbin"
	"github.com/neuron-tai/meshp2p/internal/testmodels"
)

// Speculative decoding changes how many tokens a pass around the route
// commits, never which: through a three-process stories260K swarm started
// with the README's flags, `generate --speculative off|auto|ngram` gives
// the tokens `generate --local` gives, greedy and sampled (temperature,
// top-k/top-p, penalties, seeds), and on the long greedy continuation
// (stories repeat themselves) the n-gram proposer's tokens are accepted.
// The API gateway (`serve --speculative ngram`) reports
// meshp2p.accepted_per_window on its final chunk, with the same text. The
// head has a self-draft (`shard split --first 4`, `start --draft`):
// `--speculative draft` proposes with it, same tokens again; a draft of
// another vocabulary is refused at start, naming both files.
func TestSpeculativeEqualsLocal(t *testing.T) {
	if testing.Short() {
		t.Skip("starts four processes")
	}
	bin := testbin.CLI(t)
	model := testmodels.Path(t, "stories260K.gguf")
	dir := t.TempDir()
	if _, _, err := runShardArgs(t, "split", "--first", "4", "-o", dir, model); err != nil {
		t.Fatal(err)
	}
	draft := filepath.Join(dir, "stories260K.first4.gguf")
	netArgs := []string{"--network", "spectest", "--listen", "/ip4/127.0.0.1/tcp/0"}
	head := startCLI(t, bin, filepath.Join(dir, "head"), append([]string{"--model", model, "--layers", "0-2", "--threads", "1", "--draft", draft}, netArgs...)...)
	boot := []string{"--bootstrap", head.addr}
	startCLI(t, bin, filepath.Join(dir, "mid"), append(append([]string{"--model", model, "--layers", "2-4", "--threads", "1"}, netArgs...), boot...)...)
	startCLI(t, bin, filepath.Join(dir, "tail"), append(append([]string{"--model", model, "--layers", "4-5", "--threads", "1"}, netArgs...), boot...)...)
	serve := launch(t, bin, append([]string{"serve", "--api", "127.0.0.1:0", "--speculative", "ngram"}, append(netArgs, boot...)...)...)
	base := apiURL(t, serve)

	type result struct {
		Text        string  `json:"text"`
		Tokens      []int32 `json:"tokens"`
		Speculation *struct {
			Mode     string `json:"mode"`
			Proposer string `json:"proposer"`
			Windows  int    `json:"windows"`
			Proposed int    `json:"proposed"`
			Accepted int    `json:"accepted"`
			K        int    `json:"k"`
			W        int    `json:"w"`
		} `json:"speculation"`
	}
	run := func(t *testing.T, args ...string) result {
		t.Helper()
		out, err := exec.Command(bin, append(append(append([]string{"generate", "--json"}, args...), netArgs...), boot...)...).Output()
		if err != nil {
			t.Fatalf("generate %v: %v", args, err)
		}
		var r result
		if err := json.Unmarshal(out, &r); err != nil {
			t.Fatalf("generate --json: %v\n%s", err, out)
		}
		return r
	}
	const prompt = "Once upon a time"
	for _, tc := range []struct {
		name  string
		n     int
		flags []string
	}{
		{"greedy_300", 300, []string{"--temperature", "0"}},
		{"t0.5", 128, []string{"--temperature", "0.5", "--seed", "3"}},
		{"t1.0_topk_topp", 128, []string{"--temperature", "1.0", "--top-k", "40", "--top-p", "0.9", "--seed", "9"}},
		{"t0.8_penalties", 128, []string{"--temperature", "0.8", "--seed", "5", "--repeat-penalty", "1.2", "--frequency-penalty", "0.3", "--presence-penalty", "0.2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--prompt", prompt, "--max-tokens", fmt.Sprint(tc.n)}, tc.flags...)
			out, err := exec.Command(bin, append([]string{"generate", "--local", "--json", "--model", model}, args...)...).Output()
			if err != nil {
				t.Fatalf("generate --local: %v", err)
			}
			var want result
			if err := json.Unmarshal(out, &want); err != nil || len(want.Tokens) == 0 {
				t.Fatalf("generate --local: %v\n%s", err, out)
			}
			for _, mode := range []string{"off", "auto", "ngram", "draft"} {
				got := run(t, append([]string{"--model", "stories260K", "--speculative", mode}, args...)...)
				if !slices.Equal(got.Tokens, want.Tokens) {
					t.Fatalf("--speculative %s: tokens differ from --local\nswarm %v\nlocal %v", mode, got.Tokens, want.Tokens)
				}
				sp := got.Speculation
				switch {
				case mode == "off" && sp != nil:
					t.Fatalf("--speculative off reported speculation %+v", sp)
				case mode != "off" && (sp == nil || sp.Mode != mode || mode == "ngram" && sp.Windows == 0 || sp.Accepted > sp.Proposed):
					// auto and draft may verify no window at all: they
					// send plain steps while they propose nothing (K = 0).
					t.Fatalf("--speculative %s: speculation %+v", mode, sp)
				case mode == "draft" && sp.Proposer != "draft" || mode != "draft" && mode != "off" && sp.Proposer != "ngram":
					t.Fatalf("--speculative %s: proposer %q", mode, sp.Proposer)
				case mode == "ngram" && tc.name == "greedy_300" && (sp.Accepted < 30 || 3*sp.Accepted < sp.Proposed):
					// About a quarter of this text's tokens repeat an
					// earlier 2-gram's follower (ngram proposes on every
					// match, 1-grams too: a third of them are right).
					t.Fatalf("--speculative ngram on a repeating greedy continuation: only %d of %d proposals accepted", sp.Accepted, sp.Proposed)
				}
				if sp != nil {
					t.Logf("%s (%s): %d tokens, %d windows, %d proposed, %d accepted, K %d W %d", mode, sp.Proposer, len(got.Tokens), sp.Windows, sp.Proposed, sp.Accepted, sp.K, sp.W)
				}
			}
		})
	}
	t.Run("draft_of_another_vocabulary", func(t *testing.T) {
		other := filepath.Join(dir, "other.gguf")
		if _, _, err := runShardArgs(t, "synth", "--layers", "2", "--embd", "64", "--heads", "4", "--kv-heads", "4", "--ff", "128", "-o", other); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(bin, "start", "--model", model, "--layers", "0-5", "--draft", other, "--data-dir", filepath.Join(dir, "bad"),
			"--network", "spectest-bad", "--listen", "/ip4/127.0.0.1/tcp/0", "--port-mapping=false").CombinedOutput()
		if err == nil || !strings.Contains(string(out), "vocabulary") || !strings.Contains(string(out), other) || !strings.Contains(string(out), model) {
			t.Fatalf("start with a draft of another vocabulary: %v\n%s", err, out)
		}
	})
	t.Run("api", func(t *testing.T) {
		want, _ := localText(t, bin, "--model", model, "--prompt", prompt, "--max-tokens", "200", "--temperature", "0")
		code, out, _ := postJSON(t, base+"/completions", map[string]any{"model": "stories260K", "prompt": prompt, "max_tokens": 200, "temperature": 0})
		if code != 200 {
			t.Fatalf("status %d: %v", code, out)
		}
		text := out["choices"].([]any)[0].(map[string]any)["text"]
		ext, _ := out["meshp2p"].(map[string]any)
		if text != want || ext == nil || ext["accepted_per_window"] == nil {
			t.Fatalf("api text %q (want %q), meshp2p %v", text, want, ext)
		}
		if apw := ext["accepted_per_window"].(float64); apw <= 0 {
			t.Fatalf("accepted_per_window %v on a repeating continuation", apw)
		}
		t.Logf("api: meshp2p %v", ext["speculation"])
	})
}
