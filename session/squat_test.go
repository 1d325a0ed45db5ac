package session

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
)

// squatter is a hostile origin written with this package's wire types
// only: it opens sessions at a target hop that reserve a slot and KV cells
// and never sends a frame, and re-opens each the moment the hop frees it.
// As route[idx-1] of its own made-up route it can open at any position.
type squatter struct {
	id *testHost
	// keys, if any, sign the opens instead of id (free origin keys: id
	// forwards them, naming itself the previous hop); one per slot, round
	// robin.
	keys     []*testHost
	admitted atomic.Int64
	refused  sync.Map // meshp2pb.ErrorCode → *atomic.Int64
}

func (s *squatter) count(code meshp2pb.ErrorCode) int64 {
	v, _ := s.refused.LoadOrStore(code, new(atomic.Int64))
	return v.(*atomic.Int64).Load()
}

// run keeps up to slots sessions open at target (route position idx of a
// route whose other hops are the squatter itself) until ctx ends.
func (s *squatter) run(ctx context.Context, target *fakeHop, idx, slots int) {
	var wg sync.WaitGroup
	for i := range slots {
		signer := s.id
		if len(s.keys) > 0 {
			signer = s.keys[i%len(s.keys)]
		}
		wg.Go(func() {
			for ctx.Err() == nil {
				if !s.hold(ctx, target, idx, signer) {
					select { // refused: try again soon, as a squatter would
					case <-ctx.Done():
					case <-time.After(50 * time.Millisecond):
					}
				}
			}
		})
	}
	wg.Wait()
}

// hold opens one silent session and waits until the hop frees it (true),
// or reports a refusal (false).
func (s *squatter) hold(ctx context.Context, target *fakeHop, idx int, signer *testHost) bool {
	hops := []*meshp2pb.RouteHop{{PeerId: []byte(target.host.ID()), Start: uint32(target.eng.info.Start), End: uint32(target.eng.info.End)}}
	if idx == 1 {
		hops = append([]*meshp2pb.RouteHop{{PeerId: []byte(s.id.ID()), Start: 0, End: uint32(target.eng.info.Start)}}, hops...)
	}
	open := &meshp2pb.SessionOpen{SessionId: newSID(), Epoch: 1, ModelFingerprint: fakeFP, NCtxNeeded: 64, HopIndex: uint32(idx),
		Route: &meshp2pb.Route{ModelFingerprint: fakeFP, NLayer: fakeNLay, Epoch: 1, Hops: hops}}
	if err := SignOpen(open, signer.key(), time.Now()); err != nil {
		return false
	}
	st, err := s.id.NewStream(ctx, target.host.ID(), s.id.ProtocolID(ProtoSession, ProtoVersion))
	if err != nil {
		return false
	}
	defer st.Reset()
	stop := context.AfterFunc(ctx, func() { _ = st.Reset() })
	defer stop()
	if frame.NewWriter(st, frame.Limits{}).WriteStream(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Open{Open: open}}) != nil {
		return false
	}
	r := frame.NewReader(st, frame.Limits{})
	msg, _, err := r.ReadStream()
	if err != nil {
		return false
	}
	if acc := msg.GetAccept(); !acc.GetOk() {
		v, _ := s.refused.LoadOrStore(acc.GetError().GetCode(), new(atomic.Int64))
		v.(*atomic.Int64).Add(1)
		return false
	}
	s.admitted.Add(1)
	_, _, _ = r.ReadStream() // the hop's TIMEOUT report, or the end
	return true
}

// Issue 21, attacks 2 and 3: identities that hold a hop's slots with
// sessions that never send a frame, at the head or at a later position
// (where, before origin signatures, no per-origin quota applied: one
// identity took every slot). Each case measures how long an honest
// generation through that hop waits while 1 or 2 identities squat its 4
// slots (per-origin quota 2). One identity never starves it; two fill it
// for one first-frame timeout, then back off (doubling) and the honest
// client gets in. The intervals are shortened by name (FirstFrame,
// SilenceBackoff); the ratio of wait to first-frame timeout is what
// docs/limits.md reports.
func TestSquattersBackOff(t *testing.T) {
	const firstFrame = 500 * time.Millisecond
	for _, tc := range []struct {
		name       string
		idx        int // the squatted hop's position
		identities int
		keys       int  // free origin keys each identity forwards opens for (0: signs its own)
		starved    bool // every slot taken before the honest client comes
	}{
		{"head, one identity", 0, 1, 0, false},
		{"head, two identities", 0, 2, 0, true},
		{"later hop, one identity", 1, 1, 0, false},
		{"later hop, two identities", 1, 2, 0, true},
		// Issue 37, row 4: one host naming itself the previous hop of
		// opens signed by two free keys held all 4 slots, backed off
		// never (the sender is not the origin): the honest client was
		// refused for its whole capacity wait.
		{"later hop, one host forwarding for two free keys", 1, 1, 2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tweak := func(c *HopConfig) { c.FirstFrame, c.SilenceBackoff = firstFrame, firstFrame }
			var target *fakeHop
			var stages [][]*fakeHop
			var all []*fakeHop
			if tc.idx == 0 {
				target = startHop(t, 0, 6, tweak)
				stages, all = [][]*fakeHop{{target}}, []*fakeHop{target}
			} else {
				head := startHop(t, 0, 2, nil)
				target = startHop(t, 2, 6, tweak)
				stages, all = [][]*fakeHop{{head}, {target}}, []*fakeHop{head, target}
			}
			o, c := newOrigin(t, stagePlanner{stages}, all...)
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			var sq []*squatter
			for range tc.identities {
				s := &squatter{id: newTestHost(t)}
				for range tc.keys {
					s.keys = append(s.keys, newTestHost(t))
				}
				connectAll(append([]*testHost{s.id, c}, hostsOf(all...)...)...)
				acceptRing(s.id) // a squatter at the tail's position heads its own route
				sq = append(sq, s)
				wg.Go(func() { s.run(ctx, target, tc.idx, 4) })
			}
			defer func() {
				cancel()
				wg.Wait()
				waitReleased(t, all...)
			}()
			// Let the squatters take what they can.
			deadline := time.Now().Add(hangGuard)
			want := min(4, 2*tc.identities) // per-origin and per-forwarder quota 2
			for target.eng.open() < want && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			got := target.eng.open()
			if tc.keys > 0 { // the most held while every key keeps trying, over a full first-frame wait
				for end := time.Now().Add(target.svc.firstFrame(tc.idx) + firstFrame); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
					got = max(got, target.eng.open())
				}
			}
			if got != want {
				t.Fatalf("%d identities (forwarding for %d keys) hold %d of 4 slots, want %d (quota 2 per origin and per upstream peer at every position)", tc.identities, tc.keys, got, want)
			}
			t0 := time.Now()
			res, err := o.Generate(context.Background(), GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: []int32{3, 1, 4}, MaxTokens: 8})
			wait := time.Since(t0)
			if err != nil {
				t.Fatalf("honest generation failed while %d identities squat: %v", tc.identities, err)
			}
			if want := reference([]int32{3, 1, 4}, 8, 0); !equal(res.Tokens, want) {
				t.Fatalf("tokens %v, want %v", res.Tokens, want)
			}
			var silenced int64
			for _, s := range sq {
				silenced += s.count(meshp2pb.ErrorCode_ERROR_CODE_NO_CAPACITY)
			}
			t.Logf("%d identities at position %d: honest generation waited %s (%.1f× the hop's first-frame timeout %s), %d capacity retries; squatters admitted %d times, refused %d times",
				tc.identities, tc.idx, wait.Round(time.Millisecond), float64(wait)/float64(target.svc.firstFrame(tc.idx)), target.svc.firstFrame(tc.idx),
				res.CapacityRetries, sq[0].admitted.Load(), silenced)
			if !tc.starved && res.CapacityRetries != 0 {
				t.Fatalf("one identity within its quota made the honest client retry %d times", res.CapacityRetries)
			}
			if tc.starved && res.CapacityRetries == 0 {
				t.Fatalf("the squatters held every slot, yet the honest client got in at once")
			}
		})
	}
}

// An origin whose sessions time out silently is refused with a growing
// backoff; one that sends frames takes a strike back. The unit under the
// squat test.
func TestSilenceMemoryBacksOff(t *testing.T) {
	now := time.Unix(1e9, 0)
	m := newSilenceMemory(time.Second, 8*time.Second, 2, func() time.Time { return now })
	a, b, c := peer.ID("a"), peer.ID("b"), peer.ID("c")
	for i, want := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 8 * time.Second} {
		if got := m.strike(a); got != want {
			t.Fatalf("strike %d: backoff %s, want %s", i+1, got, want)
		}
	}
	if got := m.blocked(a); got != 8*time.Second {
		t.Fatalf("blocked %s, want 8s", got)
	}
	now = now.Add(8 * time.Second)
	if got := m.blocked(a); got != 0 {
		t.Fatalf("still blocked %s after the backoff", got)
	}
	m.heard(a)
	if got := m.strike(a); got != 8*time.Second {
		t.Fatalf("after one good session the next strike backs off %s, want 8s (one doubling back)", got)
	}
	// Many good sessions during a backoff never take the count below
	// zero (a negative shift would panic the hop).
	for range 10 {
		m.heard(b)
		m.heard(a)
	}
	if got := m.strike(a); got != time.Second {
		t.Fatalf("after many good sessions the next strike backs off %s, want 1s", got)
	}
	now = now.Add(time.Second)
	m.strike(a)
	m.heard(a)
	if got := m.strike(a); got != 2*time.Second {
		t.Fatalf("after one good session the next strike backs off %s, want 8s (one doubling back)", got)
	}
	now = now.Add(30 * time.Second) // clean for more than max: forgotten
	if got := m.strike(a); got != time.Second {
		t.Fatalf("after a clean spell the backoff restarts at %s, want 1s", got)
	}
	m.strike(b)
	m.strike(c) // the memory holds 2: the entry whose refusal ends first goes
	if len(m.m) != 2 || m.blocked(c) == 0 {
		t.Fatalf("bounded memory: %d entries, c blocked %s", len(m.m), m.blocked(c))
	}
}

// Origin authentication: what a hop refuses before it reserves anything.
func TestOpenOriginAuth(t *testing.T) {
	whole := startHop(t, 0, 6, nil)
	c, stranger := newTestHost(t), newTestHost(t)
	connectAll(c, stranger, whole.host)
	sign := func(o *meshp2pb.SessionOpen, at time.Time) *meshp2pb.SessionOpen {
		if err := SignOpen(o, c.key(), at); err != nil {
			t.Fatal(err)
		}
		return o
	}
	replayed := sign(openFor(whole, 1, 64), time.Now())
	if _, m := rawOpen(t, c, whole.host.ID(), replayed); !m.GetAccept().GetOk() {
		t.Fatalf("signed open refused: %v", m)
	}
	for _, tc := range []struct {
		name string
		from *testHost
		open func() *meshp2pb.SessionOpen
	}{
		{"garbage signature", c, func() *meshp2pb.SessionOpen {
			o := openFor(whole, 1, 64)
			o.OriginPeerId, o.OriginSignature = []byte(c.ID()), []byte{1}
			return o
		}},
		{"route changed after signing", c, func() *meshp2pb.SessionOpen {
			o := sign(openFor(whole, 1, 64), time.Now())
			o.NCtxNeeded = 512
			return o
		}},
		{"head: sent by another peer than its origin", stranger, func() *meshp2pb.SessionOpen { return sign(openFor(whole, 1, 64), time.Now()) }},
		{"too old", c, func() *meshp2pb.SessionOpen {
			return sign(openFor(whole, 1, 64), time.Now().Add(-OpenMaxAge-route.DefaultClockSkew-time.Second))
		}},
		{"from the future", c, func() *meshp2pb.SessionOpen {
			return sign(openFor(whole, 1, 64), time.Now().Add(route.DefaultClockSkew+time.Minute))
		}},
		{"replayed", c, func() *meshp2pb.SessionOpen { return replayed }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, m := rawOpen(t, tc.from, whole.host.ID(), tc.open())
			if e := m.GetAccept().GetError(); m.GetAccept().GetOk() || e.GetCode() != meshp2pb.ErrorCode_ERROR_CODE_ORIGIN_UNAUTHENTICATED || len(e.GetFailedPeerId()) != 0 {
				t.Fatalf("want ORIGIN_UNAUTHENTICATED blaming nobody, got %v", m)
			}
			t.Log(m.GetAccept().GetError().GetMessage())
		})
	}
}

// Issue 37, row 2: grammar time is budgeted per origin over time, not
// only per session: an origin whose sessions spent its budget on this
// tail is refused new sessions with a grammar (NO_CAPACITY with the time
// until it refills), while its sessions without one and another origin's
// with one are admitted.
func TestGrammarBudgetPerOrigin(t *testing.T) {
	tail := startHop(t, 0, 6, nil)
	tail.eng.grammarTime = 4 * time.Second // each session with a grammar reports this much
	o, c := newOrigin(t, stagePlanner{[][]*fakeHop{{tail}}}, tail)
	grammar := &meshp2pb.SamplingParams{Grammar: `root ::= "a"+`}
	for i := range 3 { // 12 s charged: over the 10 s budget after the third
		if _, err := o.Generate(context.Background(), GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: []int32{1, 2}, MaxTokens: 4, Sampling: grammar}); err != nil {
			t.Fatalf("session %d with a grammar: %v", i, err)
		}
	}
	waitReleased(t, tail)
	open := func(sp *meshp2pb.SamplingParams) *meshp2pb.SessionOpen {
		return &meshp2pb.SessionOpen{SessionId: newSID(), Epoch: 1, ModelFingerprint: fakeFP, NCtxNeeded: 16, Sampling: sp,
			Route: &meshp2pb.Route{ModelFingerprint: fakeFP, NLayer: fakeNLay, Epoch: 1, Hops: []*meshp2pb.RouteHop{
				{PeerId: []byte(tail.host.ID()), Start: 0, End: 6}}}}
	}
	_, m := rawOpen(t, c, tail.host.ID(), open(grammar))
	if a := m.GetAccept(); a.GetOk() || a.GetError().GetCode() != meshp2pb.ErrorCode_ERROR_CODE_NO_CAPACITY ||
		!strings.Contains(a.GetError().GetMessage(), "grammar time") || a.GetError().GetRetryAfterMs() == 0 {
		t.Fatalf("an origin over its grammar budget: %v, want NO_CAPACITY with a retry hint", m)
	}
	t.Logf("refused: %s", m.GetAccept().GetError().GetMessage())
	if _, m := rawOpen(t, c, tail.host.ID(), open(nil)); !m.GetAccept().GetOk() {
		t.Fatalf("the same origin without a grammar: %v", m)
	}
	other := newTestHost(t)
	connectAll(other, tail.host)
	acceptRing(other)
	if _, m := rawOpen(t, other, tail.host.ID(), open(grammar)); !m.GetAccept().GetOk() {
		t.Fatalf("another origin with a grammar: %v", m)
	}
}
