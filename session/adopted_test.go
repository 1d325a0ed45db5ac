package session

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// cachedTurns is a three-hop route whose hops have prefix caches, audited
// at every generation (the hop picked by *target), and two turns of one
// conversation: the second reuses 64 cached positions on every hop.
type cachedTurns struct {
	hops   []*fakeHop
	caches []*fakeCache
	o      *Origin
	log    *auditLog
	target int
	turn1  []int32
	turn2  []int32
}

func newCachedTurns(t *testing.T) *cachedTurns {
	ct := &cachedTurns{}
	ct.hops, _ = auditedHops(t, [][2]int{{0, 2}, {2, 4}, {4, 6}})
	for _, h := range ct.hops {
		ct.caches = append(ct.caches, h.withCache())
	}
	o, c := newOrigin(t, stagePlanner{[][]*fakeHop{{ct.hops[0]}, {ct.hops[1]}, {ct.hops[2]}}}, ct.hops...)
	o.Chunk = 16
	ct.o = o
	ct.log = auditing(o, c, func() int { return ct.target }, func() int { return 3 })
	ct.turn1 = make([]int32, 50)
	for i := range ct.turn1 {
		ct.turn1[i] = int32(i%90 + 1)
	}
	ct.turn2 = slices.Concat(ct.turn1, reference(ct.turn1, 20, 3), []int32{40, 41, 42, 43, 44, 45, 46, 47, 48, 49})
	return ct
}

// gen runs prompt, waits for its audit and the hops' keeps, and returns
// the result and the audit's report.
func (ct *cachedTurns) gen(t *testing.T, prompt []int32) (*Result, AuditReport) {
	t.Helper()
	res, err := ct.o.Generate(context.Background(), GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: prompt, MaxTokens: 20,
		Sampling: &meshp2pb.SamplingParams{Seed: 3}, CacheNamespace: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	ct.o.Audit.Wait()
	waitReleased(t, ct.hops...)
	reps := ct.log.all()
	if len(reps) == 0 {
		t.Fatal("no audit report")
	}
	return res, reps[len(reps)-1]
}

// An epoch that reused cached positions is audited like any other: the
// audited hop signed what it adopted, kept its inputs, and the replay
// feeds them before the epoch's frames; it passes for every hop.
func TestAuditCachedEpochPasses(t *testing.T) {
	for target, name := range []string{"head", "middle", "tail"} {
		t.Run(name, func(t *testing.T) {
			ct := newCachedTurns(t)
			ct.target = target
			if _, rep := ct.gen(t, ct.turn1); rep.Outcome != AuditPassed || rep.Adopted != 0 {
				t.Fatalf("first turn: %+v", rep)
			}
			res, rep := ct.gen(t, ct.turn2)
			if want := reference(ct.turn2, 20, 3); !equal(res.Tokens, want) {
				t.Fatalf("tokens %v, want %v", res.Tokens, want)
			}
			if res.CachedTokens != 64 {
				t.Fatalf("second turn reused %d positions (%v), want 64", res.CachedTokens, res.HopCached)
			}
			if rep.Outcome != AuditPassed || rep.Windows == 0 || rep.Adopted != 64 || rep.Hop != target || !rep.Exact {
				t.Fatalf("cached epoch's audit: %+v", rep)
			}
			// After the head, the adopted rows are those the hop signed it
			// received in the first turn (its records are still held).
			if want := map[bool]int{true: 0, false: 64}[target == 0]; rep.CrossChecked != want {
				t.Fatalf("%d adopted positions cross-checked, want %d", rep.CrossChecked, want)
			}
		})
	}
}

// A hop that computes honestly until its sessions reuse cached positions
// and cheats then is convicted by the audit of such an epoch; the proof
// carries the adopted inputs and verifies on its own, and a proof whose
// adopted inputs are changed or left out convicts nobody.
func TestAuditCatchesCheatOnCachedEpoch(t *testing.T) {
	for target, name := range []string{"head", "middle", "tail"} {
		t.Run(name, func(t *testing.T) {
			ct := newCachedTurns(t)
			ct.target = target
			if _, rep := ct.gen(t, ct.turn1); rep.Outcome != AuditPassed {
				t.Fatalf("first turn: %+v", rep)
			}
			bad := ct.hops[target]
			bad.eng.mu.Lock()
			bad.eng.tamper = func(n int, out *Output) { // only sessions that adopted (the second turn)
				switch {
				case len(out.Hidden) > 0:
					out.Hidden[len(out.Hidden)-1] += 1e-3
				case out.Token != 0:
					out.Token = 3
				}
			}
			bad.eng.mu.Unlock()
			_, rep := ct.gen(t, ct.turn2)
			if rep.Outcome != AuditFailed || rep.Peer != bad.host.ID() || rep.Proof == nil || rep.Adopted != 64 {
				t.Fatalf("cheating hop's audit: %+v", rep)
			}
			b, err := proto.Marshal(rep.Proof)
			if err != nil {
				t.Fatal(err)
			}
			p := &meshp2pb.Proof{}
			if err := proto.Unmarshal(b, p); err != nil {
				t.Fatal(err)
			}
			if len(p.GetAdopted()) == 0 {
				t.Fatal("the proof carries no adopted inputs")
			}
			if v, err := Judge(context.Background(), p, fakeEngines{"fake"}); err != nil || !v.Convicted {
				t.Fatalf("proof: %+v, %v", v, err)
			}
			if _, err := CheckProof(p); err != nil {
				t.Fatalf("CheckProof: %v", err)
			}
			for what, forge := range map[string]func(p *meshp2pb.Proof){
				"left out": func(p *meshp2pb.Proof) { p.Adopted = nil },
				"changed": func(p *meshp2pb.Proof) {
					f := p.Adopted[0]
					if len(f.Header.Tokens) > 0 {
						f.Header.Tokens[0]++
					} else {
						f.Payload[0] ^= 1
					}
				},
				"cut": func(p *meshp2pb.Proof) { p.Adopted = p.Adopted[:len(p.Adopted)-1] },
			} {
				forged := proto.Clone(p).(*meshp2pb.Proof)
				forge(forged)
				if _, err := Judge(context.Background(), forged, fakeEngines{"fake"}); !errors.Is(err, ErrProof) {
					t.Fatalf("adopted inputs %s: %v", what, err)
				}
				if _, err := CheckProof(forged); !errors.Is(err, ErrProof) {
					t.Fatalf("adopted inputs %s, CheckProof: %v", what, err)
				}
			}
		})
	}
}

// A hop after the head that keeps other rows with its cache entry than
// it received (its cells computed from them would pass the replay, which
// rebuilds them from the same rows) is found by the cross-check: the rows
// it signed it adopted are not those it signed it received in the session
// that left the entry. The audit is inconclusive, not a conviction (the
// entry could be another session's: see crosscheck.go).
func TestAuditCrossCheckFindsPoisonedEntry(t *testing.T) {
	for target, name := range []string{"middle", "tail"} {
		target++
		t.Run(name, func(t *testing.T) {
			ct := newCachedTurns(t)
			ct.target = target
			ct.caches[target].mu.Lock()
			ct.caches[target].poison = true
			ct.caches[target].mu.Unlock()
			if _, rep := ct.gen(t, ct.turn1); rep.Outcome != AuditPassed {
				t.Fatalf("first turn: %+v", rep)
			}
			_, rep := ct.gen(t, ct.turn2)
			if rep.Outcome != AuditInconclusive || rep.Peer != ct.hops[target].host.ID() || rep.CrossChecked != 1 || !strings.Contains(rep.Reason, "position 0") {
				t.Fatalf("poisoned entry's audit: %+v", rep)
			}
			if ct.o.Failures.Convicted(rep.Peer) {
				t.Fatal("convicted on a cross-check")
			}
		})
	}
}

// Without the adopted inputs (the first turn kept no rows: it asked for
// no transcripts) a cached epoch's audit of a hop after the head is
// inconclusive, saying why, and convicts nobody; the head's tokens are
// always kept.
func TestAuditCachedEpochWithoutInputs(t *testing.T) {
	for target, name := range []string{"head", "middle", "tail"} {
		t.Run(name, func(t *testing.T) {
			ct := newCachedTurns(t)
			ct.target = target
			a := ct.o.Audit
			ct.o.Audit = nil // no transcripts: the hops keep no rows
			if _, err := ct.o.Generate(context.Background(), GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: ct.turn1, MaxTokens: 20,
				Sampling: &meshp2pb.SamplingParams{Seed: 3}, CacheNamespace: "alice"}); err != nil {
				t.Fatal(err)
			}
			waitReleased(t, ct.hops...)
			ct.o.Audit = a
			res, rep := ct.gen(t, ct.turn2)
			if res.CachedTokens != 64 {
				t.Fatalf("reused %d", res.CachedTokens)
			}
			want := AuditInconclusive
			if target == 0 {
				want = AuditPassed
			}
			if rep.Outcome != want || ct.o.Failures.Convicted(rep.Peer) {
				t.Fatalf("audit %+v, want %s", rep, want)
			}
			if want == AuditInconclusive && !strings.Contains(rep.Reason, "did not keep") {
				t.Fatalf("reason %q", rep.Reason)
			}
		})
	}
}

// A head that signs it reused the KV of tokens other than the prompt's
// (its cache entry says other tokens) is convicted by the origin: a signed
// contradiction, whatever its replay would give.
func TestAuditHeadAdoptedOtherTokens(t *testing.T) {
	ct := newCachedTurns(t)
	if _, rep := ct.gen(t, ct.turn1); rep.Outcome != AuditPassed {
		t.Fatalf("first turn: %+v", rep)
	}
	c := ct.caches[0]
	c.mu.Lock()
	for i := range c.entries {
		c.entries[i].toks = slices.Clone(c.entries[i].toks)
		c.entries[i].toks[5]++
	}
	c.mu.Unlock()
	_, rep := ct.gen(t, ct.turn2)
	if rep.Outcome != AuditFailed || rep.Peer != ct.hops[0].host.ID() || !strings.Contains(rep.Reason, "not the session's") {
		t.Fatalf("audit %+v", rep)
	}
}

// checkAdopted refuses adopted inputs that are not what the hop signed or
// are not plain consecutive rows from position 0.
func TestCheckAdopted(t *testing.T) {
	rows := make([]float32, 70*fakeEmbd)
	for i := range rows {
		rows[i] = float32(i)
	}
	frames := AdoptedFrames(70, nil, rows, fakeEmbd)
	if len(frames) != 3 || frames[2].GetHeader().GetNRows() != 6 || frames[2].GetHeader().GetPosStart() != 64 {
		t.Fatalf("frames %v", frames)
	}
	st := &meshp2pb.Transcript{Adopted: 70, AdoptedDigest: InputDigest(frames)}
	if err := checkAdopted(frames, st, false, fakeEmbd); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		frames []*meshp2pb.RecordedFrame
		st     *meshp2pb.Transcript
	}{
		"none signed":    {frames, &meshp2pb.Transcript{Adopted: 70}},
		"missing":        {nil, st},
		"short":          {frames[:2], st},
		"other rows":     {AdoptedFrames(70, nil, slices.Concat(rows[:1], rows[:len(rows)-1]), fakeEmbd), st},
		"none adopted":   {frames, &meshp2pb.Transcript{}},
		"out of order":   {[]*meshp2pb.RecordedFrame{frames[1], frames[0], frames[2]}, st},
		"as head tokens": {AdoptedFrames(70, make([]int32, 70), nil, 0), st},
	} {
		if err := checkAdopted(tc.frames, tc.st, false, fakeEmbd); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if AdoptedFrames(70, nil, rows[:69*fakeEmbd], fakeEmbd) != nil || AdoptedFrames(3, []int32{1}, nil, 0) != nil {
		t.Fatal("frames of inputs that do not cover the positions")
	}
}

// checkAdopted never panics on what a proof or an audited hop sends, and
// accepts only frames of exactly the signed positions and digest.
func FuzzCheckAdopted(f *testing.F) {
	rows := make([]float32, 40*fakeEmbd)
	for i := range rows {
		rows[i] = float32(i) / 7
	}
	for _, p := range []*meshp2pb.Proof{
		{Adopted: AdoptedFrames(40, nil, rows, fakeEmbd)},
		{Adopted: AdoptedFrames(33, []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33}, nil, 0)},
	} {
		b, err := proto.Marshal(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, uint32(positions(p.GetAdopted())), true, p.GetAdopted()[0].GetHeader().GetTokens() != nil)
		f.Add(b, uint32(positions(p.GetAdopted()))+1, false, false)
	}
	f.Fuzz(func(t *testing.T, raw []byte, n uint32, signDigest, head bool) {
		var p meshp2pb.Proof
		if proto.Unmarshal(raw, &p) != nil {
			return
		}
		st := &meshp2pb.Transcript{Adopted: n}
		if signDigest {
			st.AdoptedDigest = InputDigest(p.GetAdopted())
		}
		width := fakeEmbd
		if head {
			width = 0
		}
		if err := checkAdopted(p.GetAdopted(), st, head, width); err != nil {
			return
		}
		if n > 0 && (positions(p.GetAdopted()) != int(n) || !signDigest) {
			t.Fatalf("accepted %d positions of frames for %d signed (digest %v)", positions(p.GetAdopted()), n, signDigest)
		}
	})
}

// The churn soak's case: a client ran a prompt through head A, which kept
// its blocks; running it again through head B, B fails mid-generation and
// the new epoch's head is A, which adopts the earlier run's blocks of the
// prompt and the tokens generated so far. The audit of that epoch's head,
// plain and speculative (auto), passes: an honest hop is never reported.
func TestAuditFailoverOntoCachedHead(t *testing.T) {
	for _, spec := range []meshp2pb.SpecMode{meshp2pb.SpecMode_SPEC_MODE_OFF, meshp2pb.SpecMode_SPEC_MODE_AUTO} {
		t.Run(spec.String(), func(t *testing.T) {
			fake := func(c *HopConfig) { c.KernelClass = "fake" }
			a, b := startHop(t, 0, 2, fake), startHop(t, 0, 2, fake)
			mid, tail := startHop(t, 2, 4, fake), startHop(t, 4, 6, fake)
			all := []*fakeHop{a, b, mid, tail}
			for _, h := range all {
				h.withCache()
			}
			pl := &stagePlanner{[][]*fakeHop{{a, b}, {mid}, {tail}}}
			o, c := newOrigin(t, pl, all...)
			o.Chunk = 16
			l := auditing(o, c, func() int { return 0 }, func() int { return 3 })
			prompt := []int32{5, 6, 7, 8, 9}
			req := GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: prompt, MaxTokens: 70, Sampling: &meshp2pb.SamplingParams{Seed: 3},
				Speculation: &meshp2pb.Speculation{Mode: spec}}
			if _, err := o.Generate(context.Background(), req); err != nil {
				t.Fatal(err)
			}
			o.Audit.Wait()
			waitReleased(t, all...)
			pl.stages[0] = []*fakeHop{b, a}
			b.killAtStep(40, append([]*testHost{c}, hostsOf(a, mid, tail)...)...)
			res, err := o.Generate(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			o.Audit.Wait()
			if want := reference(prompt, 70, 3); !equal(res.Tokens, want) {
				t.Fatalf("tokens %v\nwant   %v", res.Tokens, want)
			}
			reps := l.all()
			rep := reps[len(reps)-1]
			if res.Reroutes != 1 || res.Route.Hops[0].Peer != a.host.ID() {
				t.Fatalf("reroutes %d, head %s: want one re-route onto the first head", res.Reroutes, res.Route.Hops[0].Peer)
			}
			t.Logf("audit of the new epoch's head: %s, adopted %d, windows %d, %s", rep.Outcome, rep.Adopted, rep.Windows, rep.Reason)
			if rep.Outcome != AuditPassed || rep.Epoch != 2 || rep.Hop != 0 {
				t.Fatalf("audit %+v", rep)
			}
		})
	}
}

// A failover whose new head holds nothing while the middle and tail
// survive with the session's cells: the head starts at 0 and the hops
// after it later (hop_starts), so it computes rows it does not send
// (forwarded). The audit of that head replays them and cuts them from its
// digest the same way: it passes. (Before the replay cut them, this
// convicted an honest head: the churn soak's false accusation.)
func TestAuditHeadBelowNextStart(t *testing.T) {
	fake := func(c *HopConfig) { c.KernelClass = "fake" }
	a, b := startHop(t, 0, 2, fake), startHop(t, 0, 2, fake)
	mid, tail := startHop(t, 2, 4, fake), startHop(t, 4, 6, fake)
	all := []*fakeHop{a, b, mid, tail}
	for _, h := range all {
		h.withCache()
	}
	o, c := newOrigin(t, &stagePlanner{[][]*fakeHop{{a, b}, {mid}, {tail}}}, all...)
	o.Chunk = 16
	l := auditing(o, c, func() int { return 0 }, func() int { return 3 })
	prompt := make([]int32, 70)
	for i := range prompt {
		prompt[i] = int32(i%90 + 1)
	}
	a.killAtStep(5, append([]*testHost{c}, hostsOf(b, mid, tail)...)...)
	res, err := o.Generate(context.Background(), GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: prompt, MaxTokens: 20, Sampling: &meshp2pb.SamplingParams{Seed: 3}})
	if err != nil {
		t.Fatal(err)
	}
	o.Audit.Wait()
	if want := reference(prompt, 20, 3); !equal(res.Tokens, want) {
		t.Fatalf("tokens %v\nwant   %v", res.Tokens, want)
	}
	if res.Reroutes != 1 || len(res.HopCached) != 3 || res.HopCached[0] != 0 || res.HopCached[1] == 0 {
		t.Fatalf("reroutes %d, hop_cached %v: want a new head holding nothing before hops that hold the prompt", res.Reroutes, res.HopCached)
	}
	reps := l.all()
	if rep := reps[len(reps)-1]; rep.Outcome != AuditPassed || rep.Epoch != 2 || rep.Hop != 0 || rep.Windows == 0 {
		t.Fatalf("audit of the new head: %+v", rep)
	}
}
