package session

import (
	"context"
	"crypto/sha256"
	mrand "math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// relayRun is one audited generation for the relay check (relaycheck.go).
type relayRun struct {
	name   string
	ranges [][2]int
	spec   bool
	stopAt int // the origin stops after this many tokens (OnToken; 0: never)
	eosAt  int // the tail's eosAt-th forward samples the end of generation (0: never)
	failAt int // the middle hop dies at its failAt-th forward: a re-route (0: never)
	target int // the hop the audit draws
	// tamper, if set, is the head's change to the n-th token it passes
	// to the origin (from 1): a hostile head.
	tamper func(n int, tf *meshp2pb.TokenFrame)
}

const relayMaxTokens = 60

// run generates once with an audit of every generation and returns the
// result, the audit reports and the hops (the route's, in order).
func (rc relayRun) run(t *testing.T) (*Result, []AuditReport, []*fakeHop) {
	t.Helper()
	var route []*fakeHop
	var stages [][]*fakeHop
	var all []*fakeHop
	for i, r := range rc.ranges {
		h := startHop(t, r[0], r[1], func(c *HopConfig) { c.KernelClass = "fake" })
		route, all = append(route, h), append(all, h)
		stage := []*fakeHop{h}
		if rc.failAt > 0 && i == 1 {
			spare := startHop(t, r[0], r[1], func(c *HopConfig) { c.KernelClass = "fake" })
			all, stage = append(all, spare), append(stage, spare)
		}
		stages = append(stages, stage)
	}
	head, tail := route[0], route[len(route)-1]
	if rc.tamper != nil {
		var n atomic.Int64
		head.svc.relayTamper = func(tf *meshp2pb.TokenFrame) { rc.tamper(int(n.Add(1)), tf) }
	}
	if rc.eosAt > 0 {
		tail.eng.tamper = func(forwards int, out *Output) {
			if forwards != rc.eosAt {
				return
			}
			if len(out.Tokens) > 0 {
				out.Tokens[len(out.Tokens)-1] = 0
			}
			out.Token = 0
		}
	}
	o, c := newOrigin(t, stagePlanner{stages}, all...)
	if rc.failAt > 0 {
		route[1].killAtForward(rc.failAt, append([]*testHost{c}, hostsOf(all...)...)...)
	}
	l := auditing(o, c, func() int { return rc.target }, func() int { return len(rc.ranges) })
	prompt := []int32{1, 2, 3, 4, 5, 1, 2, 3}
	req := GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: prompt, MaxTokens: relayMaxTokens, Sampling: &meshp2pb.SamplingParams{Seed: cyclicSeed | 5}}
	if rc.spec {
		req.Speculation = &meshp2pb.Speculation{Mode: meshp2pb.SpecMode_SPEC_MODE_NGRAM, MaxDraft: 4, MaxWindows: 2}
	}
	if rc.stopAt > 0 {
		var n int
		req.OnToken = func(int32) bool { n++; return n == rc.stopAt }
	}
	res, err := o.Generate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	o.Audit.Wait()
	for _, h := range all {
		if o.Failures.Convicted(h.host.ID()) && (rc.tamper == nil || h != head) {
			t.Fatalf("%s (hop %d-%d) convicted", h.host.ID(), h.eng.info.Start, h.eng.info.End)
		}
	}
	if rc.tamper != nil && !o.Failures.Convicted(head.host.ID()) {
		t.Fatalf("the hostile head is not convicted: %+v", l.all())
	}
	return res, l.all(), route
}

// An honest head passes the relay check on every audited generation:
// plain and speculative, two and three hops, stopped by max_tokens, by
// the origin, by the tail's end of generation, and after a re-route; a
// one-hop route has no relay to check. Every token of the final epoch is
// checked (Relayed), so the check is not vacuous.
func TestRelayCheckHonestHeadPasses(t *testing.T) {
	three, two := [][2]int{{0, 2}, {2, 4}, {4, 6}}, [][2]int{{0, 3}, {3, 6}}
	var cases []relayRun
	for _, spec := range []bool{false, true} {
		suffix := "/plain"
		if spec {
			suffix = "/spec"
		}
		cases = append(cases,
			relayRun{name: "3hops" + suffix, ranges: three, spec: spec},
			relayRun{name: "2hops" + suffix, ranges: two, spec: spec, target: 1},
			relayRun{name: "1hop" + suffix, ranges: [][2]int{{0, 6}}, spec: spec},
			relayRun{name: "origin_stops" + suffix, ranges: three, spec: spec, stopAt: 23},
			relayRun{name: "tail_ends" + suffix, ranges: three, spec: spec, eosAt: 9},
			relayRun{name: "rerouted" + suffix, ranges: three, spec: spec, failAt: 12},
		)
	}
	for _, rc := range cases {
		t.Run(rc.name, func(t *testing.T) {
			res, reps, _ := rc.run(t)
			switch {
			case rc.stopAt > 0 && (res.Stop != "stop" || len(res.Tokens) != rc.stopAt):
				t.Fatalf("stop %q after %d tokens, want the origin's after %d", res.Stop, len(res.Tokens), rc.stopAt)
			case rc.eosAt > 0 && (res.Stop != "eos" || res.Tokens[len(res.Tokens)-1] != 0):
				t.Fatalf("stop %q, tokens %v: want the tail's end of generation", res.Stop, res.Tokens)
			case rc.failAt > 0 && res.Reroutes != 1:
				t.Fatalf("%d reroutes, want 1 (%v)", res.Reroutes, res.Failures)
			case rc.stopAt == 0 && rc.eosAt == 0 && !equal(res.Tokens, reference([]int32{1, 2, 3, 4, 5, 1, 2, 3}, relayMaxTokens, cyclicSeed|5)):
				t.Fatalf("tokens %v are not the reference's", res.Tokens)
			}
			want := len(res.Tokens) - len(res.lastOpen.GetGenerated())
			if len(rc.ranges) == 1 {
				want = 0
			}
			if len(reps) != 1 || reps[0].Outcome != AuditPassed || reps[0].Hop != rc.target || reps[0].Relayed != want || want == 0 && len(rc.ranges) > 1 {
				t.Fatalf("reports %+v, want one passed audit of hop %d with %d tokens relayed", reps, rc.target, want)
			}
			t.Logf("%d tokens (%d in the final epoch) checked against the tail's", len(res.Tokens), reps[0].Relayed)
		})
	}
}

// A head that changes what it passes to the origin (a token, the end of
// generation, in either direction) is convicted by the origin's audit,
// whichever hop the audit drew, with a reason that names the relay and
// the position.
func TestRelayCheckConvictsHead(t *testing.T) {
	three, two := [][2]int{{0, 2}, {2, 4}, {4, 6}}, [][2]int{{0, 3}, {3, 6}}
	change := func(at int) func(int, *meshp2pb.TokenFrame) {
		return func(n int, tf *meshp2pb.TokenFrame) {
			if n == at {
				tf.Token = tf.GetToken()%fakeVocab + 1
			}
		}
	}
	endAt := func(at int) func(int, *meshp2pb.TokenFrame) {
		return func(n int, tf *meshp2pb.TokenFrame) {
			if n == at {
				tf.Eos = true
			}
		}
	}
	hideEnd := func(_ int, tf *meshp2pb.TokenFrame) { tf.Eos = false }
	for _, tc := range []struct {
		relayRun
		want string
	}{
		{relayRun{name: "changes_a_token/plain", ranges: three, target: 1, tamper: change(17)}, "the tail signed it sent"},
		{relayRun{name: "changes_a_token/spec", ranges: three, spec: true, target: 2, tamper: change(17)}, "the tail signed it sent"},
		{relayRun{name: "changes_a_token/2hops", ranges: two, target: 1, tamper: change(40)}, "the tail signed it sent"},
		{relayRun{name: "changes_the_first_token/spec", ranges: two, spec: true, tamper: change(1)}, "the tail signed it sent"},
		{relayRun{name: "ends_the_generation/plain", ranges: three, target: 2, tamper: endAt(11)}, "the head ended the generation"},
		{relayRun{name: "ends_the_generation/spec", ranges: three, spec: true, target: 1, tamper: endAt(11)}, "the head ended the generation"},
		{relayRun{name: "hides_the_end/plain", ranges: three, target: 1, eosAt: 9, tamper: hideEnd}, "the tail ended the generation"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, reps, route := tc.run(t)
			head := route[0].host.ID()
			if len(reps) != 1 || reps[0].Outcome != AuditFailed || reps[0].Peer != head || reps[0].Hop != 0 || reps[0].Proof != nil {
				t.Fatalf("reports %+v, want the head convicted by the relay check", reps)
			}
			if r := reps[0].Reason; !strings.HasPrefix(r, "relay: ") || !strings.Contains(r, "position") || !strings.Contains(r, tc.want) {
				t.Fatalf("reason %q does not name the relay, the position and %q", r, tc.want)
			}
			t.Logf("%d tokens, stop %q: %s", len(res.Tokens), res.Stop, reps[0].Reason)
		})
	}
}

// ringTok and ringWin are the tail's messages as its records keep them.
func ringTok(tok int32, pos uint32, eos bool) *meshp2pb.StreamMessage {
	return &meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Token{Token: &meshp2pb.TokenFrame{Token: tok, Position: pos, Eos: eos}}}
}

func ringWin(gen uint64, pos uint32, eos bool, toks ...int32) *meshp2pb.StreamMessage {
	return &meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_WindowResult{WindowResult: &meshp2pb.WindowResult{SpecGen: gen, Position: pos, Tokens: toks, Eos: eos}}}
}

// judgeRelay convicts exactly when no honest head's history gives the
// origin's tokens: a hostile tail cannot frame an honest head with
// results an honest head drops (an older generation's), and records that
// do not reach the origin's last token are inconclusive unless they are
// all the tail sent.
func TestJudgeRelay(t *testing.T) {
	const a, b, c, d, e, f, x, y = 11, 12, 13, 14, 15, 16, 21, 22
	msgs := func(m ...*meshp2pb.StreamMessage) []*meshp2pb.StreamMessage { return m }
	// A chain of the prompt's token (position 4), a result accepted whole,
	// a correction, and the next generation's result.
	chain := msgs(ringTok(a, 4, false), ringWin(0, 5, false, b, c), ringWin(0, 7, false, d), ringWin(1, 8, false, e, f))
	// The same with a hostile tail's result of the rejected generation
	// after the correction at position 7 (an honest head drops it).
	stale := msgs(ringTok(a, 4, false), ringWin(0, 5, false, b, c), ringWin(0, 7, false, x, y), ringWin(1, 7, false, d, e))
	long := msgs(ringTok(a, 4, false))
	var longGot []int32
	for i := range 5000 {
		long = append(long, ringWin(0, uint32(5+i), false, int32(i%7+1)))
		longGot = append(longGot, int32(i%7+1))
	}
	plain := msgs(ringTok(a, 4, false), ringTok(b, 5, false), ringTok(c, 6, false), ringTok(d, 7, false))
	for _, tc := range []struct {
		name      string
		sent      []*meshp2pb.StreamMessage
		complete  bool
		spec      bool
		got       []int32
		eos       bool
		explained bool
		convicted string // a part of the reason ("": not convicted)
		checked   int
	}{
		{name: "plain/all", sent: plain, got: []int32{a, b, c, d}, explained: true, checked: 4},
		{name: "plain/origin stopped", sent: plain, got: []int32{a, b}, explained: true, checked: 2},
		{name: "plain/changed", sent: plain, got: []int32{a, x, c}, convicted: "passed token 21 at position 5, the tail signed it sent 12", checked: 1},
		{name: "plain/end forged", sent: plain, got: []int32{a, b}, eos: true, convicted: "the head ended the generation at position 5", checked: 1},
		{name: "plain/end hidden", sent: msgs(ringTok(a, 4, false), ringTok(b, 5, true), ringTok(c, 6, false)), got: []int32{a, b, c}, convicted: "the tail ended the generation at position 5", checked: 1},
		{name: "plain/end honoured", sent: msgs(ringTok(a, 4, false), ringTok(b, 5, true)), got: []int32{a, b}, eos: true, explained: true, checked: 2},
		{name: "plain/tokens never sent", sent: plain[:2], complete: true, got: []int32{a, b, c}, convicted: "1 tokens from position 6 on that the tail never sent", checked: 2},
		{name: "plain/records end", sent: plain[:2], got: []int32{a, b, c}, checked: 2},
		{name: "plain/no records", got: []int32{a}},
		{name: "plain/window result", sent: msgs(ringTok(a, 4, false), ringWin(0, 5, false, b)), got: []int32{a, b}, checked: 1},
		{name: "spec/chain", sent: chain, spec: true, got: []int32{a, b, c, d, e, f}, explained: true, checked: 6},
		{name: "spec/origin stopped inside a result", sent: chain, spec: true, got: []int32{a, b, c, d, e}, explained: true, checked: 5},
		{name: "spec/changed", sent: chain, spec: true, got: []int32{a, b, x, d, e, f}, convicted: "passed token 21 at position 6, the tail signed it sent 13", checked: 2},
		{name: "spec/first token changed", sent: chain, spec: true, got: []int32{x, b, c}, convicted: "passed token 21 at position 4, the tail signed it sent 11"},
		{name: "spec/end forged", sent: chain, spec: true, got: []int32{a, b, c}, eos: true, convicted: "the head ended the generation at position 6", checked: 2},
		{name: "spec/end forged inside a result", sent: chain, spec: true, got: []int32{a, b}, eos: true, convicted: "the head ended the generation at position 5", checked: 1},
		{name: "spec/end honoured", sent: msgs(ringTok(a, 4, false), ringWin(0, 5, true, b, c)), spec: true, got: []int32{a, b, c}, eos: true, explained: true, checked: 3},
		{name: "spec/end hidden", sent: msgs(ringTok(a, 4, false), ringWin(0, 5, true, b, c), ringWin(0, 7, false, d)), spec: true, got: []int32{a, b, c, d}, convicted: "the tail ended the generation at position 6", checked: 2},
		{name: "spec/stale result dropped", sent: stale, spec: true, got: []int32{a, b, c, d, e}, explained: true, checked: 5},
		// Without the proposals a correction and a result accepted whole
		// look alike: passing the later result on is a history too.
		{name: "spec/stale result or not", sent: stale, spec: true, got: []int32{a, b, c, x, y}, explained: true, checked: 5},
		{name: "spec/stale result changed", sent: stale, spec: true, got: []int32{a, b, c, d, x}, convicted: "passed token 21 at position 8, the tail signed it sent 15", checked: 4},
		{name: "spec/a later generation", sent: msgs(ringTok(a, 4, false), ringWin(2, 5, false, b)), spec: true, got: []int32{a, b}, convicted: "generation 2 comes after generation 0", checked: 1},
		{name: "spec/out of position", sent: msgs(ringTok(a, 4, false), ringWin(0, 6, false, b)), spec: true, got: []int32{a, b}, convicted: "does not continue the 1 tokens", checked: 1},
		{name: "spec/tokens never sent", sent: chain[:2], complete: true, spec: true, got: []int32{a, b, c, d}, convicted: "1 tokens from position 7 on that the tail never sent", checked: 3},
		{name: "spec/records end", sent: chain[:2], spec: true, got: []int32{a, b, c, d}, checked: 3},
		{name: "spec/plain steps", sent: msgs(ringTok(a, 4, false), ringTok(b, 5, false), ringWin(0, 6, false, c, d), ringTok(e, 8, false)), spec: true,
			got: []int32{a, b, c, d, e}, explained: true, checked: 5},
		{name: "spec/plain step changed", sent: msgs(ringTok(a, 4, false), ringTok(b, 5, false)), spec: true, got: []int32{a, x}, convicted: "passed token 21 at position 5, the tail signed it sent 12", checked: 1},
		{name: "spec/plain step out of position", sent: msgs(ringTok(a, 4, false), ringTok(b, 6, false)), spec: true, got: []int32{a, b}, convicted: "token at position 6 does not continue the 1 tokens", checked: 1},
		{name: "spec/window result first", sent: msgs(ringWin(0, 5, false, a)), spec: true, got: []int32{a}},
		{name: "spec/long chain", sent: long, spec: true, got: append([]int32{a}, longGot...), explained: true, checked: 5001},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := judgeRelay(tc.sent, tc.complete, relayed{tokens: tc.got, at: 4, eos: tc.eos}, tc.spec)
			switch {
			case v.explained != tc.explained || v.convicted != (tc.convicted != "") || v.checked != tc.checked:
				t.Fatalf("%+v, want explained %v, convicted %q, %d checked", v, tc.explained, tc.convicted, tc.checked)
			case tc.convicted != "" && !strings.Contains(v.reason, tc.convicted):
				t.Fatalf("reason %q, want %q in it", v.reason, tc.convicted)
			case !tc.explained && tc.convicted == "" && v.checked == len(tc.got):
				t.Fatalf("%+v: inconclusive, yet every token checked", v)
			}
		})
	}
}

// verifyRing keeps the tail's records that its statements sign, window
// by window, and says whether they are all it sent.
func TestVerifyRing(t *testing.T) {
	recs := []*meshp2pb.StreamMessage{ringTok(1, 4, false), ringWin(0, 5, false, 2, 3), ringWin(0, 7, false, 4), ringWin(1, 8, true, 5)}
	digest := func(m ...*meshp2pb.StreamMessage) []byte {
		h := sha256.New()
		for _, x := range m {
			digestRing(h, x)
		}
		return h.Sum(nil)
	}
	// Window 0: three input frames (a prefill chunk sends nothing), two
	// messages; window 1: a skipped window and two messages; window 2:
	// final, empty.
	sts := []*meshp2pb.Transcript{
		{Frames: 3, OutDigest: digest(recs[0], recs[1])},
		{Frames: 3, OutDigest: digest(recs[2], recs[3])},
		{Frames: 0, OutDigest: digest(), Final: true},
	}
	changed := append([]*meshp2pb.StreamMessage{}, recs...)
	changed[2] = ringWin(0, 7, false, 9)
	for _, tc := range []struct {
		name      string
		sts       []*meshp2pb.Transcript
		recs      []*meshp2pb.StreamMessage
		truncated bool
		sent      int
		complete  bool
		why       string
	}{
		{"all", sts, recs, false, 4, true, ""},
		{"no final statement", sts[:2], recs, false, 4, false, ""},
		{"a record changed", sts, changed, false, 2, false, "window 1 on are not what it signed"},
		{"records cut by the bound", sts, recs[:3], true, 2, false, "up to its bound"},
		{"more records than signed", sts[:1], recs, false, 2, false, ""},
		{"no statements", nil, recs, false, 0, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sent, complete, why := verifyRing(tc.sts, tc.recs, tc.truncated)
			if len(sent) != tc.sent || complete != tc.complete || (tc.why == "") != (why == "") || !strings.Contains(why, tc.why) {
				t.Fatalf("%d records, complete %v, %q; want %d, %v, %q", len(sent), complete, why, tc.sent, tc.complete, tc.why)
			}
		})
	}
}

// randProposer proposes random tokens of a small alphabet (accepted as
// often as the tail model below decides).
type randProposer struct{ rng *mrand.Rand }

func (p randProposer) Append(...int32) {}
func (p randProposer) Propose(k int) ([]int32, int) {
	out := make([]int32, k)
	for i := range out {
		out[i] = p.rng.Int32N(5) + 1
	}
	return out, 3
}

// relayTail answers verification windows like the tail (windowAnswer, the
// rejected generation's windows skipped), its targets drawn: a proposal
// accepted 80% of the time, an end of generation now and then.
type relayTail struct {
	rng      *mrand.Rand
	gen      uint64
	rejected bool
}

func (ts *relayTail) answer(a *meshp2pb.ActivationHeader) *meshp2pb.WindowResult {
	if a.GetSpecGen() > ts.gen {
		ts.gen, ts.rejected = a.GetSpecGen(), false
	}
	if ts.rejected {
		return nil
	}
	draft := append(slices.Clone(a.GetTokens()[1:]), a.GetLookahead()...)
	var toks []int32
	for i := range a.GetTokens() {
		t := ts.rng.Int32N(5) + 1
		switch r := ts.rng.Float64(); {
		case r < 0.015:
			t = 0
		case i < len(draft) && r < 0.8:
			t = draft[i]
		}
		toks = append(toks, t)
		if i >= len(draft) || t != draft[i] {
			break
		}
	}
	wr, rejected := windowAnswer(a, toks, func(t int32) bool { return t == 0 })
	ts.rejected = rejected
	return wr
}

// step answers a plain step like the tail (tokenFrame), its token drawn
// (an end of generation now and then).
func (ts *relayTail) step(a *meshp2pb.ActivationHeader) *meshp2pb.StreamMessage {
	t := ts.rng.Int32N(5) + 1
	if ts.rng.Float64() < 0.015 {
		t = 0
	}
	return &meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Token{Token: tokenFrame(a, t, t == 0)}}
}

// hostile is a message a hostile tail slips in (kind % 4): a result of an
// older generation, one of a random generation and place, its last result
// again, or a token frame at a random position.
func (ts *relayTail) hostile(kind uint8, last *meshp2pb.WindowResult) *meshp2pb.StreamMessage {
	toks := []int32{ts.rng.Int32N(5) + 1, ts.rng.Int32N(5) + 1}[:1+ts.rng.IntN(2)]
	switch kind % 4 {
	case 0:
		return ringWin(ts.gen-min(ts.gen, 1), uint32(8+ts.rng.IntN(40)), false, toks...)
	case 1:
		return ringWin(uint64(ts.rng.IntN(int(ts.gen)+3)), uint32(8+ts.rng.IntN(40)), ts.rng.IntN(8) == 0, toks...)
	case 2:
		if last != nil {
			return &meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_WindowResult{WindowResult: last}}
		}
	}
	return ringTok(toks[0], uint32(8+ts.rng.IntN(40)), false)
}

// FuzzJudgeRelayHonestHead: whatever the tail sends, the tokens the
// session's own head bookkeeping (specHead) passes to the origin are never
// convicted by judgeRelay, with or without the tail's whole record; and
// with an honest tail, one token changed on the way is always convicted.
// seed drives the tail's targets, the origin's stop and (hostile != 0,
// one message in 8) what a hostile tail slips in.
func FuzzJudgeRelayHonestHead(f *testing.F) {
	for i := range 120 {
		f.Add(uint64(i), uint8(i%5))
	}
	f.Fuzz(func(t *testing.T, seed uint64, hostile uint8) {
		rng := mrand.New(mrand.NewPCG(seed, 37))
		open := &meshp2pb.SessionOpen{NCtxNeeded: 400, Speculation: &meshp2pb.Speculation{Mode: meshp2pb.SpecMode_SPEC_MODE_NGRAM, MaxDraft: 4, MaxWindows: 3}}
		sp := newSpecHead(open, false, func(meshp2pb.SpecMode, int) (Proposer, string) { return randProposer{rng}, "rand" }, nil)
		const p0, maxTokens = 8, 80
		stopAt := 1 + rng.IntN(maxTokens)
		var got []int32
		var eos, slipped, failed bool
		relay := func(tok int32, end bool) bool {
			got, eos = append(got, tok), end
			return end || len(got) >= maxTokens || len(got) == stopAt
		}
		sp.history([]int32{1, 2, 3, 4, 5, 1, 2, 3})
		first := rng.Int32N(5) + 1
		sent := []*meshp2pb.StreamMessage{ringTok(first, p0, false)}
		done := relay(first, false)
		sp.begin(first, p0, 0)
		ts := &relayTail{rng: rng}
		var queue []*meshp2pb.ActivationHeader
		var last *meshp2pb.WindowResult
		for !done && !failed {
			queue = append(queue, sp.windows(make([]byte, 16), 1, int(open.GetNCtxNeeded()), maxTokens-len(got))...)
			var m *meshp2pb.StreamMessage
			switch {
			case hostile != 0 && rng.IntN(8) == 0:
				m, slipped = ts.hostile(hostile+uint8(rng.IntN(4)), last), true
			case len(queue) == 0:
				done = true // stalled: the KV cells are spent
				continue
			default:
				a := queue[0]
				queue = queue[1:]
				if !a.GetVerify() { // a plain step (K = 0)
					m = ts.step(a)
					break
				}
				if last = ts.answer(a); last == nil {
					continue // a window of the rejected generation
				}
				m = &meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_WindowResult{WindowResult: last}}
			}
			sent = append(sent, m)
			if tf := m.GetToken(); tf != nil {
				// A plain step's answer: passed on; any other token
				// frame fails the session.
				res, _, err := sp.stepped(tf)
				if failed = err != nil; failed || res.toks == nil {
					continue
				}
				if done = relay(tf.GetToken(), tf.GetEos()); done {
					sp.finish()
				}
				continue
			}
			wr := m.GetWindowResult()
			res, err := sp.result(wr)
			if err != nil {
				failed = true // the head fails the session: nothing more reaches the origin
				continue
			}
			for i, tok := range res.toks {
				if done = relay(tok, wr.GetEos() && i == len(res.toks)-1); done {
					sp.finish()
					break
				}
			}
		}
		for _, complete := range []bool{true, false} {
			v := judgeRelay(sent, complete, relayed{tokens: got, at: p0, eos: eos}, true)
			if v.convicted || (complete && (!v.explained || v.checked != len(got))) {
				t.Fatalf("an honest head's %d tokens (stop at %d, failed %v) against %d tail messages (complete %v): %+v", len(got), stopAt, failed, len(sent), complete, v)
			}
		}
		if slipped {
			return // a slipped-in result may explain a changed token too
		}
		changed := slices.Clone(got)
		j := rng.IntN(len(changed))
		changed[j] = changed[j]%5 + 1
		if v := judgeRelay(sent, true, relayed{tokens: changed, at: p0, eos: eos}, true); !v.convicted || !strings.Contains(v.reason, "position") {
			t.Fatalf("token %d of %d changed: %+v", j, len(got), v)
		}
	})
}
