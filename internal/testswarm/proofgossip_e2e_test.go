package testswarm_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/client"
	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/internal/testbin"
	"github.com/neuron-tai/meshp2p/internal/testmodels"
	"github.com/neuron-tai/meshp2p/internal/testswarm"
	"github.com/neuron-tai/meshp2p/node"
	"github.com/neuron-tai/meshp2p/session"
)

// liarSwarm starts stories260K in three hops on loopback (0-2, 2-4, 4-5)
// whose middle (bad) adds 0.01 to one value of every frame it sends.
func liarSwarm(t *testing.T) (tn *testswarm.Net, model string, mid gguf.Range, head, bad *node.Node) {
	model = testmodels.Path(t, "stories260K.gguf")
	mid = gguf.Range{Start: 2, End: 4}
	tn = testswarm.New(t)
	head = tn.Shard(model, &gguf.Range{Start: 0, End: 2}, nil)
	bad = tn.Shard(model, &mid, func(c *node.Config) {
		c.WrapEngine = func(e session.Engine) session.Engine {
			return &hostile{compute: e, tamper: func(_ int64, _ session.Key, out *session.Output) {
				if len(out.Hidden) > 0 {
					out.Hidden[0] += 0.01
				}
			}}
		}
	})
	tn.Shard(model, &gguf.Range{Start: 4, End: 5}, nil)
	return tn, model, mid, head, bad
}

// Issue 37: a swarm without a tracker learns from one proof. Three real
// hops on loopback, the middle one lying on every frame; origin A audits
// (rate 1, with the model), origin B audits nothing but holds the model,
// origin C holds nothing. Once A's audit convicts the liar, the proof is
// gossiped: B replays it and convicts the liar itself, C (which cannot
// replay) avoids it while another copy of the layers serves; with an
// honest replica up, the next generations of every origin avoid the liar.
func TestGossipedProofReachesEveryOrigin(t *testing.T) {
	tn, model, mid, _, bad := liarSwarm(t)
	liar := bad.P2P().ID()

	type origin struct {
		name string
		mem  *session.FailureMemory
		n    *node.Node
		c    *client.Client
	}
	var mu sync.Mutex
	var caught *session.AuditReport
	mk := func(name string, rate float64, models []string) *origin {
		o := &origin{name: name, mem: session.NewFailureMemory(0, 0)}
		o.n = tn.PeerWith(func(c *node.Config) {
			c.AuditRate, c.AuditModels, c.Failures = rate, models, o.mem
			c.OnAudit = func(r session.AuditReport) {
				if r.Outcome == session.AuditFailed {
					mu.Lock()
					caught = &r
					mu.Unlock()
				}
			}
		})
		o.c = tn.ClientOn(o.n)
		return o
	}
	a := mk("A (audits)", 1, []string{model})
	b := mk("B (holds the model)", 0, []string{model})
	c := mk("C (holds nothing)", 0, nil)
	// A node drops a proof against a peer its table does not list as
	// serving (a throwaway key's, as far as it can tell), so every origin
	// first learns the liar's advert (under load gossip takes a while).
	for _, o := range []*origin{a, b, c} {
		waitShard(t, o.c, liar)
	}
	ctx := context.Background()
	gen := func(o *origin) *client.Result {
		t.Helper()
		res, err := o.c.Generate(ctx, client.Request{Model: "stories260K", Wait: 30 * time.Second, WaitForRoute: true,
			Prompt: client.Prompt{Text: "Once upon a time"}, MaxTokens: 8})
		if err != nil {
			t.Fatalf("%s: %v", o.name, err)
		}
		return res
	}
	// Per generation, A audits one of three hops: the liar is caught with
	// probability 1/3; 30 misses in a row have probability 5e-6.
	for g := 1; g <= 30; g++ {
		gen(a)
		a.n.WaitAudits()
		mu.Lock()
		done := caught != nil
		mu.Unlock()
		if done {
			t.Logf("A caught the liar at generation %d", g)
			break
		}
	}
	mu.Lock()
	rep := caught
	mu.Unlock()
	if rep == nil || rep.Peer != liar {
		t.Fatalf("A's audits did not convict the liar: %+v", rep)
	}
	t0 := time.Now()
	for deadline := t0.Add(60 * time.Second); !(b.mem.Convicted(liar) && c.mem.Avoided(liar)); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after 60 s: B convicted the liar: %v, C avoids it: %v", b.mem.Convicted(liar), c.mem.Avoided(liar))
		}
	}
	t.Logf("the proof reached B (replayed, convicted) and C (suspected) in %v", time.Since(t0).Round(time.Millisecond))
	if c.mem.Convicted(liar) {
		t.Error("C convicted the liar without replaying the proof")
	}
	replica := tn.Shard(model, &mid, nil)
	for _, o := range []*origin{a, b, c} {
		waitShard(t, o.c, replica.P2P().ID())
		for range 2 {
			for _, h := range gen(o).Session.Route.Hops {
				if h.Peer == liar {
					t.Fatalf("%s: a generation after the proof went through the liar", o.name)
				}
			}
		}
	}
}

// Issue 37, row 9: a conviction outlives the process. `meshp2p generate`
// runs (real processes, the README's flags) against a swarm whose only
// middle hop lies, auditing every generation with the model, until one
// saves a fraud proof; then an honest replica of the layers starts, and
// every later run with the same --data-dir routes around the liar (before,
// 1-4 of 5 did not: nothing the next process read kept the conviction).
func TestGenerateRemembersConvictionAcrossRuns(t *testing.T) {
	tn, model, mid, head, bad := liarSwarm(t)
	liar := bad.P2P().ID().String()
	var boot string
	for _, a := range head.P2P().AddrInfo().Addrs {
		if strings.HasPrefix(a.String(), "/ip4/127.0.0.1/tcp/") {
			boot = a.String() + "/p2p/" + head.P2P().ID().String()
		}
	}
	if boot == "" {
		t.Fatalf("no loopback TCP address in %v", head.P2P().AddrInfo().Addrs)
	}
	bin, dd := testbin.CLI(t), t.TempDir()
	gen := func(rate string) []string {
		t.Helper()
		cmd := exec.Command(bin, "generate", "--json", "--model", "stories260K", "--prompt", "Once upon a time", "--max-tokens", "8",
			"--network", tn.Network, "--bootstrap", boot, "--listen", "/ip4/127.0.0.1/tcp/0", "--test-mode", "--data-dir", dd,
			"--audit-rate", rate, "--audit-model", model)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("generate: %v\n%s", err, out)
		}
		var res struct {
			Route []struct {
				Peer string `json:"peer"`
			} `json:"route"`
		}
		if err := json.Unmarshal(out, &res); err != nil {
			t.Fatalf("generate --json: %v\n%s", err, out)
		}
		var peers []string
		for _, h := range res.Route {
			peers = append(peers, h.Peer)
		}
		return peers
	}
	proofs := func() int {
		es, _ := os.ReadDir(filepath.Join(dd, "proofs"))
		return len(es)
	}
	// One of three hops audited per run: 30 misses in a row, 5e-6.
	for run := 1; run <= 30 && proofs() == 0; run++ {
		gen("1")
		if proofs() > 0 {
			t.Logf("run %d saved a fraud proof", run)
		}
	}
	if proofs() == 0 {
		t.Fatal("30 audited runs caught no lie")
	}
	replica := tn.Shard(model, &mid, nil)
	waitShard(t, tn.ClientOn(tn.Peer()), replica.P2P().ID())
	for run := range 5 {
		if slices.Contains(gen("0"), liar) {
			t.Fatalf("run %d after the conviction routed through the liar", run+1)
		}
	}
}
