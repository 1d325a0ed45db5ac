package session

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// TestSpeculationMatchesPlain: with speculation on, every route shape,
// proposal bound and window count gives the tokens plain decoding gives
// (the fake tail checks every row's layers and position, so a row decoded
// at the wrong place, or a rejected row left in a hop's cache, fails the
// frame); on copyable output proposals are made and accepted.
func TestSpeculationMatchesPlain(t *testing.T) {
	routes := [][][2]int{{{0, 6}}, {{0, 3}, {3, 6}}, {{0, 2}, {2, 4}, {4, 6}}}
	for _, tc := range []struct {
		name   string
		seed   uint64
		mode   meshp2pb.SpecMode
		k, w   uint32
		copies bool // the output repeats: proposals must be accepted
	}{
		{"novel_auto", 7, meshp2pb.SpecMode_SPEC_MODE_AUTO, 0, 0, false},
		{"novel_ngram", 7, meshp2pb.SpecMode_SPEC_MODE_NGRAM, 4, 2, false},
		{"cycle5_ngram_k4_w1", cyclicSeed | 5, meshp2pb.SpecMode_SPEC_MODE_NGRAM, 4, 1, true},
		{"cycle9_ngram_k8_w4", cyclicSeed | 9, meshp2pb.SpecMode_SPEC_MODE_NGRAM, 8, 4, true},
		{"cycle7_ngram_k2_w3", cyclicSeed | 7, meshp2pb.SpecMode_SPEC_MODE_NGRAM, 2, 3, true},
		{"cycle6_auto", cyclicSeed | 6, meshp2pb.SpecMode_SPEC_MODE_AUTO, 0, 0, true},
		{"cycle11_auto_k16", cyclicSeed | 11, meshp2pb.SpecMode_SPEC_MODE_AUTO, 16, 4, true},
	} {
		for _, ranges := range routes {
			t.Run(tc.name+"/"+itoa(len(ranges))+"hops", func(t *testing.T) {
				var hops []*fakeHop
				var stages [][]*fakeHop
				for _, r := range ranges {
					h := startHop(t, r[0], r[1], nil)
					if tc.mode == meshp2pb.SpecMode_SPEC_MODE_AUTO {
						// Rows batch almost free and a step costs more
						// than the scheduler's hiccups: auto pays.
						h.eng.callDelay = 2 * time.Millisecond
					}
					hops = append(hops, h)
					stages = append(stages, []*fakeHop{h})
				}
				o, _ := newOrigin(t, stagePlanner{stages}, hops...)
				prompt := []int32{1, 2, 3, 4, 5, 1, 2, 3}
				const n = 90
				res, err := o.Generate(context.Background(), GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: prompt, MaxTokens: n,
					Sampling: &meshp2pb.SamplingParams{Seed: tc.seed}, Speculation: &meshp2pb.Speculation{Mode: tc.mode, MaxDraft: tc.k, MaxWindows: tc.w}})
				if err != nil {
					t.Fatal(err)
				}
				if want := reference(prompt, n, tc.seed); !equal(res.Tokens, want) {
					t.Fatalf("tokens %v, want %v", res.Tokens, want)
				}
				sp := res.Spec
				if sp.Proposer == "" || sp.Accepted > sp.Proposed {
					t.Fatalf("spec stats %+v", sp)
				}
				if tc.copies && sp.Accepted < n/3 {
					t.Fatalf("copyable output: only %d of %d proposals accepted in %d windows", sp.Accepted, sp.Proposed, sp.Windows)
				}
				if tc.k != 0 && sp.K > int(tc.k) || tc.w != 0 && sp.W > int(tc.w) {
					t.Fatalf("K %d W %d over the bounds %d %d", sp.K, sp.W, tc.k, tc.w)
				}
				t.Logf("windows %d proposed %d accepted %d (K %d W %d)", sp.Windows, sp.Proposed, sp.Accepted, sp.K, sp.W)
				waitReleased(t, hops...)
			})
		}
	}
}

// TestSpeculationOffSendsPlainSteps: where the controller proposes
// nothing (K = 0: output nothing repeats, or rows as dear as a step), the
// head sends plain decode steps, the frames a session without speculation
// sends, not one-row verification windows; the tokens stay plain
// decoding's. Before, every token went as a window.
func TestSpeculationOffSendsPlainSteps(t *testing.T) {
	for _, tc := range []struct {
		name  string
		seed  uint64
		row   time.Duration // each Forward's cost per row and layer
		call  time.Duration // each Forward's fixed cost
		hops  [][2]int
		probe bool // windows may go (a probe: acceptance would pay at free rows)
	}{
		{"novel, rows cheap, 2 hops", 7, 0, 2 * time.Millisecond, [][2]int{{0, 3}, {3, 6}}, false},
		{"novel, rows cheap, 1 hop", 7, 0, 2 * time.Millisecond, [][2]int{{0, 6}}, false},
		{"copyable, rows dear, 2 hops", cyclicSeed | 5, 2 * time.Millisecond, 0, [][2]int{{0, 3}, {3, 6}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var hops []*fakeHop
			var stages [][]*fakeHop
			for _, r := range tc.hops {
				h := startHop(t, r[0], r[1], nil)
				h.eng.delay, h.eng.callDelay = tc.row, tc.call
				hops = append(hops, h)
				stages = append(stages, []*fakeHop{h})
			}
			o, _ := newOrigin(t, stagePlanner{stages}, hops...)
			prompt := []int32{1, 2, 3, 4, 5, 1, 2, 3}
			const n = 48
			res, err := o.Generate(context.Background(), GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: prompt, MaxTokens: n,
				Sampling: &meshp2pb.SamplingParams{Seed: tc.seed}, Speculation: &meshp2pb.Speculation{Mode: meshp2pb.SpecMode_SPEC_MODE_AUTO}})
			if err != nil {
				t.Fatal(err)
			}
			if want := reference(prompt, n, tc.seed); !equal(res.Tokens, want) {
				t.Fatalf("tokens %v, want %v", res.Tokens, want)
			}
			tail := hops[len(hops)-1].eng
			tail.mu.Lock()
			plain, verified := tail.plain, tail.verified
			tail.mu.Unlock()
			t.Logf("plain steps %d, windows %d (%+v)", plain, verified, res.Spec)
			// The first token is the prefill's; every later one came by a
			// plain step, bar the few a probe's window committed.
			maxWindows := 0
			if tc.probe {
				maxWindows = n / 8
			}
			if verified > maxWindows || plain+2*verified < n-1 || verified != res.Spec.Windows || res.Spec.Proposer != "ngram" {
				t.Fatalf("the tail verified %d windows (at most %d), sampled %d plain steps, of %d tokens; spec %+v", verified, maxWindows, plain, n, res.Spec)
			}
			waitReleased(t, hops...)
		})
	}
}

// TestSpeculationFailoverMidWindow kills the middle hop while windows are
// in flight: the origin re-routes and the tokens are still plain
// decoding's.
func TestSpeculationFailoverMidWindow(t *testing.T) {
	for _, at := range []int{4, 9, 15} {
		t.Run(itoa(at), func(t *testing.T) {
			head, mid, spare, tail := startHop(t, 0, 2, nil), startHop(t, 2, 4, nil), startHop(t, 2, 4, nil), startHop(t, 4, 6, nil)
			o, c := newOrigin(t, stagePlanner{[][]*fakeHop{{head}, {mid, spare}, {tail}}}, head, mid, spare, tail)
			mid.killAtForward(at, append([]*testHost{c}, hostsOf(head, spare, tail)...)...)
			prompt := []int32{1, 2, 3, 4, 5, 6, 1, 2, 3}
			seed := uint64(cyclicSeed | 6)
			const n = 80
			res, err := o.Generate(context.Background(), GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: prompt, MaxTokens: n,
				Sampling: &meshp2pb.SamplingParams{Seed: seed}, Speculation: &meshp2pb.Speculation{Mode: meshp2pb.SpecMode_SPEC_MODE_NGRAM, MaxDraft: 4, MaxWindows: 3}})
			if err != nil {
				t.Fatal(err)
			}
			if want := reference(prompt, n, seed); !equal(res.Tokens, want) {
				t.Fatalf("tokens %v, want %v", res.Tokens, want)
			}
			if res.Reroutes != 1 {
				t.Fatalf("%d reroutes, want 1 (%v)", res.Reroutes, res.Failures)
			}
			if res.Spec.Accepted == 0 {
				t.Fatalf("spec stats %+v", res.Spec)
			}
		})
	}
}

// Hostile windows from the previous hop get a clear refusal that blames
// it, like any bad frame: a window in a session that did not negotiate
// speculation, one over the row cap, rows without their tokens, two
// lookaheads, speculation fields on a plain frame, and a generation that
// goes back. An open asking for more than the caps is refused.
func TestBadWindowsBlameTheSender(t *testing.T) {
	tail := startHop(t, 2, 6, nil)
	c := newTestHost(t)
	connectAll(c, tail.host)
	acceptRing(c)
	spec := &meshp2pb.Speculation{Mode: meshp2pb.SpecMode_SPEC_MODE_AUTO}
	// window is a verification window of n rows at pos carrying the
	// hidden rows a head [0,2) would send.
	window := func(sid []byte, pos, n int, gen uint64) (*meshp2pb.ActivationHeader, []byte) {
		var hidden []float32
		var toks []int32
		for i := range n {
			hidden = append(hidden, 5, float32(pos+i), 2, 0)
			toks = append(toks, 5)
		}
		return &meshp2pb.ActivationHeader{SessionId: sid, Epoch: 1, PosStart: uint32(pos), NRows: uint32(n), LastChunk: true, Verify: true, SpecGen: gen, Tokens: toks,
			Tensors: []*meshp2pb.TensorInfo{{Name: BundleTensor, Dtype: meshp2pb.DType_DTYPE_F32, Shape: []int64{int64(n), fakeEmbd}}}}, frame.F32Bytes(hidden)
	}
	for _, tc := range []struct {
		name string
		spec *meshp2pb.Speculation
		send func(w *frame.Writer, sid []byte) error
		want string
	}{
		{"window without speculation", nil, func(w *frame.Writer, sid []byte) error {
			return w.WriteActivation(window(sid, 0, 2, 0))
		}, "without speculation"},
		{"window over the cap", spec, func(w *frame.Writer, sid []byte) error {
			return w.WriteActivation(window(sid, 0, MaxSpecDraft+2, 0))
		}, "over the cap"},
		{"window without tokens", spec, func(w *frame.Writer, sid []byte) error {
			a, p := window(sid, 0, 2, 0)
			a.Tokens = nil
			return w.WriteActivation(a, p)
		}, "carries 0 tokens"},
		{"two lookaheads", spec, func(w *frame.Writer, sid []byte) error {
			a, p := window(sid, 0, 2, 0)
			a.Lookahead = []int32{1, 2}
			return w.WriteActivation(a, p)
		}, "lookahead"},
		{"speculation fields on a plain frame", spec, func(w *frame.Writer, sid []byte) error {
			a, p := window(sid, 0, 1, 3)
			a.Verify = false
			return w.WriteActivation(a, p)
		}, "not a verification window"},
		// Issue 37: 17-row windows, each raising spec_gen (so the last one
		// is rolled back): without a budget a hop computed 300× the
		// session's KV reservation.
		{"windows past the session's row budget", spec, func(w *frame.Writer, sid []byte) error {
			for gen := range uint64(2 * 4 * 64) { // twice the budget: 64 cells × (1 + 8) × 4, in windows of 17 rows
				if err := w.WriteActivation(window(sid, 0, MaxSpecDraft+1, gen+1)); err != nil {
					return nil // refused: the hop closed the stream
				}
			}
			return nil
		}, "over its budget"},
		{"generation going back", spec, func(w *frame.Writer, sid []byte) error {
			if err := w.WriteActivation(window(sid, 0, 2, 2)); err != nil {
				return err
			}
			return w.WriteActivation(window(sid, 2, 1, 1))
		}, "generation 1 after 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sid := newSID()
			open := &meshp2pb.SessionOpen{SessionId: sid, Epoch: 1, ModelFingerprint: fakeFP, NCtxNeeded: 64, HopIndex: 1, Speculation: tc.spec,
				Route: &meshp2pb.Route{ModelFingerprint: fakeFP, NLayer: fakeNLay, Epoch: 1, Hops: []*meshp2pb.RouteHop{
					{PeerId: []byte(c.ID()), Start: 0, End: 2}, {PeerId: []byte(tail.host.ID()), Start: 2, End: 6}}}}
			s, m := rawOpen(t, c, tail.host.ID(), open)
			if !m.GetAccept().GetOk() {
				t.Fatal(m)
			}
			if err := tc.send(frame.NewWriter(s, frame.Limits{}), sid); err != nil {
				t.Fatal(err)
			}
			m = readReply(t, s)
			e := m.GetError()
			if e == nil || peer.ID(e.GetFailedPeerId()) != c.ID() || e.GetCode() != meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST || !strings.Contains(e.GetMessage(), tc.want) {
				t.Fatalf("want BAD_REQUEST %q blaming the sender %s, got %v", tc.want, c.ID(), m)
			}
			waitReleased(t, tail)
		})
	}
	for _, sp := range []*meshp2pb.Speculation{
		{Mode: meshp2pb.SpecMode_SPEC_MODE_AUTO, MaxDraft: MaxSpecDraft + 1},
		{Mode: meshp2pb.SpecMode_SPEC_MODE_NGRAM, MaxWindows: MaxSpecWindows + 1},
		{Mode: 9},
	} {
		open := &meshp2pb.SessionOpen{SessionId: newSID(), Epoch: 1, ModelFingerprint: fakeFP, NCtxNeeded: 64, HopIndex: 1, Speculation: sp,
			Route: &meshp2pb.Route{ModelFingerprint: fakeFP, NLayer: fakeNLay, Epoch: 1, Hops: []*meshp2pb.RouteHop{
				{PeerId: []byte(c.ID()), Start: 0, End: 2}, {PeerId: []byte(tail.host.ID()), Start: 2, End: 6}}}}
		_, m := rawOpen(t, c, tail.host.ID(), open)
		if a := m.GetAccept(); a == nil || a.GetOk() || a.GetError().GetCode() != meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST {
			t.Fatalf("open with %v: want a BAD_REQUEST refusal, got %v", sp, m)
		}
	}
}

// FuzzCheckWindow: any header either passes checkWindow within the caps
// or is refused; nothing panics.
func FuzzCheckWindow(f *testing.F) {
	ok, _ := proto.Marshal(&meshp2pb.ActivationHeader{NRows: 3, Tokens: []int32{1, 2, 3}, Verify: true, SpecGen: 2, Lookahead: []int32{4}})
	f.Add(ok, uint64(1))
	f.Add([]byte{0x28, 0xff, 0xff, 0x03}, uint64(0))
	f.Fuzz(func(t *testing.T, b []byte, gen uint64) {
		var a meshp2pb.ActivationHeader
		if proto.Unmarshal(b, &a) != nil {
			return
		}
		if checkWindow(&a, true, gen) != nil {
			return
		}
		if a.GetNRows() > MaxSpecDraft+1 || len(a.GetTokens()) != int(a.GetNRows()) || len(a.GetLookahead()) > 1 || a.GetSpecGen() < gen || a.GetIsPrefill() {
			t.Fatalf("accepted %v", &a)
		}
	})
}

// FuzzWindowResult feeds a head with windows in flight arbitrary results:
// each is refused or commits tokens consistent with what was proposed;
// nothing panics and the head's chain stays consistent.
func FuzzWindowResult(f *testing.F) {
	f.Add([]byte{}, []byte{})
	good, _ := proto.Marshal(&meshp2pb.WindowResult{Position: 4, Tokens: []int32{1, 2}})
	f.Add(good, []byte{})
	f.Fuzz(func(t *testing.T, b1, b2 []byte) {
		open := &meshp2pb.SessionOpen{Speculation: &meshp2pb.Speculation{Mode: meshp2pb.SpecMode_SPEC_MODE_NGRAM, MaxDraft: 3, MaxWindows: 3}}
		sp := newSpecHead(open, false, nil, nil)
		sp.history([]int32{1, 2, 3, 1, 2, 3, 1, 2})
		sp.begin(3, 8, 1)
		sent := sp.windows(nil, 1, math.MaxInt, 100)
		if len(sent) == 0 {
			t.Fatal("no window sent on a repeating history")
		}
		for _, b := range [][]byte{b1, b2} {
			var wr meshp2pb.WindowResult
			if proto.Unmarshal(b, &wr) != nil {
				return
			}
			before := append([]int32{sp.last}, sp.pending...)
			res, err := sp.result(&wr)
			toks := res.toks
			if err != nil || toks == nil {
				continue
			}
			n := len(toks)
			if n > len(before) || !equal(toks[:n-1], before[1:n]) {
				t.Fatalf("committed %v from chain %v", toks, before)
			}
			if sp.sent > len(sp.pending)+1 || sp.sent < 0 {
				t.Fatalf("sent %d of a chain of %d", sp.sent, len(sp.pending)+1)
			}
			sp.windows(nil, 1, math.MaxInt, 100)
		}
	})
}

// fixedProposer proposes the tokens after its history's length in want
// (the "true" continuation).
type fixedProposer struct {
	want []int32
	n    int
}

func (p *fixedProposer) Append(toks ...int32) { p.n += len(toks) }
func (p *fixedProposer) Propose(k int) ([]int32, int) {
	if p.n >= len(p.want) {
		return nil, 0
	}
	return p.want[p.n:min(len(p.want), p.n+k)], 3
}

// The head's bookkeeping refuses results no honest tail sends, and takes
// every one it does (an end of generation at an accepted proposal too);
// the in-flight count it reports always returns to 0.
func TestSpecHeadResults(t *testing.T) {
	want := make([]int32, 64)
	for i := range want {
		want[i] = int32(10 + i)
	}
	// head returns a head whose proposer knows want (a history of 2
	// prompt tokens, then 10 committed at position 2), with W windows.
	head := func(w uint32) (*specHead, *int) {
		var gauge int
		open := &meshp2pb.SessionOpen{NCtxNeeded: 64, Speculation: &meshp2pb.Speculation{Mode: meshp2pb.SpecMode_SPEC_MODE_NGRAM, MaxDraft: 3, MaxWindows: w}}
		sp := newSpecHead(open, false, func(meshp2pb.SpecMode, int) (Proposer, string) {
			return &fixedProposer{want: append([]int32{1, 2}, want...)}, "fixed"
		}, func(d int) { gauge += d })
		sp.history([]int32{1, 2})
		if !sp.begin(10, 2, 1) || sp.begin(10, 2, 1) {
			t.Fatal("begin: the first must succeed, a second fail")
		}
		// Teach it that proposals are good and rows cheap against the
		// ring, so K grows to its cap and windows go in flight together.
		sp.ad.ObserveAcceptance(3, 100, 100)
		for range 5 {
			sp.ad.ObserveWindow(1, 60*time.Millisecond, time.Millisecond)
			sp.ad.ObserveWindow(4, 61*time.Millisecond, 2*time.Millisecond)
		}
		sp.stats.K = 3
		return sp, &gauge
	}
	t.Run("a window without lookahead fully accepted but no bonus", func(t *testing.T) {
		sp, _ := head(1)
		ws := sp.windows(nil, 1, math.MaxInt, 50)
		if len(ws) != 1 || len(ws[0].GetLookahead()) != 0 {
			t.Fatalf("windows %v", ws)
		}
		d := int(ws[0].GetNRows()) - 1
		if _, err := sp.result(&meshp2pb.WindowResult{Position: 3, Tokens: want[1 : 1+d]}); err == nil {
			t.Fatal("accepted a result without the bonus its window must have")
		}
		sp.windows(nil, 1, math.MaxInt, 50) // must not panic
	})
	t.Run("a bonus after a lookahead", func(t *testing.T) {
		sp, _ := head(3)
		ws := sp.windows(nil, 1, math.MaxInt, 50)
		if len(ws) < 2 || len(ws[0].GetLookahead()) != 1 {
			t.Fatalf("want a chain of windows, got %v", ws)
		}
		d := int(ws[0].GetNRows())
		if _, err := sp.result(&meshp2pb.WindowResult{Position: 3, Tokens: want[1 : 1+d+1]}); err == nil {
			t.Fatal("accepted a bonus after a lookahead")
		}
	})
	t.Run("end of generation at an accepted proposal", func(t *testing.T) {
		sp, gauge := head(3)
		ws := sp.windows(nil, 1, math.MaxInt, 50)
		if *gauge != len(ws) {
			t.Fatalf("gauge %d, %d windows sent", *gauge, len(ws))
		}
		res, err := sp.result(&meshp2pb.WindowResult{Position: 3, Tokens: want[1:3], Eos: true})
		toks := res.toks
		if err != nil || len(toks) != 2 {
			t.Fatalf("%v %v", toks, err)
		}
		if *gauge != 0 || sp.windows(nil, 1, math.MaxInt, 50) != nil {
			t.Fatalf("after the end: gauge %d, windows still sent", *gauge)
		}
		if res, err := sp.result(&meshp2pb.WindowResult{Position: 5, Tokens: want[3:4]}); res.toks != nil || err != nil {
			t.Fatalf("a result after the end: %v %v", toks, err)
		}
	})
	t.Run("close returns the gauge", func(t *testing.T) {
		sp, gauge := head(3)
		sp.windows(nil, 1, math.MaxInt, 50)
		sp.close()
		if *gauge != 0 || sp.windows(nil, 1, math.MaxInt, 50) != nil {
			t.Fatalf("after close: gauge %d", *gauge)
		}
	})
	t.Run("honest results", func(t *testing.T) {
		sp, gauge := head(3)
		var got []int32
		for len(got) < 12 {
			ws := sp.windows(nil, 1, math.MaxInt, 50)
			if len(ws) == 0 && len(sp.inflight) == 0 {
				t.Fatal("stalled")
			}
			for _, a := range ws {
				// The honest tail: accept while the proposal is want's,
				// correct the 7th token once.
				rows, look := a.GetTokens(), a.GetLookahead()
				var toks []int32
				for i := range rows {
					pos := int(a.GetPosStart()) + i - 2 // index into want of the row
					target := want[pos+1]
					if pos+1 == 7 && len(got)+len(toks) < 8 && a.GetSpecGen() == 0 {
						target = 99
					}
					toks = append(toks, target)
					var prop int32 = -1
					if i+1 < len(rows) {
						prop = rows[i+1]
					} else if len(look) > 0 {
						prop = look[0]
					}
					if prop != target {
						break
					}
				}
				c, err := sp.result(&meshp2pb.WindowResult{SpecGen: a.GetSpecGen(), Position: a.GetPosStart() + 1, Tokens: toks})
				if err != nil {
					t.Fatalf("honest result %v refused: %v", toks, err)
				}
				got = append(got, c.toks...)
			}
		}
		if *gauge != len(sp.inflight) {
			t.Fatalf("gauge %d, %d in flight", *gauge, len(sp.inflight))
		}
		for i, tok := range got {
			if exp := want[i+1]; (i == 6 && tok != 99) || (i != 6 && tok != exp) {
				t.Fatalf("committed %v: token %d is %d", got, i, tok)
			}
		}
	})
}
