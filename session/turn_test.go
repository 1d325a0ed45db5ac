package session

import (
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"

	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// Turns are written in the order they were taken, whatever order their
// writers get to it; a turn with nothing to write takes no place; the
// session ending frees a waiter.
func TestTurnOrder(t *testing.T) {
	var last chan struct{}
	var mu sync.Mutex
	var got []int
	turns := make([]*turn, 4)
	for i := range turns {
		turns[i] = &turn{}
		if i != 2 { // turn 2 writes nothing
			_ = turns[i].add(func() error { mu.Lock(); got = append(got, i); mu.Unlock(); return nil })
		}
		turns[i].take(&last)
	}
	if turns[2].mine != nil {
		t.Fatal("a turn with nothing to write took a place")
	}
	var wg sync.WaitGroup
	for i := len(turns) - 1; i >= 0; i-- { // the last taken starts first
		wg.Add(1)
		go func() { defer wg.Done(); _ = turns[i].write(nil) }()
		time.Sleep(5 * time.Millisecond)
	}
	wg.Wait()
	if len(got) != 3 || got[0] != 0 || got[1] != 1 || got[2] != 3 {
		t.Fatalf("written in order %v, want [0 1 3]", got)
	}

	// A nil turn writes at once.
	ran := false
	if err := (*turn)(nil).add(func() error { ran = true; return nil }); err != nil || !ran {
		t.Fatalf("a nil turn did not write at once: %v %v", ran, err)
	}

	// A waiter behind a turn that never writes is freed by done.
	last = nil
	stuck, waiter := &turn{}, &turn{}
	_ = stuck.add(func() error { return nil })
	_ = waiter.add(func() error { t.Error("wrote before the turn before it"); return nil })
	stuck.take(&last)
	waiter.take(&last)
	done := make(chan struct{})
	close(done)
	if err := waiter.write(done); !errors.Is(err, errTurnAbandoned) {
		t.Fatalf("waiter: %v, want errTurnAbandoned", err)
	}
}

// stallStream is a stream this host opened whose writes block once it is
// armed, as on a peer that stopped reading: until release, the write
// deadline, or Reset/Close.
type stallStream struct {
	network.Stream
	armed   atomic.Bool
	blocked chan struct{} // closed when a write first blocks
	release chan struct{}
	ended   chan struct{}
	once    sync.Once
	endOnce sync.Once
	mu      sync.Mutex
	wdl     time.Time
}

func newStallStream(s network.Stream) *stallStream {
	return &stallStream{Stream: s, blocked: make(chan struct{}), release: make(chan struct{}), ended: make(chan struct{})}
}

func (s *stallStream) SetWriteDeadline(t time.Time) error {
	s.mu.Lock()
	s.wdl = t
	s.mu.Unlock()
	return s.Stream.SetWriteDeadline(t)
}

func (s *stallStream) Write(p []byte) (int, error) {
	if s.armed.Load() {
		s.once.Do(func() { close(s.blocked) })
		s.mu.Lock()
		dl := s.wdl
		s.mu.Unlock()
		var expired <-chan time.Time
		if !dl.IsZero() {
			tm := time.NewTimer(time.Until(dl))
			defer tm.Stop()
			expired = tm.C
		}
		select {
		case <-s.release:
		case <-expired:
			return 0, os.ErrDeadlineExceeded
		case <-s.ended:
			return 0, network.ErrReset
		}
	}
	return s.Stream.Write(p)
}

func (s *stallStream) end() { s.endOnce.Do(func() { close(s.ended) }) }

func (s *stallStream) Reset() error { s.end(); return s.Stream.Reset() }
func (s *stallStream) Close() error { s.end(); return s.Stream.Close() }

// Issue 38 item 5: the head of a session with transcripts holds trMu for
// ordering and CPU work only, never across a write on the down seam.
// While its write of a decode step to hop 1 is blocked (hop 1 stopped
// reading), trMu is free, and the origin's SessionClose is acted on at
// once: the head marks the session closing and signs its final statement
// (it used to wait for the write's deadline, Idle/2, to get trMu). When
// hop 1 reads again, it gets the step, then the final statement, then the
// close: its checker accepts the statement, and the session ends clean.
func TestHeadWritesDownOutsideTrMu(t *testing.T) {
	noQuota := func(c *HopConfig) { c.MaxSessionKV, c.MaxSessionsPerPeer, c.MaxKVPerPeer = -1, -1, -1 }
	hh := newTestHost(t)
	stalls := make(chan *stallStream, 1)
	hh.wrapOut = func(s network.Stream) network.Stream {
		if s.Protocol() != hh.ProtocolID(ProtoSession, ProtoVersion) {
			return s
		}
		st := newStallStream(s)
		stalls <- st
		return st
	}
	head, tail := startHopOn(t, hh, 0, 3, noQuota), startHop(t, 3, fakeNLay, noQuota)
	c := newTestHost(t)
	connectAll(c, head.host, tail.host)
	sid := newSID()
	open := &meshp2pb.SessionOpen{SessionId: sid, Epoch: 1, ModelFingerprint: fakeFP, NCtxNeeded: 64, Transcripts: true,
		Route: &meshp2pb.Route{ModelFingerprint: fakeFP, NLayer: fakeNLay, Epoch: 1, Hops: []*meshp2pb.RouteHop{
			{PeerId: []byte(head.host.ID()), Start: 0, End: 3}, {PeerId: []byte(tail.host.ID()), Start: 3, End: fakeNLay}}}}
	s, m := rawOpen(t, c, head.host.ID(), open)
	if !m.GetAccept().GetOk() {
		t.Fatalf("open refused: %v", m)
	}
	down := <-stalls
	t.Cleanup(func() { down.end() }) // a failing run must not leave the head's writer blocked
	const stallAt = 3                // the head's third decode step
	head.eng.mu.Lock()
	head.eng.onStep = func(n int) {
		if n == stallAt {
			down.armed.Store(true)
		}
	}
	head.eng.mu.Unlock()
	go func() { // the origin takes the tokens the head relays
		r := frame.NewReader(s, frame.Limits{})
		for {
			if _, _, err := r.ReadStream(); err != nil {
				return
			}
		}
	}()
	w := frame.NewWriter(s, frame.Limits{})
	prompt := &meshp2pb.ActivationHeader{SessionId: sid, Epoch: 1, NRows: 3, IsPrefill: true, LastChunk: true, Tokens: []int32{1, 2, 3}}
	if err := w.WriteStream(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Activation{Activation: prompt}}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-down.blocked:
	case <-time.After(hangGuard):
		t.Fatal("the head's write to hop 1 never blocked")
	}
	key := keyFor(c, sid, 1)
	hs := head.svc.lookup(key)
	if hs == nil {
		t.Fatal("the session is gone from the head")
	}
	free := func() bool {
		if !hs.trMu.TryLock() {
			return false
		}
		hs.trMu.Unlock()
		return true
	}
	if !waitFor(time.Second, free) {
		t.Fatal("trMu is held while the head's write on the down seam is blocked")
	}
	closeMsg := &meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Close{Close: &meshp2pb.SessionClose{SessionId: sid, Epoch: 1, Reason: "done"}}}
	if err := w.WriteStream(closeMsg); err != nil {
		t.Fatal(err)
	}
	if !waitFor(2*time.Second, hs.closing.Load) {
		t.Fatal("the head did not act on the origin's SessionClose while its write to hop 1 was blocked")
	}
	close(down.release)
	select {
	case <-hs.released:
	case <-time.After(hangGuard):
		t.Fatal("the session did not end after hop 1 read again")
	}
	if hs.err != nil {
		t.Fatalf("the session ended with %v, want a clean close", hs.err)
	}
	if !waitFor(hangGuard, func() bool { return keptFinalFrom(tail, key, 0) }) {
		t.Fatal("hop 1 did not accept the head's final statement: frames and statements reached it out of order")
	}
}

// waitFor polls cond until it holds or d passed.
func waitFor(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); ; time.Sleep(5 * time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(end) {
			return false
		}
	}
}

// keptFinalFrom reports whether h kept a final statement of hop idx for
// the session key (its checker accepted it).
func keptFinalFrom(h *fakeHop, key Key, idx int) bool {
	h.svc.audits.mu.Lock()
	k := h.svc.audits.m[key]
	h.svc.audits.mu.Unlock()
	if k == nil {
		return false
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, s := range k.statements {
		if st, err := OpenTranscript(s); err == nil && st.GetFinal() && int(st.GetHopIndex()) == idx {
			return true
		}
	}
	return false
}
