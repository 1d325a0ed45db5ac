package session

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
)

// Issue 39, item 6: on slow machines the prefill outlasted the fixed waits
// (the tail's first-frame wait, the head's idle timer while the hops after
// it were still on the prompt, the origin's first-token wait), and the
// origin excluded an honest hop. The waits are shortened by name
// (FirstFrame, Idle, TokenTimeout) and the engines made slow (delay per
// row and layer) so that the prefill takes several times every fixed
// wait; the hops advertise their speed. The generation must complete
// exactly, with no hop blamed.
func TestSlowPrefillOutlastsFixedWaits(t *testing.T) {
	const (
		firstFrame = 100 * time.Millisecond
		idle       = 400 * time.Millisecond
		token      = time.Second
	)
	for _, tc := range []struct {
		name  string
		chunk int
	}{
		{"default chunks", 0},
		{"chunks of 50", 50},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tweak := func(c *HopConfig) { c.FirstFrame, c.Idle = firstFrame, idle }
			// 2 ms, 4 ms and 2 ms per row and layer, 2 layers each: a
			// 100-row prompt keeps the hops 0.4 s, 0.8 s and 0.4 s, 1.6 s
			// in all, against fixed waits of 0.3 s for the tail's first
			// frame (the whole prompt was once the first chunk), 0.4 s
			// between frames (the tail waits 1.2 s for the prompt's bulk
			// after its first row, the head as long for the first token
			// after its prompt) and 1 s for the origin's first token.
			var hops []*fakeHop
			for i, ms := range []float64{2, 4, 2} {
				h := startHop(t, 2*i, 2*i+2, tweak)
				h.eng.delay, h.msPerLayer = time.Duration(ms*float64(time.Millisecond)), ms
				hops = append(hops, h)
			}
			o, _ := newOrigin(t, stagePlanner{[][]*fakeHop{{hops[0]}, {hops[1]}, {hops[2]}}}, hops...)
			o.TokenTimeout, o.Chunk, o.Failures = token, tc.chunk, NewFailureMemory(time.Hour, 16)
			prompt := make([]int32, 100)
			for i := range prompt {
				prompt[i] = int32(i%90 + 1)
			}
			const maxTok = 8
			start := time.Now()
			res, err := o.Generate(context.Background(), GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: prompt, MaxTokens: maxTok})
			if err != nil {
				t.Fatalf("generation failed (a fixed wait ran out during the prefill?): %v", err)
			}
			if res.Reroutes != 0 || len(res.Failures) != 0 {
				t.Fatalf("%d re-routes, failures %v; want none", res.Reroutes, res.Failures)
			}
			for _, h := range hops {
				if o.Failures.Avoided(h.host.ID()) {
					t.Errorf("hop %d-%d blamed", h.eng.info.Start, h.eng.info.End)
				}
			}
			if want := reference(prompt, maxTok, 0); !equal(res.Tokens, want) {
				t.Fatalf("tokens %v\nwant   %v", res.Tokens, want)
			}
			if took := time.Since(start); took < token {
				t.Fatalf("generation took %s: the prefill was not slow, the test proves nothing", took)
			}
		})
	}
}

// A hop whose engine never returns from the prefill is the one blamed and
// re-routed around, not the hop after it that reported the silence (a
// report against an earlier hop used to be blamed on its sender), nor the
// origin (a head idle after the prompt used to blame it: no re-route).
// The stuck stage has a spare; the others have none, so blaming any other
// hop ends the generation.
func TestStuckHopTakesTheBlame(t *testing.T) {
	for stuck, name := range []string{"head", "middle", "tail"} {
		t.Run(name, func(t *testing.T) {
			tweak := func(c *HopConfig) { c.FirstFrame, c.Idle = 100*time.Millisecond, 500*time.Millisecond }
			stages := make([][]*fakeHop, 3)
			var all []*fakeHop
			for i := range stages {
				stages[i] = []*fakeHop{startHop(t, 2*i, 2*i+2, tweak)}
				if i == stuck {
					stages[i] = append(stages[i], startHop(t, 2*i, 2*i+2, tweak))
				}
				for _, h := range stages[i] {
					h.msPerLayer = 1
					all = append(all, h)
				}
			}
			bad := stages[stuck][0]
			release := make(chan struct{})
			var once sync.Once
			t.Cleanup(func() { once.Do(func() { close(release) }) }) // before the hops close: they wait for the engine
			bad.eng.mu.Lock()
			bad.eng.onForward = func(int) { <-release }
			bad.eng.mu.Unlock()
			o, _ := newOrigin(t, stagePlanner{stages}, all...)
			o.TokenTimeout, o.Failures = time.Second, NewFailureMemory(time.Hour, 16)
			prompt := []int32{5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79}
			const maxTok = 6
			res, err := o.Generate(context.Background(), GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: prompt, MaxTokens: maxTok})
			if err != nil {
				t.Fatalf("generation failed (an honest hop blamed for the stuck one?): %v", err)
			}
			if res.Reroutes != 1 || res.Route.Hops[stuck].Peer != stages[stuck][1].host.ID() {
				t.Fatalf("%d re-routes, final route %v, failures %v; want one re-route onto the spare %s", res.Reroutes, res.Route.Hops, res.Failures, name)
			}
			for _, h := range all {
				if blamed := o.Failures.Avoided(h.host.ID()); blamed != (h == bad) {
					t.Errorf("hop %d-%d blamed: %v (failures %v)", h.eng.info.Start, h.eng.info.End, blamed, res.Failures)
				}
			}
			if want := reference(prompt, maxTok, 0); !equal(res.Tokens, want) {
				t.Fatalf("tokens %v\nwant   %v", res.Tokens, want)
			}
		})
	}
}

// waitsOpen is an open of a 4-hop route over 8 layers of which the origin
// says speeds (ms per layer), for rows prompt rows and 10 tokens.
func waitsOpen(rows int, speeds ...float32) *meshp2pb.SessionOpen {
	rt := &meshp2pb.Route{NLayer: 8}
	for i := range 4 {
		rt.Hops = append(rt.Hops, &meshp2pb.RouteHop{PeerId: []byte{byte(i)}, Start: uint32(2 * i), End: uint32(2*i + 2)})
	}
	return &meshp2pb.SessionOpen{Route: rt, MaxTokens: 10, NCtxNeeded: uint32(rows + 11), HopMsPerLayer: speeds}
}

// The waits follow the work and keep the ladder: later hops wait longer
// for their first frame (the prompt passes every hop before), every wait
// is at least the fixed one, the origin waits longer than any hop, and a
// hostile speed is capped.
func TestWaitPlan(t *testing.T) {
	const ff, idle, token = 10 * time.Second, time.Minute, 90 * time.Second
	open := waitsOpen(500, 10, 20, 10, 10)
	if got := prefillRows(open); got != 500 {
		t.Fatalf("prefill rows %d, want 500", got)
	}
	// 500 rows × 2 layers × 10 ms × slack: 10 s × PrefillWaitSlack per hop
	// (the second twice that).
	w := 10 * time.Second * PrefillWaitSlack
	all := 5 * w
	var prev waitPlan
	for idx := range 4 {
		p := planWaits(open, idx, ff, idle)
		up := []time.Duration{0, w, 3 * w, 4 * w}[idx]
		first := min(ff+up, idle)
		if p.first != first || p.prefill != idle+up || p.after != idle+2*all {
			t.Errorf("hop %d: first %s prefill %s after %s; want %s, %s, %s", idx, p.first, p.prefill, p.after, first, idle+up, idle+2*all)
		}
		if idx > 0 && p.first < prev.first {
			t.Errorf("hop %d waits %s for its first frame, hop %d %s: later hops must not wait less", idx, p.first, idx-1, prev.first)
		}
		if idx > 0 && p.prefill <= prev.prefill {
			t.Errorf("hop %d waits %s between prompt frames, hop %d %s: later hops must wait longer", idx, p.prefill, idx-1, prev.prefill)
		}
		prev = p
	}
	if got, min := originFirstWait(open, 500, token), idle+3*all; got <= min {
		t.Errorf("origin's first-token wait %s, want more than any hop's %s", got, min)
	}
	// Unknown speeds: the fixed waits, and the origin's old rule.
	unknown := waitsOpen(5000)
	if p := planWaits(unknown, 3, ff, idle); p.first != ff || p.prefill != idle || p.after != idle {
		t.Errorf("no speeds: %+v, want the fixed waits", p)
	}
	if got := originFirstWait(unknown, 5000, token); got != 5*token {
		t.Errorf("no speeds: origin waits %s for 5000 rows, want %s", got, 5*token)
	}
	// A relaying hop (or a squatter naming itself the previous hop) that
	// claims a minute per layer holds later hops for at most
	// MaxPrefillWait more between frames, and at most Idle before the
	// first.
	huge := waitsOpen(1000, 1e9, 1e9, 1e9, 1e9)
	if p := planWaits(huge, 3, ff, idle); p.first > idle || p.prefill > idle+MaxPrefillWait || p.after > idle+2*MaxPrefillWait {
		t.Errorf("hostile speeds: %+v, want at most Idle (%s) for the first frame, MaxPrefillWait (%s) more after", p, idle, MaxPrefillWait)
	}
}

// The origin sends each hop's advertised speed; a hop that advertises
// none counts as the slowest one that does.
func TestHopMsPerLayer(t *testing.T) {
	rt := &route.Route{Hops: []route.Hop{{MsPerLayer: 2}, {}, {MsPerLayer: 5}}}
	if got := hopMsPerLayer(rt); len(got) != 3 || got[0] != 2 || got[1] != 5 || got[2] != 5 {
		t.Fatalf("hop_ms_per_layer %v, want [2 5 5]", got)
	}
	if got := hopMsPerLayer(&route.Route{Hops: []route.Hop{{}, {}}}); got != nil {
		t.Fatalf("no speeds known: %v, want none", got)
	}
}

// A hop reported for a silence judges the report by its own state: it
// takes the blame only when it has computed one frame for longer than its
// estimate allows, passes it upstream only when it is itself overdue for
// its prompt, and otherwise leaves it to fromDownstream (which blames the
// reporter): a premature or false report cannot get it excluded.
func TestVerdict(t *testing.T) {
	me, up := newTestHost(t), newTestHost(t).ID()
	h := &HopService{host: me, cfg: HopConfig{FirstFrame: 100 * time.Millisecond, Idle: time.Second}}
	open := waitsOpen(100, 1, 1, 1, 1) // 100 rows × 2 layers × 1 ms × slack per hop
	newHS := func() *hopSession {
		hs := &hopSession{h: h, se: &servedEngine{}, idx: 1, open: open, route: []peer.ID{up, me.ID(), "c", "d"}}
		hs.waits = planWaits(open, 1, h.firstFrame(1), h.cfg.Idle)
		return hs
	}
	asHead := func(hs *hopSession) { // the same hop as the route's head
		hs.idx, hs.head, hs.route = 0, true, []peer.ID{me.ID(), "b", "c", "d"}
		hs.waits = planWaits(open, 0, h.firstFrame(0), h.cfg.Idle)
	}
	report := func(code meshp2pb.ErrorCode, blamed peer.ID) *meshp2pb.Error {
		return &meshp2pb.Error{Code: code, Message: "no frame since admission", FailedPeerId: []byte(blamed), PeerId: []byte("c")}
	}
	timeout := meshp2pb.ErrorCode_ERROR_CODE_TIMEOUT
	ago := func(d time.Duration) int64 { return time.Now().Add(-d).UnixNano() }
	stuck := h.firstFrame(0) + 100*2*time.Millisecond*PrefillWaitSlack
	for _, tc := range []struct {
		name  string
		set   func(hs *hopSession)
		e     *meshp2pb.Error
		blame peer.ID // "-": no verdict
	}{
		{"another code", func(hs *hopSession) { hs.clk.admitted.Store(ago(time.Hour)) }, report(meshp2pb.ErrorCode_ERROR_CODE_NEXT_HOP_UNREACHABLE, me.ID()), "-"},
		{"blames another hop", func(hs *hopSession) { hs.clk.admitted.Store(ago(time.Hour)) }, report(timeout, "d"), "-"},
		{"not admitted yet", func(hs *hopSession) {}, report(timeout, me.ID()), "-"},
		{"computing, within its estimate", func(hs *hopSession) {
			hs.clk.admitted.Store(ago(time.Hour))
			hs.working(100)
			hs.clk.busySince.Store(ago(stuck / 2))
		}, report(timeout, me.ID()), "-"},
		{"computing one frame too long", func(hs *hopSession) {
			hs.clk.admitted.Store(ago(time.Hour))
			hs.working(100)
			hs.clk.busySince.Store(ago(stuck + 50*time.Millisecond))
		}, report(timeout, me.ID()), me.ID()},
		{"overdue for its prompt", func(hs *hopSession) {
			hs.clk.admitted.Store(ago(time.Hour))
			hs.clk.heard.Store(ago(hs.waits.prefill))
		}, report(timeout, me.ID()), up},
		{"waiting for its prompt, not overdue", func(hs *hopSession) {
			hs.clk.admitted.Store(ago(time.Hour))
			hs.clk.heard.Store(ago(10 * time.Millisecond))
		}, report(timeout, me.ID()), "-"},
		{"prompt all in, idle", func(hs *hopSession) {
			hs.clk.admitted.Store(ago(time.Hour))
			hs.rows.Store(100)
		}, report(timeout, me.ID()), "-"},
		{"prompt all in, within its own wait", func(hs *hopSession) {
			hs.clk.admitted.Store(ago(time.Hour))
			hs.rows.Store(100)
			hs.clk.heard.Store(ago(hs.waits.after - 100*time.Millisecond))
		}, report(timeout, me.ID()), "-"},
		// The reporter's wait after the prompt is this hop's, started a
		// frame's transit later: this hop's own timer is due too and
		// blames its upstream, whichever fires first.
		{"prompt all in, its own wait run out", func(hs *hopSession) {
			hs.clk.admitted.Store(ago(time.Hour))
			hs.rows.Store(100)
			hs.clk.heard.Store(ago(hs.waits.after + time.Millisecond))
		}, report(timeout, me.ID()), up},
		{"decoding, its own wait run out", func(hs *hopSession) {
			hs.clk.admitted.Store(ago(time.Hour))
			hs.rows.Store(105)
			hs.clk.heard.Store(ago(h.cfg.Idle + time.Millisecond))
		}, report(timeout, me.ID()), up},
		// A head after the prompt waits on the ring: a stuck tail is its
		// to report, not the reporter's (TestStuckHopTakesTheBlame/tail).
		{"head after the prompt, its own wait run out", func(hs *hopSession) {
			asHead(hs)
			hs.clk.admitted.Store(ago(time.Hour))
			hs.rows.Store(100)
			hs.clk.heard.Store(ago(hs.waits.after + time.Millisecond))
		}, report(timeout, me.ID()), "d"},
		{"head after the prompt, within its own wait", func(hs *hopSession) {
			asHead(hs)
			hs.clk.admitted.Store(ago(time.Hour))
			hs.rows.Store(100)
			hs.clk.heard.Store(ago(hs.waits.after - 100*time.Millisecond))
		}, report(timeout, me.ID()), "-"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hs := newHS()
			tc.set(hs)
			v := hs.verdict(tc.e)
			switch {
			case tc.blame == "-" && v != nil:
				t.Fatalf("verdict %v, want none", v)
			case tc.blame != "-" && v == nil:
				t.Fatal("no verdict")
			case tc.blame != "-" && (peer.ID(v.e.GetFailedPeerId()) != tc.blame || peer.ID(v.e.GetPeerId()) != me.ID() || !strings.HasPrefix(v.e.GetMessage(), tc.e.GetMessage())):
				t.Fatalf("verdict blames %s, reported by %s (%q); want %s, by this hop", peer.ID(v.e.GetFailedPeerId()), peer.ID(v.e.GetPeerId()), v.e.GetMessage(), tc.blame)
			}
		})
	}
}
