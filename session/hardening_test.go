package session

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// hangGuard bounds reads that must be answered by the hop's logic, not by
// a timeout: it only keeps a broken build from hanging the test.
const hangGuard = 15 * time.Second

// readReply reads one message from s (a failing test, not a hang, if none
// comes).
func readReply(t *testing.T, s network.Stream) *meshp2pb.StreamMessage {
	t.Helper()
	_ = s.SetReadDeadline(time.Now().Add(hangGuard))
	msg, _, err := frame.NewReader(s, frame.Limits{}).ReadStream()
	if err != nil {
		t.Fatalf("no reply: %v", err)
	}
	return msg
}

// ended reports whether the session with key on h has ended (or is gone).
func ended(h *fakeHop, key Key) bool {
	hs := h.svc.lookup(key)
	if hs == nil {
		return true
	}
	select {
	case <-hs.done:
		return true
	default:
		return false
	}
}

// acceptRing makes c accept ring streams (it plays the head of a route
// whose tail is a real hop) and read them until they end.
func acceptRing(c *testHost) {
	c.Host.SetStreamHandler(c.ProtocolID(ProtoRing, ProtoVersion), func(s network.Stream) {
		r := frame.NewReader(s, frame.Limits{})
		for {
			if _, _, err := r.ReadStream(); err != nil {
				return
			}
		}
	})
}

// Item 3 (and issue 21, attack 4): a SessionOpen that reuses a live
// session's id with a newer epoch ends the live epoch only when the same
// origin signed it — whoever forwards it. A stranger who learnt the id
// opens a session of its own; one that copies the origin's id but cannot
// sign for it is refused.
func TestSupersedeOnlyBySameOrigin(t *testing.T) {
	whole := startHop(t, 0, 6, nil)
	tail := startHop(t, 2, 6, nil)
	c, stranger := newTestHost(t), newTestHost(t)
	connectAll(c, stranger, whole.host, tail.host)
	acceptRing(c)
	acceptRing(stranger)
	// tailOpen is a route [prev 0-2, tail 2-6] arriving at the tail.
	tailOpen := func(prev *testHost, sid []byte, epoch uint64) *meshp2pb.SessionOpen {
		return &meshp2pb.SessionOpen{SessionId: sid, Epoch: epoch, ModelFingerprint: fakeFP, NCtxNeeded: 64, HopIndex: 1,
			Route: &meshp2pb.Route{ModelFingerprint: fakeFP, NLayer: fakeNLay, Epoch: epoch, Hops: []*meshp2pb.RouteHop{
				{PeerId: []byte(prev.ID()), Start: 0, End: 2}, {PeerId: []byte(tail.host.ID()), Start: 2, End: 6}}}}
	}
	headOpen := func(sid []byte, e uint64) *meshp2pb.SessionOpen {
		o := openFor(whole, e, 64)
		o.SessionId = sid
		return o
	}
	// forged claims c's origin with the sender's own signature.
	forged := func(from *testHost, o *meshp2pb.SessionOpen) *meshp2pb.SessionOpen {
		signedBy(t, from, o)
		o.OriginPeerId = []byte(c.ID())
		return o
	}
	const anyCode = meshp2pb.ErrorCode(-1)
	for _, tc := range []struct {
		name      string
		hop       *fakeHop
		live      func(sid []byte) *meshp2pb.SessionOpen
		from      *testHost
		reopen    func(sid []byte, epoch uint64) *meshp2pb.SessionOpen
		epoch     uint64
		supersede bool
		code      meshp2pb.ErrorCode // of the reply to the re-open (anyCode: not checked)
	}{
		{"head: stranger", whole, func(sid []byte) *meshp2pb.SessionOpen { return headOpen(sid, 1) }, stranger,
			headOpen, math.MaxUint64, false, anyCode},
		{"head: same origin", whole, func(sid []byte) *meshp2pb.SessionOpen { return headOpen(sid, 1) }, c,
			headOpen, 2, true, anyCode},
		{"head: stranger forges the origin", whole, func(sid []byte) *meshp2pb.SessionOpen { return headOpen(sid, 1) }, stranger,
			func(sid []byte, e uint64) *meshp2pb.SessionOpen { return forged(stranger, headOpen(sid, e)) }, 2, false,
			meshp2pb.ErrorCode_ERROR_CODE_ORIGIN_UNAUTHENTICATED},
		{"later hop: stranger names itself the previous hop", tail, func(sid []byte) *meshp2pb.SessionOpen { return tailOpen(c, sid, 1) }, stranger,
			func(sid []byte, e uint64) *meshp2pb.SessionOpen { return tailOpen(stranger, sid, e) }, math.MaxUint64, false, anyCode},
		{"later hop: stranger forges the origin", tail, func(sid []byte) *meshp2pb.SessionOpen { return tailOpen(c, sid, 1) }, stranger,
			func(sid []byte, e uint64) *meshp2pb.SessionOpen { return forged(stranger, tailOpen(stranger, sid, e)) }, 2, false,
			meshp2pb.ErrorCode_ERROR_CODE_ORIGIN_UNAUTHENTICATED},
		{"later hop: the live epoch's previous hop", tail, func(sid []byte) *meshp2pb.SessionOpen { return tailOpen(c, sid, 1) }, c,
			func(sid []byte, e uint64) *meshp2pb.SessionOpen { return tailOpen(c, sid, e) }, 2, true, anyCode},
		{"later hop: a new previous hop carries the origin's epoch", tail, func(sid []byte) *meshp2pb.SessionOpen { return tailOpen(c, sid, 1) }, stranger,
			func(sid []byte, e uint64) *meshp2pb.SessionOpen { return signedBy(t, c, tailOpen(stranger, sid, e)) }, 2, true, anyCode},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The previous case's streams were reset at its end; the hops
			// release those sessions asynchronously, and until then they
			// count against c's quota (2 sessions here).
			waitReleased(t, whole, tail)
			sid := newSID()
			if _, m := rawOpen(t, c, tc.hop.host.ID(), tc.live(sid)); !m.GetAccept().GetOk() {
				t.Fatalf("live epoch refused: %v", m)
			}
			live := keyFor(c, sid, 1)
			_, m := rawOpen(t, tc.from, tc.hop.host.ID(), tc.reopen(sid, tc.epoch))
			if got := ended(tc.hop, live); got != tc.supersede {
				t.Fatalf("live epoch ended: %v, want %v (reply to the re-open: %v)", got, tc.supersede, m)
			}
			if tc.code != anyCode && m.GetAccept().GetError().GetCode() != tc.code {
				t.Fatalf("reply to the re-open: %v, want %s", m, tc.code)
			}
		})
	}
}

// keyFor is the key of origin c's session sid at epoch on a hop.
func keyFor(c *testHost, sid []byte, epoch uint64) Key {
	k := Key{Origin: c.ID(), Epoch: epoch}
	copy(k.ID[:], sid)
	return k
}

// Issue 21, attack 4: a peer once on a session's route knows its id. It
// opens a newer epoch of that id at an honest upstream hop, which admits
// it as the stranger's own session and forwards it: before origin
// signatures the downstream hop took the honest upstream for the
// session's and ended the live epoch, and the origin's own next epoch then
// collided with the stranger's. Now neither happens.
func TestHijackThroughHonestHop(t *testing.T) {
	up, down := startHop(t, 0, 2, nil), startHop(t, 2, 6, nil)
	c, thief := newTestHost(t), newTestHost(t)
	connectAll(c, thief, up.host, down.host)
	routeOf := func(sid []byte, e uint64) *meshp2pb.SessionOpen {
		return &meshp2pb.SessionOpen{SessionId: sid, Epoch: e, ModelFingerprint: fakeFP, NCtxNeeded: 64,
			Route: &meshp2pb.Route{ModelFingerprint: fakeFP, NLayer: fakeNLay, Epoch: e, Hops: []*meshp2pb.RouteHop{
				{PeerId: []byte(up.host.ID()), Start: 0, End: 2}, {PeerId: []byte(down.host.ID()), Start: 2, End: 6}}}}
	}
	sid := newSID()
	if _, m := rawOpen(t, c, up.host.ID(), routeOf(sid, 1)); !m.GetAccept().GetOk() {
		t.Fatalf("honest session refused: %v", m)
	}
	live := keyFor(c, sid, 1)
	_, m := rawOpen(t, thief, up.host.ID(), routeOf(sid, 2))
	if !m.GetAccept().GetOk() {
		t.Fatalf("the thief's open is an ordinary session of its own and should be admitted: %v", m)
	}
	for _, h := range []*fakeHop{up, down} {
		if ended(h, live) {
			t.Fatalf("the thief's epoch 2 ended the honest epoch 1 at %s", h.host.ID())
		}
	}
	// The origin's own re-route to epoch 2 does not collide with the
	// thief's epoch 2, and does end its epoch 1.
	if _, m := rawOpen(t, c, up.host.ID(), routeOf(sid, 2)); !m.GetAccept().GetOk() {
		t.Fatalf("the origin's own epoch 2 refused: %v", m)
	}
	for _, h := range []*fakeHop{up, down} {
		if !ended(h, live) {
			t.Fatalf("the origin's epoch 2 did not supersede its epoch 1 at %s", h.host.ID())
		}
	}
}

// Item 14: a re-routed epoch refused for capacity at a hop that still holds
// the dead epoch's cells must not get that hop excluded: capacity is not a
// failure. The head's engine frees the dead epoch's cells only after it
// refused the new one (a loaded engine, deterministically).
func TestCapacityRefusalIsNotBlame(t *testing.T) {
	head := startHop(t, 0, 2, func(c *HopConfig) { c.OpenTimeout = 2 * time.Second })
	mid, spare, tail := startHop(t, 2, 4, nil), startHop(t, 2, 4, nil), startHop(t, 4, 6, nil)
	prompt := []int32{3, 1, 4, 1, 5}
	const maxTok = 40
	head.eng.mu.Lock()
	head.eng.nCtx = len(prompt) + maxTok + 1 + 16 // one session, not two
	head.eng.onClose = func(k Key) {
		if k.Epoch == 1 {
			select { // bounded: a failed run must not hang its cleanup
			case <-head.eng.refused:
			case <-time.After(10 * time.Second):
			}
		}
	}
	head.eng.mu.Unlock()
	all := []*fakeHop{head, mid, spare, tail}
	o, c := newOrigin(t, stagePlanner{[][]*fakeHop{{head}, {mid, spare}, {tail}}}, all...)
	mid.killAtStep(5, append([]*testHost{c}, hostsOf(all...)...)...)
	res, err := o.Generate(context.Background(), GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: prompt, MaxTokens: maxTok})
	if err != nil {
		t.Fatalf("%v (failures %v)", err, res.Failures)
	}
	if want := reference(prompt, maxTok, 0); !equal(res.Tokens, want) {
		t.Fatalf("tokens %v\nwant   %v", res.Tokens, want)
	}
	if res.Reroutes != 1 || res.Route.Hops[0].Peer != head.host.ID() || res.Route.Hops[1].Peer != spare.host.ID() {
		t.Fatalf("reroutes %d, route %v, failures %v", res.Reroutes, res.Route.Hops, res.Failures)
	}
	select {
	case <-head.eng.refused:
	default:
		t.Fatal("the head never refused for capacity: the test did not reproduce the refusal")
	}
	waitReleased(t, head, spare, tail)
}

// Item 4: admission caps what one open may reserve: a session's KV cells
// (half the shard's by default), and at the head the sessions and cells
// of one origin peer (half the slots and cells by default).
func TestAdmissionQuotas(t *testing.T) {
	whole := startHop(t, 0, 6, nil) // 4 slots, 1024 cells
	c, other := newTestHost(t), newTestHost(t)
	connectAll(c, other, whole.host)
	for _, tc := range []struct {
		name   string
		opens  []uint32 // KV cells of the opens c sends first (all admitted)
		from   *testHost
		kv     uint32
		ok     bool
		code   meshp2pb.ErrorCode
		failed peer.ID
	}{
		{"one session over half the cells", nil, c, 600, false, meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, ""},
		{"half the cells", nil, c, 512, true, 0, ""},
		{"third session of one origin", []uint32{8, 8}, c, 8, false, meshp2pb.ErrorCode_ERROR_CODE_NO_CAPACITY, whole.host.ID()},
		{"another origin still admitted", []uint32{8, 8}, other, 8, true, 0, ""},
		{"cells of one origin over half", []uint32{300}, c, 300, false, meshp2pb.ErrorCode_ERROR_CODE_NO_CAPACITY, whole.host.ID()},
		{"cells of another origin", []uint32{300}, other, 300, true, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var held []network.Stream
			defer func() {
				for _, s := range held {
					_ = s.Reset()
				}
				waitReleased(t, whole)
			}()
			for _, kv := range tc.opens {
				s, m := rawOpen(t, c, whole.host.ID(), openFor(whole, 1, kv))
				if !m.GetAccept().GetOk() {
					t.Fatalf("setup open of %d cells refused: %v", kv, m)
				}
				held = append(held, s)
			}
			s, m := rawOpen(t, tc.from, whole.host.ID(), openFor(whole, 1, tc.kv))
			held = append(held, s)
			acc := m.GetAccept()
			if acc.GetOk() != tc.ok {
				t.Fatalf("admitted %v, want %v: %v", acc.GetOk(), tc.ok, m)
			}
			if !tc.ok && (acc.GetError().GetCode() != tc.code || peer.ID(acc.GetError().GetFailedPeerId()) != tc.failed) {
				t.Fatalf("refusal %v, want %s blaming %q", acc.GetError(), tc.code, tc.failed)
			}
		})
	}
}

// A trusted origin (an API gateway carrying many users) is not held to
// the per-origin quota, only to the shard's own slots; other origins are.
func TestTrustedOriginSkipsQuota(t *testing.T) {
	gw, other := newTestHost(t), newTestHost(t)
	whole := startHop(t, 0, 6, func(c *HopConfig) { c.TrustedOrigins = map[peer.ID]bool{gw.ID(): true} }) // 4 slots
	connectAll(gw, other, whole.host)
	var held []network.Stream
	defer func() {
		for _, s := range held {
			_ = s.Reset()
		}
		waitReleased(t, whole)
	}()
	for i := range 3 { // the quota would stop an origin at 2
		s, m := rawOpen(t, gw, whole.host.ID(), openFor(whole, 1, 8))
		held = append(held, s)
		if !m.GetAccept().GetOk() {
			t.Fatalf("trusted origin's session %d refused: %v", i+1, m)
		}
	}
	s, m := rawOpen(t, other, whole.host.ID(), openFor(whole, 1, 8))
	held = append(held, s)
	if !m.GetAccept().GetOk() {
		t.Fatalf("the last slot refused to another origin: %v", m)
	}
	s, m = rawOpen(t, gw, whole.host.ID(), openFor(whole, 1, 8))
	held = append(held, s)
	if m.GetAccept().GetOk() || m.GetAccept().GetError().GetCode() != meshp2pb.ErrorCode_ERROR_CODE_NO_CAPACITY {
		t.Fatalf("a fifth session on 4 slots: %v", m)
	}
}

// Item 4: an admitted session that never sends a frame is freed after
// FirstFrame, long before the idle timeout, with a TIMEOUT report.
func TestFirstFrameTimeout(t *testing.T) {
	whole := startHop(t, 0, 6, func(c *HopConfig) { c.Idle = time.Hour; c.FirstFrame = 100 * time.Millisecond })
	c := newTestHost(t)
	connectAll(c, whole.host)
	s, m := rawOpen(t, c, whole.host.ID(), openFor(whole, 1, 64))
	if !m.GetAccept().GetOk() {
		t.Fatal(m)
	}
	if m := readReply(t, s); m.GetError().GetCode() != meshp2pb.ErrorCode_ERROR_CODE_TIMEOUT {
		t.Fatalf("want TIMEOUT, got %v", m)
	}
	waitReleased(t, whole)
}

// evilTail makes f's host play the tail of a route (it serves nothing):
// it admits the open, closes the ring to the head, and when the first
// activation arrives sends report on the ring.
func evilTail(t *testing.T, f *testHost, report *meshp2pb.Error) {
	f.Host.SetStreamHandler(f.ProtocolID(ProtoSession, ProtoVersion), func(s network.Stream) {
		r, w := frame.NewReader(s, frame.Limits{}), frame.NewWriter(s, frame.Limits{})
		msg, _, err := r.ReadStream()
		if err != nil || msg.GetOpen() == nil {
			_ = s.Reset()
			return
		}
		open := msg.GetOpen()
		head := peer.ID(open.GetRoute().GetHops()[0].GetPeerId())
		rs, err := f.NewStream(context.Background(), head, f.ProtocolID(ProtoRing, ProtoVersion))
		if err != nil {
			_ = s.Reset()
			return
		}
		rw := frame.NewWriter(rs, frame.Limits{})
		if rw.WriteStream(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Open{Open: open}}) != nil ||
			w.WriteStream(acceptance(open)) != nil {
			_ = s.Reset()
			return
		}
		if _, _, err := r.ReadStream(); err != nil {
			return
		}
		e := proto.Clone(report).(*meshp2pb.Error)
		e.PeerId = []byte(f.ID())
		_ = rw.WriteStream(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Error{Error: e}})
		_, _, _ = r.ReadStream() // hold the seam until the session ends
	})
}

// Item 7: a tail can only blame what it sees (itself and the hop before
// it). Its ring report blaming an honest hop further up, or blaming nobody,
// ends up blaming the tail.
func TestRingBlameOnlyNeighbours(t *testing.T) {
	for _, tc := range []struct {
		name  string
		blame func(m1, m2 peer.ID) peer.ID
		want  func(m2, tail peer.ID) peer.ID
	}{
		{"blames a hop it does not see", func(m1, _ peer.ID) peer.ID { return m1 }, func(_, tail peer.ID) peer.ID { return tail }},
		{"blames nobody", func(peer.ID, peer.ID) peer.ID { return "" }, func(_, tail peer.ID) peer.ID { return tail }},
		{"blames its upstream neighbour", func(_, m2 peer.ID) peer.ID { return m2 }, func(m2, _ peer.ID) peer.ID { return m2 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			head, m1, m2 := startHop(t, 0, 2, nil), startHop(t, 2, 3, nil), startHop(t, 3, 4, nil)
			evil := &fakeHop{host: newTestHost(t), eng: newFakeEngine(4, 6)}
			e := &meshp2pb.Error{Code: meshp2pb.ErrorCode_ERROR_CODE_NEXT_HOP_UNREACHABLE, Message: "framed"}
			if b := tc.blame(m1.host.ID(), m2.host.ID()); b != "" {
				e.FailedPeerId = []byte(b)
			}
			evilTail(t, evil.host, e)
			o, _ := newOrigin(t, stagePlanner{[][]*fakeHop{{head}, {m1}, {m2}, {evil}}}, head, m1, m2, evil)
			o.MaxReroutes = -1
			_, err := o.Generate(context.Background(), GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: []int32{1, 2}, MaxTokens: 10})
			var re *frame.RemoteError
			if want := tc.want(m2.host.ID(), evil.host.ID()); !errors.As(err, &re) || peer.ID(re.E.GetFailedPeerId()) != want {
				t.Fatalf("want a report blaming %s, got %v (blaming %q; hops %s %s %s %s)", want, err, failedOf(re),
					head.host.ID(), m1.host.ID(), m2.host.ID(), evil.host.ID())
			}
		})
	}
}

func failedOf(re *frame.RemoteError) peer.ID {
	if re == nil || re.E == nil {
		return ""
	}
	return peer.ID(re.E.GetFailedPeerId())
}

// Item 7: hostile frames from the previous hop (bad activations, an
// Error that blames someone else) are blamed on the previous hop.
func TestBadUpstreamFramesBlameTheSender(t *testing.T) {
	tail := startHop(t, 2, 6, nil)
	c, stranger := newTestHost(t), newTestHost(t)
	connectAll(c, stranger, tail.host)
	acceptRing(c)
	rows := func(layers float32) []float32 { return []float32{5, 0, layers, 0} }
	for _, tc := range []struct {
		name string
		send func(w *frame.Writer, sid []byte) error
	}{
		{"wrong tensor shape", func(w *frame.Writer, sid []byte) error {
			return w.WriteActivation(activation(sid, []int64{1, 3}), frame.F32Bytes(rows(2)[:3]))
		}},
		{"rows the engine rejects", func(w *frame.Writer, sid []byte) error {
			return w.WriteActivation(activation(sid, []int64{1, fakeEmbd}), frame.F32Bytes(rows(4)))
		}},
		{"a message that does not belong on the seam", func(w *frame.Writer, sid []byte) error {
			return w.WriteStream(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Token{Token: &meshp2pb.TokenFrame{SessionId: sid, Epoch: 1}}})
		}},
		{"an error blaming a stranger", func(w *frame.Writer, sid []byte) error {
			return w.WriteStream(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Error{Error: &meshp2pb.Error{
				Code: meshp2pb.ErrorCode_ERROR_CODE_NEXT_HOP_UNREACHABLE, FailedPeerId: []byte(stranger.ID())}}})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sid := newSID()
			open := &meshp2pb.SessionOpen{SessionId: sid, Epoch: 1, ModelFingerprint: fakeFP, NCtxNeeded: 64, HopIndex: 1,
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
			if m.GetError() == nil || peer.ID(m.GetError().GetFailedPeerId()) != c.ID() {
				t.Fatalf("want an error blaming the sender %s, got %v", c.ID(), m)
			}
			waitReleased(t, tail)
		})
	}
}

// activation is a one-row activation header carrying hidden states.
func activation(sid []byte, shape []int64) *meshp2pb.ActivationHeader {
	return &meshp2pb.ActivationHeader{SessionId: sid, Epoch: 1, NRows: 1, IsPrefill: true, LastChunk: true,
		Tensors: []*meshp2pb.TensorInfo{{Name: BundleTensor, Dtype: meshp2pb.DType_DTYPE_F32, Shape: shape}}}
}

// Item 10: the first frame of a session or ring stream may not carry a
// payload; the hop refuses it from the prefix, without reading (or
// discarding) the declared bytes.
func TestFirstFrameHasNoPayload(t *testing.T) {
	whole := startHop(t, 0, 6, nil)
	c := newTestHost(t)
	connectAll(c, whole.host)
	const declared = 8 << 20
	prefix := func() []byte {
		var p [frame.PrefixSize]byte
		binary.BigEndian.PutUint32(p[0:4], 0) // an empty StreamMessage
		binary.BigEndian.PutUint32(p[4:8], declared)
		return p[:]
	}
	t.Run("session", func(t *testing.T) {
		s, err := c.NewStream(context.Background(), whole.host.ID(), c.ProtocolID(ProtoSession, ProtoVersion))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Reset()
		if _, err := s.Write(prefix()); err != nil {
			t.Fatal(err)
		}
		_ = s.CloseWrite() // a hop reading the payload sees it truncated
		if m := readReply(t, s); m.GetError().GetCode() != meshp2pb.ErrorCode_ERROR_CODE_FRAME_TOO_LARGE {
			t.Fatalf("want FRAME_TOO_LARGE from the prefix, got %v", m)
		}
	})
	t.Run("ring", func(t *testing.T) {
		s, err := c.NewStream(context.Background(), whole.host.ID(), c.ProtocolID(ProtoRing, ProtoVersion))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Reset()
		_ = s.SetWriteDeadline(time.Now().Add(hangGuard))
		_, err = s.Write(append(prefix(), make([]byte, declared)...))
		if err == nil {
			t.Fatal("the head read the whole declared payload of a ring hello")
		}
	})
}
