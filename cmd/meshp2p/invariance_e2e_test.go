package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/neuron-tai/meshp2p/internal/testbin"
)

// invSwarm is head, two replicas of the middle, tail and a gateway, all
// real `meshp2p` processes on loopback, started with the README's flags.
type invSwarm struct {
	bin, model, name, dir string
	net, boot             []string
	mids                  []*cliProc
	serve                 *cliProc
	base                  string
}

func startInvSwarm(t *testing.T, typ string, serveArgs ...string) *invSwarm {
	t.Helper()
	bin := testbin.CLI(t)
	dir := t.TempDir()
	s := &invSwarm{bin: bin, dir: dir, name: "inv-" + typ, model: filepath.Join(dir, "inv-"+typ+".gguf")}
	if _, _, err := runShardArgs(t, "synth", "--layers", "6", "--embd", "256", "--heads", "4", "--kv-heads", "2", "--ff", "512",
		"--type", typ, "--seed", "5", "--name", s.name, "-o", s.model); err != nil {
		t.Fatal(err)
	}
	s.net = []string{"--network", "inv" + typ, "--listen", "/ip4/127.0.0.1/tcp/0"}
	head := s.node(t, "head", "0-2")
	s.boot = []string{"--bootstrap", head.addr}
	s.mids = []*cliProc{s.node(t, "midA", "2-4"), s.node(t, "midB", "2-4")}
	s.node(t, "tail", "4-6")
	s.serve = launch(t, bin, append(append([]string{"serve", "--api", "127.0.0.1:0"}, serveArgs...), append(s.net, s.boot...)...)...)
	s.base = apiURL(t, s.serve)
	return s
}

func (s *invSwarm) node(t *testing.T, name, layers string) *cliProc {
	t.Helper()
	args := append([]string{"--model", s.model, "--layers", layers, "--threads", "1"}, s.net...)
	return startCLI(t, s.bin, filepath.Join(s.dir, name), append(args, s.boot...)...)
}

// local is `generate --local` of prompt: text and token count.
func (s *invSwarm) local(t *testing.T, prompt string, n int) (string, int) {
	t.Helper()
	return localText(t, s.bin, "--model", s.model, "--prompt", prompt, "--max-tokens", fmt.Sprint(n), "--temperature", "0")
}

// complete is a greedy completion through the gateway, retried while the
// swarm is still forming (bounded).
func (s *invSwarm) complete(ctx context.Context, prompt string, n int) (string, error) {
	c := openai.NewClient(option.WithBaseURL(s.base+"/"), option.WithMaxRetries(0))
	var err error
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		var r *openai.Completion
		r, err = c.Completions.New(ctx, openai.CompletionNewParams{Model: openai.CompletionNewParamsModel(s.name),
			Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)},
			MaxTokens: openai.Int(int64(n)), Temperature: openai.Float(0)})
		if err == nil {
			return r.Choices[0].Text, nil
		}
	}
	return "", err
}

// waitListed waits (bounded) until `meshp2p status` shows peer serving.
func (s *invSwarm) waitListed(t *testing.T, id string) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		args := append([]string{"status", "--json"}, append(s.net, s.boot...)...)
		out, _ := exec.Command(s.bin, args...).Output()
		if strings.Contains(string(out), id) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the swarm never listed restarted peer %s:\n%s", id, out)
		}
	}
}

var invPrompts = []string{"Once upon a time", "The cat", "A little girl went", "In the park there was", "He said", "Tom and Lily", "The sun", "One day a dog"}

// Eight greedy sessions at once, through the CLI (eight `generate`
// processes) and through the API (eight concurrent requests), each equal
// token for token to `generate --local`: the hops batch the sessions
// together, and batch invariance makes that invisible in the output.
func TestSwarmConcurrentGreedyEqualsLocal(t *testing.T) {
	if testing.Short() {
		t.Skip("starts five processes and eight clients")
	}
	for _, typ := range []string{"f16", "q8_0"} {
		t.Run(typ, func(t *testing.T) {
			s := startInvSwarm(t, typ)
			const n = 48
			want := make([]string, len(invPrompts))
			for i, p := range invPrompts {
				want[i], _ = s.local(t, p, n)
			}
			ctx := context.Background()
			if _, err := s.complete(ctx, "warm up", 2); err != nil {
				t.Fatalf("swarm never served: %v\n%s", err, s.serve.log.String())
			}
			got := make([]string, len(invPrompts))
			errs := make([]error, len(invPrompts))
			var wg sync.WaitGroup
			for i, p := range invPrompts {
				wg.Add(1)
				go func() {
					defer wg.Done()
					got[i], errs[i] = s.complete(ctx, p, n)
				}()
			}
			wg.Wait()
			for i := range invPrompts {
				if errs[i] != nil || got[i] != want[i] {
					t.Fatalf("API session %d (%q): %v\napi   %q\nlocal %q", i, invPrompts[i], errs[i], got[i], want[i])
				}
			}
			for i, p := range invPrompts {
				wg.Add(1)
				go func() {
					defer wg.Done()
					args := append([]string{"generate", "--json", "--model", s.name, "--prompt", p, "--max-tokens", fmt.Sprint(n), "--temperature", "0"}, append(s.net, s.boot...)...)
					out, err := exec.Command(s.bin, args...).Output()
					if err != nil {
						errs[i] = fmt.Errorf("generate: %w", err)
						return
					}
					var res struct {
						Text string `json:"text"`
					}
					errs[i] = json.Unmarshal(out, &res)
					got[i] = res.Text
				}()
			}
			wg.Wait()
			for i := range invPrompts {
				if errs[i] != nil || got[i] != want[i] {
					t.Fatalf("CLI session %d (%q): %v\ncli   %q\nlocal %q", i, invPrompts[i], errs[i], got[i], want[i])
				}
			}
			t.Logf("%s: 8 concurrent API and 8 concurrent CLI greedy sessions of %d tokens equal --local", typ, n)
		})
	}
}

// A middle hop SIGKILLed at many positions of a 256-token greedy
// generation: the replacement replica rebuilds the session's KV cache by
// prefilling the context in batches, which batch invariance makes bitwise
// what the token-by-token decode had, so the text always equals --local.
// After each kill the node is started again, so the next trial has a
// replica to fail over to. The gateway speculates with --speculative
// ngram, so windows of proposals are in flight when the hop dies (q8_0
// samples at temperature 0.8 with a seed: the same seed gives the same
// text across re-routes): the re-route re-prefills only committed tokens.
func TestFailoverAtManyPositionsEqualsLocal(t *testing.T) {
	if testing.Short() {
		t.Skip("starts five processes and restarts them")
	}
	for _, tc := range []struct {
		typ, spec string
		temp      float64
	}{{"f16", "ngram", 0}, {"q8_0", "ngram", 0.8}} {
		typ := tc.typ
		t.Run(typ, func(t *testing.T) {
			s := startInvSwarm(t, typ, "--speculative", tc.spec)
			accepted, proposed := 0, 0
			const n, prompt = 256, "Once upon a time"
			want, wantN := localText(t, s.bin, "--model", s.model, "--prompt", prompt, "--max-tokens", fmt.Sprint(n), "--temperature", fmt.Sprint(tc.temp),
				"--top-k", "0", "--top-p", "1", "--min-p", "0", "--seed", "11")
			if wantN < n {
				t.Fatalf("reference stopped after %d tokens", wantN)
			}
			ctx := context.Background()
			if _, err := s.complete(ctx, "warm up", 2); err != nil {
				t.Fatalf("swarm never served: %v\n%s", err, s.serve.log.String())
			}
			c := openai.NewClient(option.WithBaseURL(s.base+"/"), option.WithMaxRetries(0))
			// Kill points: fractions of the reference text (a delta can
			// carry several tokens, so count characters, not deltas).
			for _, frac := range []float64{0.01, 0.04, 0.15, 0.38, 0.6, 0.82, 0.97} {
				at := max(1, int(frac*float64(len(want))))
				st := c.Completions.NewStreaming(ctx, openai.CompletionNewParams{Model: openai.CompletionNewParamsModel(s.name),
					Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)},
					MaxTokens: openai.Int(n), Temperature: openai.Float(tc.temp), Seed: openai.Int(11)})
				var text string
				var killed *cliProc
				var route *apiExt // the latest route the gateway reported
				for st.Next() {
					ch := st.Current()
					if len(ch.Choices) > 0 {
						text += ch.Choices[0].Text
					}
					if e := chunkExt(ch.RawJSON()); e != nil && len(e.Route) > 0 {
						route = e
						if e.Speculation != nil {
							accepted += e.Speculation.Accepted
							proposed += e.Speculation.Proposed
						}
					}
					if killed != nil || route == nil || len(text) < at {
						continue
					}
					for _, h := range route.Route {
						for _, m := range s.mids {
							if h.Start == 2 && h.Peer == m.peerID {
								killed = m
							}
						}
					}
					if killed == nil {
						t.Fatalf("kill at %d: route %+v names neither middle node", at, route.Route)
					}
					if err := killed.cmd.Process.Kill(); err != nil { // SIGKILL, by PID
						t.Fatal(err)
					}
				}
				if err := st.Err(); err != nil {
					t.Fatalf("kill at %d: client saw %v\n%s", at, err, s.serve.log.String())
				}
				if killed == nil {
					t.Fatalf("kill at %d: no route naming a middle node was reported", at)
				}
				if text != want {
					t.Fatalf("kill after %d characters: text differs from --local\napi   %q\nlocal %q", at, text, want)
				}
				// Restart the killed replica (same data dir and identity) and
				// wait until the swarm lists it again, so the next trial has a
				// replica to fail over to.
				_ = killed.cmd.Wait()
				i := 0
				if killed == s.mids[1] {
					i = 1
				}
				name := []string{"midA", "midB"}[i]
				if err := os.Remove(filepath.Join(s.dir, name, "node.json")); err != nil {
					t.Fatal(err)
				}
				s.mids[i] = s.node(t, name, "2-4")
				s.waitListed(t, s.mids[i].peerID)
				t.Logf("kill after %d of %d characters: text equals --local; %s restarted", at, len(want), name)
			}
			t.Logf("--speculative %s: %d of %d proposals accepted over the trials", tc.spec, accepted, proposed)
			if proposed == 0 {
				t.Errorf("--speculative ngram: nothing proposed in any trial: the kills never met a speculative window")
			}
		})
	}
}
