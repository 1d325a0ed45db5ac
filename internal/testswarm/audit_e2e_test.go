package testswarm_test

import (
	"context"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/client"
	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/internal/testbin"
	"github.com/neuron-tai/meshp2p/internal/testmodels"
	"github.com/neuron-tai/meshp2p/internal/testswarm"
	"github.com/neuron-tai/meshp2p/node"
	"github.com/neuron-tai/meshp2p/node/shardengine"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/session"
)

// hostile is an engine a dishonest hop serves through: it claims info
// (nil: compute's) and computes with compute, whose outputs tamper may
// change (n: the Forwards so far on this hop; key: the session).
type hostile struct {
	compute session.Engine
	info    *session.ShardInfo
	tamper  func(n int64, key session.Key, out *session.Output)
	n       atomic.Int64
}

func (h *hostile) Info() session.ShardInfo {
	if h.info != nil {
		return *h.info
	}
	return h.compute.Info()
}
func (h *hostile) IsEOG(tok int32) bool { return h.compute.IsEOG(tok) }
func (h *hostile) OpenSession(key session.Key, p session.EngineParams) (session.EngineSession, error) {
	s, err := h.compute.OpenSession(key, p)
	if err != nil {
		return nil, err
	}
	return &hostileSession{EngineSession: s, h: h, key: key}, nil
}

type hostileSession struct {
	session.EngineSession
	h   *hostile
	key session.Key
}

func (s *hostileSession) Forward(ctx context.Context, in session.Input) (session.Output, error) {
	out, err := s.EngineSession.Forward(ctx, in)
	n := s.h.n.Add(1)
	if err == nil && s.h.tamper != nil {
		s.h.tamper(n, s.key, &out)
	}
	return out, err
}

// loadShard loads layers r of model as an engine (what a hostile hop
// really computes with).
func loadShard(t *testing.T, model string, r gguf.Range) session.Engine {
	t.Helper()
	ctx := context.Background()
	res, err := gguf.Split(ctx, model, []gguf.Range{r}, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := engine.LoadModel(ctx, res[0].Path, engine.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sh, err := engine.NewShard(ctx, m, engine.Config{NCtx: 512, NBatch: 64, MaxSessions: 4, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sh.Close(); m.Close() })
	return shardengine.Engine{Model: m, Shard: sh}
}

// TestAuditsCatchHostileHops runs a 3-hop loopback swarm of real nodes
// whose middle hop (layers 2-4) is dishonest, and a client peer that
// audits at rate p with the model file. Per generation an audit picks one
// of the k = 3 hops, so a hop that corrupts a generation with probability
// q is caught per generation with probability P = p·q/k, and within N
// generations with probability 1-(1-P)^N: the test allows the N at which
// a miss has probability 1e-4 and fails beyond it. Once caught, the proof
// verifies offline, and with an honest replica of the layers started,
// later generations never route through the convicted hop.
func TestAuditsCatchHostileHops(t *testing.T) {
	model := testmodels.Path(t, "stories260K.gguf")
	mid := gguf.Range{Start: 2, End: 4}
	const tokens, k = 16, 3
	// Frames through the middle hop per generation: the prompt's prefill
	// (one chunk) and one per generated token but the last.
	const frames = 1 + tokens - 1
	for _, tc := range []struct {
		name string
		p    float64 // audit rate
		q    float64 // share of generations the hop corrupts
		wrap func(t *testing.T, honest session.Engine) session.Engine
	}{
		{"noise_1e-3_one_step_in_50", 1, float64(frames) / 50, func(t *testing.T, honest session.Engine) session.Engine {
			return &hostile{compute: honest, tamper: func(n int64, _ session.Key, out *session.Output) {
				if n%50 == 0 && len(out.Hidden) > 0 {
					out.Hidden[len(out.Hidden)-1] += 1e-3
				}
			}}
		}},
		{"f16_instead_of_f32", 0.5, 1, func(t *testing.T, honest session.Engine) session.Engine {
			f16 := filepath.Join(t.TempDir(), "f16.gguf")
			if err := engine.Quantize(context.Background(), model, f16, engine.QuantF16); err != nil {
				t.Fatal(err)
			}
			return &hostile{compute: loadShard(t, f16, mid)}
		}},
		{"skips_a_layer", 0.5, 1, func(t *testing.T, honest session.Engine) session.Engine {
			info := honest.Info()
			return &hostile{compute: loadShard(t, model, gguf.Range{Start: mid.Start + 1, End: mid.End}), info: &info}
		}},
		// It cannot know which sessions are audited (the draw stays with
		// the origin until the session ended): it guesses, and lies on
		// the sessions it guesses are not.
		{"lies_when_it_guesses_unaudited", 1, 0.5, func(t *testing.T, honest session.Engine) session.Engine {
			return &hostile{compute: honest, tamper: func(_ int64, key session.Key, out *session.Output) {
				if key.ID[0]%2 == 0 && len(out.Hidden) > 0 {
					out.Hidden[0] += 0.01
				}
			}}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			P := tc.p * tc.q / k
			limit := int(math.Ceil(math.Log(1e-4) / math.Log(1-P)))
			tn := testswarm.New(t)
			tn.Shard(model, &gguf.Range{Start: 0, End: 2}, nil)
			bad := tn.Shard(model, &mid, func(c *node.Config) {
				c.WrapEngine = func(e session.Engine) session.Engine { return tc.wrap(t, e) }
			})
			tn.Shard(model, &gguf.Range{Start: 4, End: 5}, nil)
			var mu sync.Mutex
			var reports []session.AuditReport
			peerNode := tn.PeerWith(func(c *node.Config) {
				c.AuditRate, c.AuditModels = tc.p, []string{model}
				c.OnAudit = func(r session.AuditReport) { mu.Lock(); reports = append(reports, r); mu.Unlock() }
			})
			c := tn.ClientOn(peerNode)
			ctx := context.Background()
			rng := rand.New(rand.NewPCG(uint64(len(tc.name)), 7))
			prompts := []string{"Once upon a time", "The little dog", "Lily and Tom went to the park", "One day, a bird"}
			gen := func() *client.Result {
				res, err := c.Generate(ctx, client.Request{Model: "stories260K", Wait: 30 * time.Second, WaitForRoute: true,
					Prompt: client.Prompt{Text: prompts[rng.IntN(len(prompts))]}, MaxTokens: tokens})
				if err != nil {
					t.Fatal(err)
				}
				peerNode.WaitAudits()
				return res
			}
			caught, outcomes := 0, map[session.AuditOutcome]int{}
			var proofRep session.AuditReport
			for g := 1; g <= limit && caught == 0; g++ {
				gen()
				mu.Lock()
				for _, r := range reports {
					outcomes[r.Outcome]++
					if r.Outcome == session.AuditFailed {
						if r.Peer != bad.P2P().ID() {
							t.Fatalf("generation %d: an audit convicted %s, an honest hop: %s", g, r.Peer, r.Reason)
						}
						caught, proofRep = g, r
					}
				}
				reports = nil
				mu.Unlock()
			}
			t.Logf("P = p·q/k = %.2f·%.2f/%d = %.3f: expected %.1f generations, allowed %d; caught at generation %d; audits %v",
				tc.p, tc.q, k, P, 1/P, limit, caught, outcomes)
			if caught == 0 {
				t.Fatalf("not caught within %d generations (P = %.3f per generation)", limit, P)
			}
			if outcomes[session.AuditInconclusive] > 0 {
				t.Errorf("%d inconclusive audits", outcomes[session.AuditInconclusive])
			}
			eng := &node.AuditEngines{Models: []string{model}, DataDir: t.TempDir(), Threads: 1}
			defer eng.Close()
			v, err := session.Judge(ctx, proofRep.Proof, eng)
			if err != nil || !v.Convicted || !v.Exact {
				t.Fatalf("the proof does not verify: %+v, %v", v, err)
			}
			t.Logf("proof: %s", v.Reason)
			// The CLI checks the saved proof offline; a proof whose
			// evidence was changed does not convict.
			b, err := proto.Marshal(proofRep.Proof)
			if err != nil {
				t.Fatal(err)
			}
			file := filepath.Join(t.TempDir(), "hop.proof")
			if err := os.WriteFile(file, b, 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(testbin.CLI(t), "proof", "verify", file, "--model", model).CombinedOutput()
			if err != nil || !strings.Contains(string(out), "verdict:  convicted") {
				t.Fatalf("proof verify: %v\n%s", err, out)
			}
			forged := proto.Clone(proofRep.Proof).(*meshp2pb.Proof)
			forged.Inputs[0].Payload[0] ^= 1
			if b, err = proto.Marshal(forged); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(file, b, 0o644); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command(testbin.CLI(t), "proof", "verify", file, "--model", model).CombinedOutput(); err == nil {
				t.Fatalf("a forged proof verified:\n%s", out)
			} else {
				t.Logf("forged proof refused: %s", strings.TrimSpace(string(out)))
			}
			// An honest replica; later generations avoid the convicted hop.
			replica := tn.Shard(model, &mid, nil)
			waitShard(t, c, replica.P2P().ID())
			for range 3 {
				res := gen()
				for _, h := range res.Session.Route.Hops {
					if h.Peer == bad.P2P().ID() {
						t.Fatalf("a generation after the conviction went through %s", h.Peer)
					}
				}
			}
		})
	}
}

// waitShard waits until the client's table lists a shard of p.
func waitShard(t *testing.T, c *client.Client, p peer.ID) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		for _, s := range c.Table().Shards("") {
			if s.Peer == p {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never reached the client's table", p)
		}
	}
}
