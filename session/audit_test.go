package session

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
)

// fakeEngines replays with fresh fake engines: the honest computation of
// any layers.
type fakeEngines struct{ class string }

func (f fakeEngines) Engine(_ context.Context, fp string, start, end int) (Engine, string, func(), error) {
	if fp != fakeFP {
		return nil, "", nil, ErrNoAuditor
	}
	return newFakeEngine(start, end), f.class, func() {}, nil
}

// auditLog collects an auditor's reports.
type auditLog struct {
	mu   sync.Mutex
	reps []AuditReport
}

func (l *auditLog) add(r AuditReport) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.reps = append(l.reps, r)
}

func (l *auditLog) all() []AuditReport {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]AuditReport(nil), l.reps...)
}

// auditing makes o audit every generation, the hop picked by pick (a
// route index), replaying on kernel class "fake".
func auditing(o *Origin, c *testHost, hop func() int, n func() int) *auditLog {
	l := &auditLog{}
	first := true
	o.Audit = &Auditor{Rate: 1, Engines: fakeEngines{"fake"}, Protocol: c.ProtocolID(ProtoAudit, ProtoVersion), OnReport: l.add,
		Draw: func() float64 {
			// maybeAudit draws twice: audit or not (0 < Rate), then the hop.
			first = !first
			if !first {
				return 0
			}
			return (float64(hop()) + 0.5) / float64(n())
		}}
	o.Failures = NewFailureMemory(0, 0)
	return l
}

// auditedHops starts one hop per range, of kernel class "fake" (the
// class fakeEngines replays on), each its own stage.
func auditedHops(t *testing.T, ranges [][2]int) ([]*fakeHop, [][]*fakeHop) {
	var hops []*fakeHop
	var stages [][]*fakeHop
	for _, r := range ranges {
		h := startHop(t, r[0], r[1], func(c *HopConfig) { c.KernelClass = "fake" })
		hops = append(hops, h)
		stages = append(stages, []*fakeHop{h})
	}
	return hops, stages
}

func TestAuditHonestHopsPass(t *testing.T) {
	routes := [][][2]int{{{0, 6}}, {{0, 3}, {3, 6}}, {{0, 2}, {2, 4}, {4, 6}}}
	for _, spec := range []bool{false, true} {
		for _, ranges := range routes {
			name := itoa(len(ranges)) + "hops"
			if spec {
				name += "/spec"
			}
			t.Run(name, func(t *testing.T) {
				hops, stages := auditedHops(t, ranges)
				o, c := newOrigin(t, stagePlanner{stages}, hops...)
				target := 0
				l := auditing(o, c, func() int { return target }, func() int { return len(ranges) })
				prompt := []int32{1, 2, 3, 4, 5, 1, 2, 3}
				req := GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: prompt, MaxTokens: 70, Sampling: &meshp2pb.SamplingParams{Seed: cyclicSeed | 5}}
				if spec {
					req.Speculation = &meshp2pb.Speculation{Mode: meshp2pb.SpecMode_SPEC_MODE_NGRAM, MaxDraft: 4, MaxWindows: 2}
				}
				for target = range ranges {
					res, err := o.Generate(context.Background(), req)
					if err != nil {
						t.Fatal(err)
					}
					if want := reference(prompt, 70, cyclicSeed|5); !equal(res.Tokens, want) {
						t.Fatalf("tokens %v, want %v", res.Tokens, want)
					}
					o.Audit.Wait()
				}
				reps := l.all()
				if len(reps) != len(ranges) {
					t.Fatalf("%d audits, want %d", len(reps), len(ranges))
				}
				for i, r := range reps {
					if r.Outcome != AuditPassed || r.Hop != i || r.Windows == 0 || !r.Exact || r.Peer != hops[i].host.ID() {
						t.Fatalf("audit %d: %+v", i, r)
					}
					t.Logf("hop %d: %d windows, %d frames, %d input bytes", r.Hop, r.Windows, r.Frames, r.InputBytes)
				}
				waitReleased(t, hops...)
			})
		}
	}
}

func TestAuditCatchesWrongActivations(t *testing.T) {
	for _, tc := range []struct {
		name   string
		target int
		spec   bool
	}{{"head", 0, false}, {"middle", 1, false}, {"tail", 2, false}, {"middle_spec", 1, true}, {"tail_spec", 2, true}} {
		t.Run(tc.name, func(t *testing.T) {
			ranges := [][2]int{{0, 2}, {2, 4}, {4, 6}}
			var hops []*fakeHop
			var stages [][]*fakeHop
			for _, r := range ranges {
				h := startHop(t, r[0], r[1], func(c *HopConfig) { c.KernelClass = "fake" })
				spare := startHop(t, r[0], r[1], func(c *HopConfig) { c.KernelClass = "fake" })
				hops = append(hops, h, spare)
				stages = append(stages, []*fakeHop{h, spare})
			}
			bad := stages[tc.target][0]
			bad.eng.tamper = func(n int, out *Output) {
				if n%7 != 3 {
					return
				}
				if len(out.Hidden) > 0 {
					out.Hidden[len(out.Hidden)-1] += 1e-3 // a small error in one step
				} else if len(out.Tokens) > 0 {
					// A wrong target, and one never seen before: the n-gram
					// proposer only proposes tokens of the history, so it
					// never equals the window's proposal. (3, in the cyclic
					// text, sometimes did: the result then "stopped at an
					// accepted proposal", the head refused it at once and the
					// re-routed epoch was audited clean instead.)
					out.Tokens[len(out.Tokens)-1] = int32(50 + n/7)
				} else if out.Token != 0 {
					out.Token = 3 // a wrong sample
				}
			}
			o, c := newOrigin(t, stagePlanner{stages}, hops...)
			l := auditing(o, c, func() int { return tc.target }, func() int { return 3 })
			req := GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: []int32{1, 2, 3, 4}, MaxTokens: 40, Sampling: &meshp2pb.SamplingParams{Seed: cyclicSeed | 5}}
			if tc.spec {
				req.Speculation = &meshp2pb.Speculation{Mode: meshp2pb.SpecMode_SPEC_MODE_NGRAM, MaxDraft: 4, MaxWindows: 2}
			}
			res, err := o.Generate(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			o.Audit.Wait()
			reps := l.all()
			if len(reps) != 1 || reps[0].Outcome != AuditFailed || reps[0].Peer != bad.host.ID() || reps[0].Proof == nil {
				t.Fatalf("reports %+v (failures %q)", reps, res.Failures)
			}
			t.Logf("convicted: %s", reps[0].Reason)
			if !o.Failures.Convicted(bad.host.ID()) {
				t.Fatal("the convicted hop is not avoided")
			}
			// The proof verifies on its own, survives a round trip, and
			// breaks when its evidence is changed.
			b, err := proto.Marshal(reps[0].Proof)
			if err != nil {
				t.Fatal(err)
			}
			p := &meshp2pb.Proof{}
			if err := proto.Unmarshal(b, p); err != nil {
				t.Fatal(err)
			}
			v, err := Judge(context.Background(), p, fakeEngines{"fake"})
			if err != nil || !v.Convicted {
				t.Fatalf("proof: %+v, %v", v, err)
			}
			if v, err := Judge(context.Background(), p, fakeEngines{"other-class"}); err != nil || v.Exact {
				t.Fatalf("cross-class judge: %+v, %v", v, err)
			}
			forged := proto.Clone(p).(*meshp2pb.Proof)
			forged.Inputs[len(forged.Inputs)-1].Header.PosStart++
			if _, err := Judge(context.Background(), forged, fakeEngines{"fake"}); !errors.Is(err, ErrProof) {
				t.Fatalf("changed inputs: %v", err)
			}
			forged = proto.Clone(p).(*meshp2pb.Proof)
			forged.Statements[0].Signature[3] ^= 1
			if _, err := Judge(context.Background(), forged, fakeEngines{"fake"}); !errors.Is(err, ErrProof) {
				t.Fatalf("changed signature: %v", err)
			}
			forged = proto.Clone(p).(*meshp2pb.Proof)
			forged.Open.Sampling.Seed++
			if _, err := Judge(context.Background(), forged, fakeEngines{"fake"}); !errors.Is(err, ErrProof) {
				t.Fatalf("changed open: %v", err)
			}
			// Not even the origin can re-sign the session with another
			// sampling or wire dtype: the statements name the open they
			// ran under.
			for _, change := range []func(o *meshp2pb.SessionOpen){
				func(o *meshp2pb.SessionOpen) { o.Sampling.Seed++ },
				func(o *meshp2pb.SessionOpen) { o.WireDtype = meshp2pb.DType_DTYPE_F16 },
			} {
				forged = proto.Clone(p).(*meshp2pb.Proof)
				change(forged.Open)
				if err := SignOpen(forged.Open, c.key(), time.Now()); err != nil {
					t.Fatal(err)
				}
				if _, err := Judge(context.Background(), forged, fakeEngines{"fake"}); !errors.Is(err, ErrProof) {
					t.Fatalf("an open re-signed by the origin: %v", err)
				}
			}
			// The next generation avoids the convicted hop.
			res, err = o.Generate(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			for _, h := range res.Route.Hops {
				if h.Peer == bad.host.ID() {
					t.Fatalf("route %v goes through the convicted %s", res.Route.Hops, bad.host.ID())
				}
			}
			o.Audit.Wait()
			if reps := l.all(); len(reps) != 2 || reps[1].Outcome != AuditPassed {
				t.Fatalf("second audit %+v", reps)
			}
		})
	}
}

// A hop cannot sign a statement other than what it sent: the next hop
// refuses it, blaming it.
func TestForgedStatementRefused(t *testing.T) {
	h1 := startHop(t, 0, 3, nil)
	h2 := startHop(t, 3, 6, nil)
	o, c := newOrigin(t, stagePlanner{[][]*fakeHop{{h1}, {h2}}}, h1, h2)
	_ = auditing(o, c, func() int { return 0 }, func() int { return 2 })
	hs := &hopSession{h: h1.svc, se: h1.svc.engines[0], open: &meshp2pb.SessionOpen{SessionId: make([]byte, 16), ModelFingerprint: fakeFP,
		Route: &meshp2pb.Route{Hops: []*meshp2pb.RouteHop{{PeerId: []byte(h1.host.ID()), Start: 0, End: 3}, {PeerId: []byte(h2.host.ID()), Start: 3, End: 6}}}},
		idx: 0, origin: c.ID(), key: Key{Origin: c.ID(), Epoch: 1}}
	tr := newTranscriber(hs, h1.host.key(), "fake")
	a, payload := downFrame(&meshp2pb.ActivationHeader{SessionId: make([]byte, 16), Epoch: 1, NRows: 1, LastChunk: true}, []float32{1, 2, 3, 4}, 0, 4)
	tr.input(a, nil)
	if err := tr.sent(a, payload, 4); err != nil {
		t.Fatal(err)
	}
	st, err := tr.statement(true)
	if err != nil {
		t.Fatal(err)
	}
	recv := &hopSession{h: h2.svc, open: hs.open, idx: 1, origin: c.ID(), key: hs.key}
	for _, tc := range []struct {
		name string
		got  []float32
		ok   bool
	}{{"same", []float32{1, 2, 3, 4}, true}, {"other", []float32{1, 2, 3, 5}, false}} {
		ck := &checker{}
		b, _ := downFrame(a, tc.got, 0, 4)
		_, pl := downFrame(a, tc.got, 0, 4)
		if err := ck.activation(b, pl, 4); err != nil {
			t.Fatal(err)
		}
		err := ck.check(st, recv, h1.host.ID(), 0)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrTranscript)) {
			t.Fatalf("%s: %v", tc.name, err)
		}
	}
	// Signed by someone else than the hop it names.
	ck := &checker{}
	if err := ck.check(st, recv, peer.ID("someone"), 0); !errors.Is(err, ErrTranscript) {
		t.Fatalf("wrong signer: %v", err)
	}
}

// The catch rate follows P = p·q/k per generation (p the audit rate, q the
// share of generations the hop corrupts, k the hops): over many trials
// the generations until the catch average 1/P (geometric; the draws are
// seeded, so the test is deterministic).
func TestAuditCatchRateMatchesFormula(t *testing.T) {
	const p, k, trials = 0.5, 3, 60
	hops, stages := auditedHops(t, [][2]int{{0, 2}, {2, 4}, {4, 6}})
	bad := hops[1]
	bad.eng.tamper = func(_ int, out *Output) { // q = 1: every generation
		if len(out.Hidden) > 0 {
			out.Hidden[0] += 1e-3
		}
	}
	o, c := newOrigin(t, stagePlanner{stages}, hops...)
	rng := rand.New(rand.NewPCG(1, 2))
	l := &auditLog{}
	o.Audit = &Auditor{Rate: p, Engines: fakeEngines{"fake"}, Protocol: c.ProtocolID(ProtoAudit, ProtoVersion), OnReport: l.add, Draw: rng.Float64}
	req := GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: []int32{1, 2, 3}, MaxTokens: 4}
	total := 0
	for range trials {
		o.Failures = NewFailureMemory(0, 0) // a fresh origin's memory per trial
		n := 0
		for n = 1; n <= 200; n++ {
			if _, err := o.Generate(context.Background(), req); err != nil {
				t.Fatal(err)
			}
			o.Audit.Wait()
			if o.Failures.Convicted(bad.host.ID()) {
				break
			}
		}
		total += n
	}
	P := p * 1.0 / k
	mean, sd := float64(total)/trials, math.Sqrt((1-P)/(P*P)/trials)
	t.Logf("P = %.3f: mean generations to the catch %.2f over %d trials, expected %.2f ± %.2f", P, mean, trials, 1/P, sd)
	if math.Abs(mean-1/P) > 3*sd {
		t.Fatalf("mean %.2f generations to the catch, the formula says %.2f ± %.2f (3σ)", mean, 1/P, 3*sd)
	}
	for _, r := range l.all() {
		if r.Outcome == AuditFailed && r.Peer != bad.host.ID() {
			t.Fatalf("an honest hop convicted: %+v", r)
		}
	}
}

// BenchmarkTranscriptFrame is what transcripts add to one decode frame on
// one hop, for a 4096-wide model on the f32 wire: the input and output
// digests, the sketch, the kept copy, and a 32nd of a signature and of
// the next hop's check (its digest and sketch of the same bytes, and a
// 32nd of a verification).
func BenchmarkTranscriptFrame(b *testing.B) {
	const nEmbd = 4096
	h := startHop(b, 0, 3, nil)
	c := newTestHost(b)
	open := &meshp2pb.SessionOpen{SessionId: make([]byte, 16), ModelFingerprint: fakeFP, NCtxNeeded: 1 << 20,
		Route: &meshp2pb.Route{Hops: []*meshp2pb.RouteHop{{PeerId: []byte(h.host.ID()), Start: 0, End: 3}, {PeerId: []byte(c.ID()), Start: 3, End: 6}}}}
	hs := &hopSession{h: h.svc, se: h.svc.engines[0], open: open, origin: c.ID(), key: Key{Origin: c.ID(), Epoch: 1}}
	tr := newTranscriber(hs, h.host.key(), "fake")
	recv := &hopSession{h: h.svc, open: open, idx: 1, origin: c.ID(), key: hs.key}
	ck := &checker{}
	kept := h.svc.audits.open(hs.key, 0, 1<<40)
	hidden := make([]float32, nEmbd)
	for i := range hidden {
		hidden[i] = float32(math.Sin(float64(i)))
	}
	in, inPayload := downFrame(&meshp2pb.ActivationHeader{SessionId: open.SessionId, Epoch: 1, NRows: 1, LastChunk: true}, hidden, 0, nEmbd)
	b.SetBytes(int64(len(inPayload)))
	b.ResetTimer()
	for i := range b.N {
		in.Step = uint64(i)
		tr.input(in, inPayload)
		out, payload := downFrame(in, hidden, 0, nEmbd)
		h.svc.audits.record(kept, false, out, payload, recordOverhead)
		if err := tr.sent(out, payload, nEmbd); err != nil {
			b.Fatal(err)
		}
		if err := ck.activation(out, payload, nEmbd); err != nil {
			b.Fatal(err)
		}
		st, err := tr.done()
		if err != nil {
			b.Fatal(err)
		}
		if st != nil {
			if err := ck.check(st, recv, h.host.ID(), 0); err != nil {
				b.Fatal(err)
			}
			kept.sent = kept.sent[:0] // the bench measures the copy, not the bound
		}
	}
}

// assignedPlanner is a tracker stand-in: its routes carry an audit
// assignment.
type assignedPlanner struct {
	stagePlanner
	a *meshp2pb.AuditAssignment
}

func (p assignedPlanner) Plan(ctx context.Context, req route.Request) (*route.Route, error) {
	rt, err := p.stagePlanner.Plan(ctx, req)
	if err == nil {
		rt.Audit = p.a
	}
	return rt, err
}

// A route's audit assignment (a tracker's draw) decides instead of the
// origin's own draw: which hop, and whether at all.
func TestAuditFollowsTheTrackersAssignment(t *testing.T) {
	hops, stages := auditedHops(t, [][2]int{{0, 2}, {2, 4}, {4, 6}})
	for _, tc := range []struct {
		a    *meshp2pb.AuditAssignment
		want int // hop audited, -1: none
	}{{&meshp2pb.AuditAssignment{Audit: true, Hop: 2}, 2}, {&meshp2pb.AuditAssignment{Audit: false, Hop: 1}, -1}, {&meshp2pb.AuditAssignment{Audit: true, Hop: 1}, 1}} {
		o, c := newOrigin(t, assignedPlanner{stagePlanner{stages}, tc.a}, hops...)
		l := auditing(o, c, func() int { return 0 }, func() int { return 3 }) // its own draw would audit hop 0
		if _, err := o.Generate(context.Background(), GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: []int32{1, 2}, MaxTokens: 5}); err != nil {
			t.Fatal(err)
		}
		o.Audit.Wait()
		reps := l.all()
		switch {
		case tc.want < 0 && len(reps) != 0:
			t.Fatalf("assignment %v: audited %+v", tc.a, reps)
		case tc.want >= 0 && (len(reps) != 1 || reps[0].Hop != tc.want || reps[0].Outcome != AuditPassed):
			t.Fatalf("assignment %v: reports %+v", tc.a, reps)
		}
	}
}

// Issue 37, claims checked: the kernel class a hop signs decides how its
// audit compares (exact only within a batch-invariant class; a tail's
// tokens not across classes), so a hop signing another class than it
// advertises is convicted by the origin; one signing what it advertises
// passes.
func TestAuditClaimedKernelClass(t *testing.T) {
	for _, tc := range []struct {
		name, signs string
		want        AuditOutcome
	}{
		{"signs what it advertises", "fake", AuditPassed},
		{"signs another class", "fake-gpu", AuditFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h0 := startHop(t, 0, 3, func(c *HopConfig) { c.KernelClass = tc.signs })
			h1 := startHop(t, 3, 6, func(c *HopConfig) { c.KernelClass = "fake" })
			h0.advertised, h1.advertised = "fake", "fake"
			o, c := newOrigin(t, stagePlanner{[][]*fakeHop{{h0}, {h1}}}, h0, h1)
			l := auditing(o, c, func() int { return 0 }, func() int { return 2 })
			prompt := []int32{1, 2, 3, 4}
			res, err := o.Generate(context.Background(), GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: prompt, MaxTokens: 20})
			if err != nil {
				t.Fatal(err)
			}
			if want := reference(prompt, 20, 0); !equal(res.Tokens, want) {
				t.Fatalf("tokens %v, want %v", res.Tokens, want)
			}
			o.Audit.Wait()
			reps := l.all()
			if len(reps) != 1 || reps[0].Outcome != tc.want || reps[0].Peer != h0.host.ID() {
				t.Fatalf("audits %+v, want one %s of the head", reps, tc.want)
			}
			if got := o.Failures.Convicted(h0.host.ID()); got != (tc.want == AuditFailed) {
				t.Fatalf("head convicted: %v (%s)", got, reps[0].Reason)
			}
			t.Logf("%s: %s", reps[0].Outcome, reps[0].Reason)
			waitReleased(t, h0, h1)
		})
	}
}
