package session

import (
	"context"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
)

// threeHops starts hops serving 0-2, 2-4 and 4-6 of the fake model.
func threeHops(t *testing.T) []*fakeHop {
	return []*fakeHop{startHop(t, 0, 2, nil), startHop(t, 2, 4, nil), startHop(t, 4, 6, nil)}
}

func TestGenerateMatchesReference(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ranges [][2]int
		wire   meshp2pb.DType
		seed   uint64
	}{
		{"one hop", [][2]int{{0, 6}}, meshp2pb.DType_DTYPE_F32, 0},
		{"two hops f16", [][2]int{{0, 3}, {3, 6}}, meshp2pb.DType_DTYPE_F16, 5},
		{"three hops", [][2]int{{0, 2}, {2, 4}, {4, 6}}, meshp2pb.DType_DTYPE_F32, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var hops []*fakeHop
			var stages [][]*fakeHop
			for _, r := range tc.ranges {
				h := startHop(t, r[0], r[1], nil)
				hops = append(hops, h)
				stages = append(stages, []*fakeHop{h})
			}
			o, _ := newOrigin(t, stagePlanner{stages}, hops...)
			o.Chunk = 3 // several prefill chunks
			prompt := []int32{5, 6, 7, 8, 9, 10, 11}
			res, err := o.Generate(context.Background(), GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: prompt, MaxTokens: 20,
				WireDType: tc.wire, Sampling: &meshp2pb.SamplingParams{Seed: tc.seed}})
			if err != nil {
				t.Fatal(err)
			}
			if want := reference(prompt, 20, tc.seed); !equal(res.Tokens, want) {
				t.Fatalf("tokens %v, want %v", res.Tokens, want)
			}
			if res.Stop != "max_tokens" || res.Reroutes != 0 || len(res.HopStats) != len(hops) {
				t.Fatalf("result %+v", res)
			}
			waitReleased(t, hops...)
		})
	}
}

func equal(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// rawOpen sends one SessionOpen from c to p and returns the reply. An
// unsigned open is signed by c first (c is its origin).
func rawOpen(t *testing.T, c *testHost, p peer.ID, open *meshp2pb.SessionOpen) (network.Stream, *meshp2pb.StreamMessage) {
	t.Helper()
	if len(open.GetOriginSignature()) == 0 {
		signedBy(t, c, open)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := c.NewStream(ctx, p, c.ProtocolID(ProtoSession, ProtoVersion))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Reset() })
	if err := frame.NewWriter(s, frame.Limits{}).WriteStream(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Open{Open: open}}); err != nil {
		t.Fatal(err)
	}
	_ = s.SetReadDeadline(time.Now().Add(10 * time.Second))
	msg, _, err := frame.NewReader(s, frame.Limits{}).ReadStream()
	if err != nil {
		t.Fatal(err)
	}
	return s, msg
}

func newSID() []byte {
	sid := make([]byte, 16)
	_, _ = rand.Read(sid)
	return sid
}

// openFor is a valid SessionOpen for the one-hop route through h.
func openFor(h *fakeHop, epoch uint64, kv uint32) *meshp2pb.SessionOpen {
	return &meshp2pb.SessionOpen{SessionId: newSID(), Epoch: epoch, ModelFingerprint: fakeFP, NCtxNeeded: kv,
		Route: &meshp2pb.Route{ModelFingerprint: fakeFP, NLayer: fakeNLay, Epoch: epoch,
			Hops: []*meshp2pb.RouteHop{{PeerId: []byte(h.host.ID()), Start: 0, End: fakeNLay}}}}
}

func TestAdmissionRefusals(t *testing.T) {
	whole := startHop(t, 0, 6, func(c *HopConfig) {
		// The engine's own limits (quotas: TestAdmissionQuotas).
		c.MaxSessionKV, c.MaxSessionsPerPeer, c.MaxKVPerPeer = -1, -1, -1
		c.Admit = func(open *meshp2pb.SessionOpen, idx int, from peer.ID) *meshp2pb.Error {
			if open.GetMaxTokens() == 999 {
				return &meshp2pb.Error{Code: meshp2pb.ErrorCode_ERROR_CODE_TICKET_INVALID, Message: "no ticket"}
			}
			return nil
		}
	})
	part := startHop(t, 2, 4, nil)
	c := newTestHost(t)
	stranger := newTestHost(t)
	connectAll(c, whole.host, part.host, stranger)
	me := whole.host.ID()
	for _, tc := range []struct {
		name   string
		to     *fakeHop
		edit   func(o *meshp2pb.SessionOpen)
		code   meshp2pb.ErrorCode
		failed peer.ID // who the refusal blames ("" nobody)
	}{
		{"short session id", whole, func(o *meshp2pb.SessionOpen) { o.SessionId = o.SessionId[:8] }, meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, ""},
		{"other model", whole, func(o *meshp2pb.SessionOpen) { o.ModelFingerprint = "other" }, meshp2pb.ErrorCode_ERROR_CODE_MODEL_MISMATCH, me},
		{"layer count", whole, func(o *meshp2pb.SessionOpen) { o.Route.NLayer = 7; o.Route.Hops[0].End = 7 }, meshp2pb.ErrorCode_ERROR_CODE_MODEL_MISMATCH, me},
		{"epoch differs", whole, func(o *meshp2pb.SessionOpen) { o.Epoch = 2 }, meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, ""},
		{"wire dtype", whole, func(o *meshp2pb.SessionOpen) { o.WireDtype = meshp2pb.DType_DTYPE_I32 }, meshp2pb.ErrorCode_ERROR_CODE_UNSUPPORTED_DTYPE, me},
		{"hop names another peer", whole, func(o *meshp2pb.SessionOpen) { o.Route.Hops[0].PeerId = []byte(part.host.ID()) }, meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, ""},
		{"hop index outside", whole, func(o *meshp2pb.SessionOpen) { o.HopIndex = 3 }, meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, ""},
		{"range", whole, func(o *meshp2pb.SessionOpen) {
			o.Route.Hops = []*meshp2pb.RouteHop{{PeerId: []byte(me), Start: 0, End: 3}, {PeerId: []byte(part.host.ID()), Start: 3, End: 6}}
		}, meshp2pb.ErrorCode_ERROR_CODE_RANGE_MISMATCH, me},
		{"not a cover", part, func(o *meshp2pb.SessionOpen) {
			o.Route.Hops = []*meshp2pb.RouteHop{{PeerId: []byte(c.ID()), Start: 0, End: 2}, {PeerId: []byte(part.host.ID()), Start: 2, End: 4}}
			o.HopIndex = 1
		}, meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, ""},
		{"not from the previous hop", part, func(o *meshp2pb.SessionOpen) {
			o.Route.Hops = []*meshp2pb.RouteHop{{PeerId: []byte(stranger.ID()), Start: 0, End: 2}, {PeerId: []byte(part.host.ID()), Start: 2, End: 4}, {PeerId: []byte(me), Start: 4, End: 6}}
			o.HopIndex = 1
		}, meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, ""},
		{"no KV room", whole, func(o *meshp2pb.SessionOpen) { o.NCtxNeeded = 5000 }, meshp2pb.ErrorCode_ERROR_CODE_NO_CAPACITY, me},
		{"admission hook", whole, func(o *meshp2pb.SessionOpen) { o.MaxTokens = 999 }, meshp2pb.ErrorCode_ERROR_CODE_TICKET_INVALID, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := openFor(whole, 1, 64)
			tc.edit(o)
			_, msg := rawOpen(t, c, tc.to.host.ID(), o)
			acc := msg.GetAccept()
			if acc == nil || acc.GetOk() {
				t.Fatalf("want a refusal, got %v", msg)
			}
			if got := acc.GetError().GetCode(); got != tc.code {
				t.Fatalf("code %s, want %s (%s)", got, tc.code, acc.GetError().GetMessage())
			}
			if got := peer.ID(acc.GetError().GetFailedPeerId()); got != tc.failed {
				t.Fatalf("refusal blames %q, want %q", got, tc.failed)
			}
			if whole.svc.Sessions() != 0 || part.svc.Sessions() != 0 || whole.eng.open() != 0 {
				t.Fatal("a refused session holds state")
			}
		})
	}
	t.Run("all slots in use", func(t *testing.T) {
		for range whole.eng.maxSessions {
			if _, msg := rawOpen(t, c, me, openFor(whole, 1, 8)); !msg.GetAccept().GetOk() {
				t.Fatalf("refused below capacity: %v", msg)
			}
		}
		_, msg := rawOpen(t, c, me, openFor(whole, 1, 8))
		if msg.GetAccept().GetError().GetCode() != meshp2pb.ErrorCode_ERROR_CODE_NO_CAPACITY {
			t.Fatalf("want NO_CAPACITY, got %v", msg)
		}
	})
}

// A re-routed session (same id, next epoch) supersedes the old epoch on a
// hop: the old one is told STALE_EPOCH and its KV cells are freed first.
func TestEpochSupersede(t *testing.T) {
	whole := startHop(t, 0, 6, nil)
	whole.eng.mu.Lock()
	whole.eng.nCtx = 600 // 500 + 500 cells do not fit
	whole.eng.mu.Unlock()
	c := newTestHost(t)
	connectAll(c, whole.host)
	o1 := openFor(whole, 1, 500)
	s1, m1 := rawOpen(t, c, whole.host.ID(), o1)
	if !m1.GetAccept().GetOk() {
		t.Fatalf("epoch 1: %v", m1)
	}
	o2 := openFor(whole, 2, 500)
	o2.SessionId = o1.SessionId
	_, m2 := rawOpen(t, c, whole.host.ID(), o2)
	if !m2.GetAccept().GetOk() {
		t.Fatalf("epoch 2 refused while epoch 1 holds its cells: %v", m2)
	}
	msg, _, err := frame.NewReader(s1, frame.Limits{}).ReadStream()
	if err != nil || msg.GetError().GetCode() != meshp2pb.ErrorCode_ERROR_CODE_STALE_EPOCH {
		t.Fatalf("epoch 1 should be told STALE_EPOCH: %v %v", msg, err)
	}
	// The old epoch's engine session is freed before epoch 2 is accepted;
	// it leaves the hop's table when its goroutines finish, just after
	// STALE_EPOCH is written (found failing under load as "2, want 1").
	deadline := time.Now().Add(10 * time.Second)
	for whole.svc.Sessions() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("sessions on the hop: %d, want 1", whole.svc.Sessions())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A session whose origin goes silent is freed after the idle time, with a
// TIMEOUT report that blames nobody (the origin is upstream of the head).
func TestIdleRelease(t *testing.T) {
	whole := startHop(t, 0, 6, func(c *HopConfig) { c.Idle = 200 * time.Millisecond })
	c := newTestHost(t)
	connectAll(c, whole.host)
	s, msg := rawOpen(t, c, whole.host.ID(), openFor(whole, 1, 64))
	if !msg.GetAccept().GetOk() {
		t.Fatal(msg)
	}
	msg, _, err := frame.NewReader(s, frame.Limits{}).ReadStream()
	if err != nil || msg.GetError().GetCode() != meshp2pb.ErrorCode_ERROR_CODE_TIMEOUT || len(msg.GetError().GetFailedPeerId()) != 0 {
		t.Fatalf("want TIMEOUT blaming nobody, got %v %v", msg, err)
	}
	waitReleased(t, whole)
}

// A client that vanishes mid-generation leaves nothing on any hop.
func TestClientDisconnect(t *testing.T) {
	hops := threeHops(t)
	o, _ := newOrigin(t, stagePlanner{[][]*fakeHop{{hops[0]}, {hops[1]}, {hops[2]}}}, hops...)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	n := 0
	_, err := o.Generate(ctx, GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: []int32{1, 2, 3}, MaxTokens: 500,
		OnToken: func(int32) bool {
			if n++; n == 5 {
				cancel()
			}
			return false
		}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("want context.Canceled, got %v", err)
	}
	waitReleased(t, hops...)
}

// A hop killed mid-generation at each position is blamed — not its
// neighbours — and the origin re-routes around it to a spare; the tokens
// are those of a run without the failure.
func TestRerouteAfterKill(t *testing.T) {
	for pos, name := range []string{"head", "middle", "tail"} {
		t.Run(name, func(t *testing.T) {
			primary, spare := threeHops(t), threeHops(t)
			var stages [][]*fakeHop
			for i := range primary {
				stages = append(stages, []*fakeHop{primary[i], spare[i]})
			}
			o, c := newOrigin(t, stagePlanner{stages}, append(primary, spare...)...)
			primary[pos].killAtStep(5, append([]*testHost{c}, hostsOf(append(primary, spare...)...)...)...)
			prompt := []int32{3, 1, 4, 1, 5}
			const maxTok = 40
			res, err := o.Generate(context.Background(), GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: prompt, MaxTokens: maxTok})
			if err != nil {
				t.Fatal(err)
			}
			if want := reference(prompt, maxTok, 0); !equal(res.Tokens, want) {
				t.Fatalf("tokens %v\nwant   %v", res.Tokens, want)
			}
			if res.Reroutes != 1 {
				t.Fatalf("reroutes %d, want 1 (failures %v)", res.Reroutes, res.Failures)
			}
			for i, h := range res.Route.Hops {
				want := primary[i].host.ID()
				if i == pos {
					want = spare[i].host.ID()
				}
				if h.Peer != want {
					t.Fatalf("after the re-route hop %d is %s, want %s (blame went to the wrong peer: %v)", i, h.Peer, want, res.Failures)
				}
			}
			var alive []*fakeHop
			for i, h := range primary {
				if i != pos {
					alive = append(alive, h)
				}
			}
			waitReleased(t, append(alive, spare...)...)
		})
	}
}

// Blame from each position without a re-route: the error the origin gets
// names the dead hop.
func TestBlameNamesTheDeadHop(t *testing.T) {
	for pos, name := range []string{"head", "middle", "tail"} {
		t.Run(name, func(t *testing.T) {
			hops := threeHops(t)
			o, c := newOrigin(t, stagePlanner{[][]*fakeHop{{hops[0]}, {hops[1]}, {hops[2]}}}, hops...)
			o.MaxReroutes = -1
			hops[pos].killAtStep(5, append([]*testHost{c}, hostsOf(hops...)...)...)
			res, err := o.Generate(context.Background(), GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: []int32{2, 7}, MaxTokens: 500})
			if !errors.Is(err, ErrGeneration) {
				t.Fatalf("want ErrGeneration, got %v", err)
			}
			if len(res.Failures) != 1 {
				t.Fatalf("failures %v", res.Failures)
			}
			var re *frame.RemoteError
			if pos > 0 {
				// A neighbour reports: the error names the dead peer.
				if !errors.As(err, &re) || peer.ID(re.E.GetFailedPeerId()) != hops[pos].host.ID() {
					t.Fatalf("want a report naming hop %d (%s), got %v (from %s, blaming %s; hops %s %s %s)", pos, hops[pos].host.ID(), err,
						peer.ID(re.E.GetPeerId()), peer.ID(re.E.GetFailedPeerId()), hops[0].host.ID(), hops[1].host.ID(), hops[2].host.ID())
				}
			} else if errors.As(err, &re) {
				// The head itself died: only the origin can tell.
				t.Fatalf("head died, yet a hop reported: %v", err)
			}
		})
	}
}

// A hop may not get an earlier, honest hop excluded, nor a hop its
// reporter cannot see, and an error that blames nobody is blamed on the
// neighbour that sent it.
func TestBlameOnlyDownstream(t *testing.T) {
	route := []peer.ID{"a", "b", "c", "d", "e"}
	for _, tc := range []struct {
		name             string
		idx              int // the hop that receives the report
		ring             bool
		reporter, failed peer.ID
		neighbour, want  peer.ID
	}{
		{"next hop blames itself", 1, false, "", "c", "c", "c"},
		{"next hop blames its next hop", 1, false, "", "d", "c", "d"},
		{"next hop blames a hop it does not see", 1, false, "", "e", "c", "c"},
		{"next hop blames the first hop", 1, false, "", "a", "c", "c"},
		{"next hop blames us", 1, false, "", "b", "c", "c"},
		{"next hop blames nobody", 1, false, "", "", "c", "c"},
		{"relayed: later reporter blames its next hop", 1, false, "d", "e", "c", "e"},
		{"relayed: later reporter blames its previous hop", 1, false, "d", "c", "c", "c"},
		{"reporter before the neighbour is not believed", 1, false, "a", "e", "c", "c"},
		{"ring: tail blames itself", 0, true, "", "e", "e", "e"},
		{"ring: tail blames its upstream", 0, true, "", "d", "e", "d"},
		{"ring: tail blames a middle it does not see", 0, true, "", "c", "e", "e"},
		{"ring: tail blames nobody", 0, true, "", "", "e", "e"},
		{"ring: no relayed reporter on the ring", 0, true, "c", "b", "e", "e"},
	} {
		hs := &hopSession{idx: tc.idx, route: route}
		e := &meshp2pb.Error{Code: meshp2pb.ErrorCode_ERROR_CODE_NEXT_HOP_UNREACHABLE, PeerId: []byte(tc.reporter), FailedPeerId: []byte(tc.failed)}
		if got := peer.ID(hs.fromDownstream(e, tc.neighbour, tc.ring).e.GetFailedPeerId()); got != tc.want {
			t.Errorf("%s: hop blames %q, want %q", tc.name, got, tc.want)
		}
	}
}

// A seam and a ring that start on a relay move to the direct connection
// when the path turns direct, without losing or reordering a frame.
func TestSeamMigration(t *testing.T) {
	head, tail := startHop(t, 0, 3, nil), startHop(t, 3, 6, nil)
	o, _ := newOrigin(t, stagePlanner{[][]*fakeHop{{head}, {tail}}}, head, tail)
	head.host.relay(tail.host.ID())
	tail.host.relay(head.host.ID())
	seamPID, ringPID := head.host.ProtocolID(ProtoSession, ProtoVersion), tail.host.ProtocolID(ProtoRing, ProtoVersion)
	prompt := []int32{9, 8, 7}
	const maxTok = 60
	n := 0
	var moveErr error
	res, err := o.Generate(context.Background(), GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: prompt, MaxTokens: maxTok,
		OnToken: func(int32) bool {
			if n++; n != 10 {
				return false
			}
			head.host.punch(tail.host.ID())
			tail.host.punch(head.host.ID())
			// Both writers open a replacement stream (resume).
			deadline := time.Now().Add(10 * time.Second)
			for head.host.streamsOpened(seamPID) < 2 || tail.host.streamsOpened(ringPID) < 2 {
				if time.Now().After(deadline) {
					moveErr = errors.New("no replacement streams opened")
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
			return false
		}})
	if err != nil {
		t.Fatal(err)
	}
	if moveErr != nil {
		t.Fatal(moveErr)
	}
	if want := reference(prompt, maxTok, 0); !equal(res.Tokens, want) {
		t.Fatalf("tokens %v\nwant   %v", res.Tokens, want)
	}
	if res.Reroutes != 0 {
		t.Fatalf("the move caused a re-route: %v", res.Failures)
	}
	// The replacement seam carries the rest of the session: no deadline
	// of its opening handshake may stay on it.
	seams := tail.host.acceptedStreams(seamPID)
	if len(seams) != 2 {
		t.Fatalf("tail accepted %d session streams, want 2 (open and move)", len(seams))
	}
	for i, s := range seams {
		if dl := s.readDeadline(); !dl.IsZero() {
			t.Errorf("session stream %d on the tail keeps a read deadline (%s)", i, dl.Format(time.RFC3339Nano))
		}
	}
	waitReleased(t, head, tail)
}

// The hop never blames the origin's side for a plan the tracker could fix:
// a NoRouteError after a failure ends the generation with the layers named.
func TestNoReplacementNamesLayers(t *testing.T) {
	hops := threeHops(t)
	o, c := newOrigin(t, stagePlanner{[][]*fakeHop{{hops[0]}, {hops[1]}, {hops[2]}}}, hops...)
	hops[1].killAtStep(3, append([]*testHost{c}, hostsOf(hops...)...)...)
	_, err := o.Generate(context.Background(), GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: []int32{1}, MaxTokens: 500})
	var nr *route.NoRouteError
	if !errors.As(err, &nr) || nr.MissingStart != 2 || nr.MissingEnd != 4 {
		t.Fatalf("want a NoRouteError for layers 2-4, got %v", err)
	}
}

// A hole punch that completes between opening a seam on the relay and
// watching for path changes (its event is gone by then) still moves the
// seam.
func TestSeamMigrationAfterEarlyPunch(t *testing.T) {
	head, tail := startHop(t, 0, 3, nil), startHop(t, 3, 6, nil)
	o, _ := newOrigin(t, stagePlanner{[][]*fakeHop{{head}, {tail}}}, head, tail)
	head.host.relay(tail.host.ID())
	head.host.punchOnOpen = true
	seamPID := head.host.ProtocolID(ProtoSession, ProtoVersion)
	prompt := []int32{4, 4, 4}
	const maxTok = 30
	moved := false
	n := 0
	// The session stays open until the origin closes it: wait for the
	// move while reading tokens.
	res, err := o.Generate(context.Background(), GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: prompt, MaxTokens: maxTok,
		OnToken: func(int32) bool {
			if n++; n != 5 {
				return false
			}
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
				if moved = head.host.streamsOpened(seamPID) >= 2; moved {
					break
				}
			}
			return false
		}})
	if err != nil {
		t.Fatal(err)
	}
	if !moved {
		t.Fatal("the seam opened on the relay never moved although the path is direct")
	}
	if want := reference(prompt, maxTok, 0); !equal(res.Tokens, want) {
		t.Fatalf("tokens %v\nwant   %v", res.Tokens, want)
	}
	waitReleased(t, head, tail)
}

// The head takes the prompt from the origin and nothing after its last
// chunk: a decode step (or a further prompt chunk) from the origin fails
// the session with BAD_REQUEST instead of racing the ring's step for the
// same position (docs/locks.md: a one-hop speculative session blocked on
// its own channel for minutes).
func TestHeadRefusesOriginStepsAfterPrompt(t *testing.T) {
	for _, tc := range []struct {
		name string
		next *meshp2pb.ActivationHeader
	}{
		{"decode step", &meshp2pb.ActivationHeader{Step: 1, PosStart: 3, NRows: 1, LastChunk: true, Tokens: []int32{7}}},
		{"prompt chunk after the last", &meshp2pb.ActivationHeader{Step: 1, PosStart: 3, NRows: 1, IsPrefill: true, LastChunk: true, Tokens: []int32{7}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			whole := startHop(t, 0, fakeNLay, func(c *HopConfig) { c.MaxSessionKV, c.MaxSessionsPerPeer, c.MaxKVPerPeer = -1, -1, -1 })
			c := newTestHost(t)
			connectAll(c, whole.host)
			open := openFor(whole, 1, 64)
			open.MaxTokens = 2 // the head stops after 2 tokens and waits for the origin
			s, m := rawOpen(t, c, whole.host.ID(), open)
			if !m.GetAccept().GetOk() {
				t.Fatalf("open refused: %v", m)
			}
			w := frame.NewWriter(s, frame.Limits{})
			first := &meshp2pb.ActivationHeader{SessionId: open.GetSessionId(), Epoch: 1, PosStart: 0, NRows: 3, IsPrefill: true, LastChunk: true, Tokens: []int32{1, 2, 3}}
			if err := w.WriteStream(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Activation{Activation: first}}); err != nil {
				t.Fatal(err)
			}
			tc.next.SessionId, tc.next.Epoch = open.GetSessionId(), 1
			if err := w.WriteStream(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Activation{Activation: tc.next}}); err != nil {
				t.Fatal(err)
			}
			r := frame.NewReader(s, frame.Limits{})
			_ = s.SetReadDeadline(time.Now().Add(30 * time.Second))
			for {
				msg, _, err := r.ReadStream()
				if err != nil {
					t.Fatalf("no error from the head: %v", err)
				}
				if e := msg.GetError(); e != nil {
					if e.GetCode() != meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST || !strings.Contains(e.GetMessage(), "prompt chunks") {
						t.Fatalf("error %v, want BAD_REQUEST about prompt chunks", e)
					}
					return
				}
			}
		})
	}
}
