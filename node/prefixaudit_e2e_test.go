package node

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/internal/testmodels"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/session"
)

// cachedCheat is a hop's engine that computes honestly except in sessions
// that adopted cached positions, where it adds 1e-3 to the last value of
// every output: a hop that cheats only where it used to be unauditable.
type cachedCheat struct{ session.Engine }

func (e cachedCheat) OpenSession(key session.Key, p session.EngineParams) (session.EngineSession, error) {
	s, err := e.Engine.OpenSession(key, p)
	if err != nil {
		return nil, err
	}
	return &cheatSession{EngineSession: s}, nil
}

type cheatSession struct {
	session.EngineSession
	adopted bool
}

func (s *cheatSession) Adopt(ctx context.Context, p session.Prefix) (int, []int32, error) {
	n, toks, err := s.EngineSession.(session.PrefixSession).Adopt(ctx, p)
	s.adopted = n > 0
	return n, toks, err
}

func (s *cheatSession) Keep(p session.Prefix) { s.EngineSession.(session.PrefixSession).Keep(p) }

func (s *cheatSession) AdoptedInputs() []float32 {
	return s.EngineSession.(session.InputKeeper).AdoptedInputs()
}

func (s *cheatSession) Forward(ctx context.Context, in session.Input) (session.Output, error) {
	out, err := s.EngineSession.Forward(ctx, in)
	if err == nil && s.adopted && len(out.Hidden) > 0 {
		out.Hidden[len(out.Hidden)-1] += 1e-3
	}
	return out, err
}

// A conversation through 3 real nodes with prefix caches, every turn
// audited (turn i audits hop i mod 3; greedy, sampled with a seed and
// speculative turns): the turns after the first reuse cached positions on
// every hop, their audits replay them from the inputs the hops kept and
// pass, and after the head the adopted rows are those the hop signed it
// received in the turn before (the cross-check). With a middle hop that
// cheats only in sessions that adopted cached positions, the first turn's
// audit passes and the second's convicts it, with a proof that verifies
// on its own.
func TestAuditCachedConversation(t *testing.T) {
	for _, cheat := range []bool{false, true} {
		t.Run(map[bool]string{false: "honest", true: "cheats_on_cached"}[cheat], func(t *testing.T) {
			testAuditCachedConversation(t, cheat)
		})
	}
}

func testAuditCachedConversation(t *testing.T, cheat bool) {
	model := testmodels.Path(t, "stories260K.gguf")
	tn := newTestNet(t)
	var mid *Node
	for i, r := range gguf.EvenSplit(5, 3) {
		n := tn.shardWith(model, &r, func(c *Config) {
			c.Engine.PrefixCacheCells = 512
			if cheat && i == 1 {
				c.WrapEngine = func(e session.Engine) session.Engine { return cachedCheat{e} }
			}
		})
		if i == 1 {
			mid = n
		}
	}
	c := tn.client()
	fp, nl := waitModel(t, c, "stories260K")
	o := c.Origin(nil)
	eng := &AuditEngines{Models: []string{model}, DataDir: t.TempDir(), Threads: 1}
	defer eng.Close()
	var mu sync.Mutex
	var reps []session.AuditReport
	target, draw := 0, 0
	o.Audit = &session.Auditor{Rate: 1, Engines: eng, Protocol: c.P2P().ProtocolID(session.ProtoAudit, session.ProtoVersion),
		OnReport: func(r session.AuditReport) { mu.Lock(); reps = append(reps, r); mu.Unlock() },
		Draw: func() float64 { // audit or not, then the hop
			draw++
			if draw%2 == 1 {
				return 0
			}
			return (float64(target) + 0.5) / 3
		}}
	sampled := &meshp2pb.SamplingParams{Temperature: 0.8, TopK: 40, TopP: 0.95, RepeatPenalty: 1.1, Seed: 77}
	spec := &meshp2pb.Speculation{Mode: meshp2pb.SpecMode_SPEC_MODE_NGRAM}
	turns := []struct {
		sp   *meshp2pb.SamplingParams
		spec *meshp2pb.Speculation
	}{{nil, nil}, {nil, nil}, {sampled, nil}, {nil, spec}, {sampled, nil}, {nil, spec}}
	if cheat {
		target, turns = 1, turns[:2]
	}
	convo := thinClientPrompt(t, c, fp, "Once upon a time, there was a little girl named Lily. She loved to play outside")
	for i, turn := range turns {
		if !cheat {
			target = i % 3
		}
		res, err := o.Generate(context.Background(), session.GenerateRequest{Fingerprint: fp, NLayer: nl, Prompt: convo, MaxTokens: 40,
			Sampling: turn.sp, Speculation: turn.spec})
		if err != nil {
			t.Fatal(err)
		}
		o.Audit.Wait()
		mu.Lock()
		rep := reps[len(reps)-1]
		mu.Unlock()
		t.Logf("turn %d: %d cached (per hop %v); audit of hop %d: %s, %d windows, %d adopted (%d cross-checked), exact %v %s",
			i, res.CachedTokens, res.HopCached, rep.Hop, rep.Outcome, rep.Windows, rep.Adopted, rep.CrossChecked, rep.Exact, rep.Reason)
		switch {
		case i == 0 && (rep.Outcome != session.AuditPassed || rep.Adopted != 0):
			t.Fatalf("first turn's audit: %+v", rep)
		case i > 0 && res.CachedTokens == 0:
			t.Fatalf("turn %d reused nothing", i)
		case i > 0 && !cheat && (rep.Outcome != session.AuditPassed || rep.Windows == 0 || rep.Adopted != res.HopCached[rep.Hop] || rep.Hop != target):
			t.Fatalf("turn %d's audit: %+v", i, rep)
		case i > 0 && !cheat && rep.Hop > 0 && rep.CrossChecked == 0:
			t.Fatalf("turn %d: the adopted rows of hop %d were not cross-checked against the turn before's", i, rep.Hop)
		case i > 0 && cheat && (rep.Outcome != session.AuditFailed || rep.Peer != mid.P2P().ID() || rep.Proof == nil || rep.Adopted == 0):
			t.Fatalf("the cheating hop's audit: %+v", rep)
		}
		convo = slices.Concat(convo, res.Tokens, []int32{13, 376, 471, 263})
	}
	if cheat {
		mu.Lock()
		p := reps[len(reps)-1].Proof
		mu.Unlock()
		judge := &AuditEngines{Models: []string{model}, DataDir: t.TempDir(), Threads: 1}
		defer judge.Close()
		v, err := session.Judge(context.Background(), p, judge)
		if err != nil || !v.Convicted || !v.Exact || len(p.GetAdopted()) == 0 {
			t.Fatalf("the proof alone: %+v, %v (%d adopted frames)", v, err, len(p.GetAdopted()))
		}
	}
}

// The churn soak's false accusation, with real engines: a client ran a
// prompt through head A (which kept its blocks); its next run of the same
// prompt goes through head B (A is avoided), B dies after a few decode
// steps, and the new epoch's head is A, which adopts the first run's
// blocks. The audit of that epoch's head must pass: every hop is honest.
// Alone, and with other clients generating beside it (other sessions'
// cells between this one's, and compactions).
func TestAuditFailoverOntoCachedHead(t *testing.T) {
	for _, busy := range []bool{false, true} {
		t.Run(map[bool]string{false: "alone", true: "busy"}[busy], func(t *testing.T) { testAuditFailoverOntoCachedHead(t, busy) })
	}
}

func testAuditFailoverOntoCachedHead(t *testing.T, busy bool) {
	model := testmodels.Path(t, "stories260K.gguf")
	tn := newTestNet(t)
	cfg := func(c *Config) { c.Engine.PrefixCacheCells = 512 }
	heads := []*Node{tn.shardWith(model, &gguf.Range{Start: 0, End: 2}, cfg), tn.shardWith(model, &gguf.Range{Start: 0, End: 2}, cfg)}
	mid := tn.shardWith(model, &gguf.Range{Start: 2, End: 4}, cfg)
	tail := tn.shardWith(model, &gguf.Range{Start: 4, End: 5}, cfg)
	c := tn.client()
	fp, nl := waitModel(t, c, "stories260K")
	for deadline := time.Now().Add(30 * time.Second); len(c.Table().Shards(fp)) < 4 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		lctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, _ = c.P2P().Discovery().Lookup(lctx, fp)
		cancel()
	}
	o := c.Origin(nil)
	eng := &AuditEngines{Models: []string{model}, DataDir: t.TempDir(), Threads: 1}
	defer eng.Close()
	var mu sync.Mutex
	var reps []session.AuditReport
	draw := 0
	o.Audit = &session.Auditor{Rate: 1, Engines: eng, Protocol: c.P2P().ProtocolID(session.ProtoAudit, session.ProtoVersion),
		OnReport: func(r session.AuditReport) { mu.Lock(); reps = append(reps, r); mu.Unlock() },
		Draw: func() float64 { // audit, then the head
			draw++
			if draw%2 == 1 {
				return 0
			}
			return 0.5 / 3
		}}
	prompt := thinClientPrompt(t, c, fp, "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends and her dog")
	req := session.GenerateRequest{Fingerprint: fp, NLayer: nl, Prompt: prompt, MaxTokens: 40}
	first, err := o.Generate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	o.Audit.Wait()
	a := first.Route.Hops[0].Peer
	b := heads[0]
	if b.P2P().ID() == a {
		b = heads[1]
	}
	time.Sleep(200 * time.Millisecond) // the first run's keeps
	if busy {
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for i := range 3 {
			oc := tn.client()
			waitModel(t, oc, "stories260K")
			bo := oc.Origin(nil)
			p := thinClientPrompt(t, oc, fp, fmt.Sprintf("Client %d tells a story about a cat, a dog and a bird who lived in a big old house", i))
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := 0; k < 50; k++ {
					select {
					case <-stop:
						return
					default:
					}
					_, _ = bo.Generate(context.Background(), session.GenerateRequest{Fingerprint: fp, NLayer: nl, Prompt: p, MaxTokens: 24 + k%16})
				}
			}()
		}
		defer func() { close(stop); wg.Wait() }()
		time.Sleep(300 * time.Millisecond)
	}
	o.Failures.Blame(a) // the next run's first epoch goes through b
	go killAfterSteps(b, 5, nil, append(heads, mid, tail)...)
	res, err := o.Generate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	o.Audit.Wait()
	if !equalTokens(res.Tokens, first.Tokens) {
		t.Fatalf("tokens differ from the first run:\n%v\n%v", res.Tokens, first.Tokens)
	}
	mu.Lock()
	rep := reps[len(reps)-1]
	mu.Unlock()
	t.Logf("reroutes %d, head %s (the first run's %s), hop_cached %v; audit of hop %d epoch %d: %s, adopted %d, windows %d, exact %v %s",
		res.Reroutes, res.Route.Hops[0].Peer, a, res.HopCached, rep.Hop, rep.Epoch, rep.Outcome, rep.Adopted, rep.Windows, rep.Exact, rep.Reason)
	if res.Reroutes != 1 || res.Route.Hops[0].Peer != a {
		t.Skipf("the failover did not land on the first run's head (reroutes %d): nothing to check", res.Reroutes)
	}
	// The new epoch is the route's last: 2, or later when busy clients
	// filled the hops for a moment (a capacity wait takes an epoch too).
	if rep.Outcome != session.AuditPassed || rep.Epoch != res.Route.Epoch || res.Route.Epoch < 2 || rep.Hop != 0 {
		t.Fatalf("audit of the new epoch's head (epoch %d): %+v", res.Route.Epoch, rep)
	}
}
