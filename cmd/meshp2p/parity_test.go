package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/internal/testbin"
	"github.com/neuron-tai/meshp2p/internal/testmodels"
)

// postJSON posts body to url and returns the status and decoded answer.
func postJSON(t *testing.T, url string, body any) (int, map[string]any, time.Duration) {
	t.Helper()
	b, _ := json.Marshal(body)
	hc := &http.Client{Timeout: 30 * time.Second}
	start := time.Now()
	resp, err := hc.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	return resp.StatusCode, out, time.Since(start)
}

// `meshp2p generate` and the API (`meshp2p serve`) are one client: given
// the same explicit sampling parameters — greedy, sampled with top-k,
// top-p, min-p and a seed, repetition and OpenAI penalties, stop strings
// that span tokens, a chat — they write the same text through the same
// two-process swarm. And the API never touches the gateway's files: a
// request naming a GGUF file, another file, a FIFO or a large file as its
// model gets the 404 an unknown name gets, as fast.
func TestGenerateAndAPISameText(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three processes")
	}
	bin := testbin.CLI(t)
	model := testmodels.Path(t, "stories260K.gguf")
	dir := t.TempDir()
	netArgs := []string{"--network", "paritytest", "--listen", "/ip4/127.0.0.1/tcp/0"}
	head := startCLI(t, bin, filepath.Join(dir, "head"), append([]string{"--model", model, "--layers", "0-3", "--threads", "1"}, netArgs...)...)
	boot := []string{"--bootstrap", head.addr}
	startCLI(t, bin, filepath.Join(dir, "tail"), append(append([]string{"--model", model, "--layers", "3-5", "--threads", "1"}, netArgs...), boot...)...)
	serve := launch(t, bin, append([]string{"serve", "--api", "127.0.0.1:0"}, append(netArgs, boot...)...)...)
	base := apiURL(t, serve)

	cases := []struct {
		name  string
		flags []string       // generate's
		body  map[string]any // the API request's sampling fields
	}{
		{"greedy", []string{"--temperature", "0"}, map[string]any{"temperature": 0}},
		{"sampled", []string{"--temperature", "0.8", "--top-k", "20", "--top-p", "0.9", "--min-p", "0.02", "--seed", "7"},
			map[string]any{"temperature": 0.8, "top_k": 20, "top_p": 0.9, "min_p": 0.02, "seed": 7}},
		{"repeat penalty", []string{"--temperature", "0.7", "--top-k", "0", "--top-p", "1", "--min-p", "0", "--seed", "11", "--repeat-penalty", "1.3"},
			map[string]any{"temperature": 0.7, "seed": 11, "repeat_penalty": 1.3}},
		{"openai penalties", []string{"--temperature", "0.9", "--top-k", "0", "--top-p", "0.95", "--min-p", "0", "--seed", "5",
			"--frequency-penalty", "0.8", "--presence-penalty", "0.5", "--repeat-last-n", "-1"},
			map[string]any{"temperature": 0.9, "top_p": 0.95, "seed": 5, "frequency_penalty": 0.8, "presence_penalty": 0.5}},
		{"stop across tokens", []string{"--temperature", "0", "--stop", "little girl"}, map[string]any{"temperature": 0, "stop": []string{"little girl"}}},
	}
	const prompt, maxTokens = "Once upon a time", 40
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"generate", "--json", "--model", "stories260K", "--prompt", prompt, "--max-tokens", fmt.Sprint(maxTokens)}, tc.flags...)
			out, err := exec.Command(bin, append(append(args, netArgs...), boot...)...).Output()
			if err != nil {
				t.Fatalf("generate: %v", err)
			}
			var gen struct {
				Text string `json:"text"`
				Stop string `json:"stop"`
			}
			if err := json.Unmarshal(out, &gen); err != nil {
				t.Fatal(err)
			}
			body := map[string]any{"model": "stories260K", "prompt": prompt, "max_tokens": maxTokens}
			for k, v := range tc.body {
				body[k] = v
			}
			status, resp, _ := postJSON(t, base+"/completions", body)
			if status != 200 {
				t.Fatalf("API: %d %v", status, resp)
			}
			text := resp["choices"].([]any)[0].(map[string]any)["text"].(string)
			if text != gen.Text || text == "" {
				t.Fatalf("generate and the API differ:\ngenerate %q\napi      %q", gen.Text, text)
			}
			if tc.name == "stop across tokens" && (gen.Stop != "stop" || strings.Contains(text, "little girl")) {
				t.Fatalf("stop string: stop %q text %q", gen.Stop, text)
			}
			t.Logf("%s: %q", tc.name, text)
		})
	}

	t.Run("model names a file", func(t *testing.T) {
		fifo := filepath.Join(t.TempDir(), "fifo")
		mkfifo(t, fifo)
		big := filepath.Join(t.TempDir(), "big.gguf")
		f, err := os.Create(big)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(4 << 30); err != nil { // sparse: 4 GiB to hash if anyone tried
			t.Fatal(err)
		}
		f.Close()
		ask := func(m string) (int, map[string]any, time.Duration) {
			return postJSON(t, base+"/chat/completions", map[string]any{"model": m, "max_tokens": 4,
				"messages": []map[string]string{{"role": "user", "content": "hi"}}})
		}
		unknownStatus, unknown, unknownTime := ask("no-such-model")
		if unknownStatus != 404 {
			t.Fatalf("unknown model: %d %v", unknownStatus, unknown)
		}
		for _, m := range []string{model, "/etc/passwd", fifo, big, filepath.Dir(model)} {
			status, resp, took := ask(m)
			e, _ := resp["error"].(map[string]any)
			if status != unknownStatus || e == nil || e["code"] != "model_not_found" {
				t.Fatalf("model %q: %d %v, want the unknown name's %d model_not_found", m, status, resp, unknownStatus)
			}
			if d := took - unknownTime; d > time.Second || d < -time.Second {
				t.Fatalf("model %q answered in %s, an unknown name in %s", m, took, unknownTime)
			}
			t.Logf("model %q: %d in %s (unknown name: %s)", m, status, took.Round(time.Millisecond), unknownTime.Round(time.Millisecond))
		}
	})
}
