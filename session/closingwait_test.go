package session

import (
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// An admission waits for the sessions of its origin whose Close arrived
// (they keep their blocks as they are released: a conversation's next
// turn adopts them) and for the one its open follows even before its
// Close arrived, not for that origin's other running sessions nor another
// origin's, and at most ClosingWait.
func TestAdmissionWaitsForClosingSession(t *testing.T) {
	mk := func(o peer.ID, id byte, closing bool) *hopSession {
		hs := &hopSession{key: Key{Origin: o, ID: [16]byte{id}, Epoch: 1}, released: make(chan struct{})}
		hs.closing.Store(closing)
		return hs
	}
	setup := func() (*HopService, *hopSession) {
		h := &HopService{active: map[Key]*hopSession{}, log: slog.New(slog.DiscardHandler)}
		closing := mk("origin", 1, true)
		for _, hs := range []*hopSession{closing, mk("origin", 2, false), mk("other", 3, true)} {
			h.active[hs.key] = hs
		}
		return h, closing
	}
	next := Key{Origin: "origin", ID: [16]byte{4}, Epoch: 1}

	synctest.Test(t, func(t *testing.T) {
		h, closing := setup()
		done := make(chan struct{})
		go func() { h.waitClosing(next, nil); close(done) }()
		synctest.Wait()
		select {
		case <-done:
			t.Fatal("the admission did not wait for its origin's closing session")
		default:
		}
		close(closing.released)
		synctest.Wait()
		select {
		case <-done:
		default:
			t.Fatal("the admission still waits after the closing session was released (for a running session, or another origin's)")
		}
	})
	synctest.Test(t, func(t *testing.T) { // the session it follows, its Close not read yet
		h, closing := setup()
		follows := h.active[Key{Origin: "origin", ID: [16]byte{2}, Epoch: 1}]
		done := make(chan struct{})
		go func() { h.waitClosing(next, follows.key.ID[:]); close(done) }()
		close(closing.released)
		synctest.Wait()
		select {
		case <-done:
			t.Fatal("the admission did not wait for the session its open follows")
		default:
		}
		close(follows.released)
		synctest.Wait()
		select {
		case <-done:
		default:
			t.Fatal("the admission still waits after the session it follows was released")
		}
	})
	synctest.Test(t, func(t *testing.T) {
		h, _ := setup() // never released
		start := time.Now()
		h.waitClosing(next, nil)
		if d := time.Since(start); d != ClosingWait {
			t.Fatalf("waited %v for a session never released, want ClosingWait (%v)", d, ClosingWait)
		}
	})
}

// A clean close marks the session closing on every hop that keeps blocks,
// the tail of a route without transcripts included (it sends nothing on,
// so closeDown never ran there): the next turn's admission waits for it.
func TestCleanCloseMarksClosing(t *testing.T) {
	for _, tc := range []struct {
		name         string
		prefix, tail bool
		want         bool
	}{
		{"tail with a prefix", true, true, true},
		{"tail without a prefix", false, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			open := &meshp2pb.SessionOpen{}
			if tc.prefix {
				open.Prefix = &meshp2pb.PrefixChain{BlockTokens: PrefixBlock}
			}
			hs := &hopSession{open: open, tail: tc.tail}
			if err := hs.closeTranscripts(&meshp2pb.SessionClose{}); err != nil {
				t.Fatal(err)
			}
			if got := hs.closing.Load(); got != tc.want {
				t.Fatalf("closing %v after a clean close, want %v", got, tc.want)
			}
		})
	}
}
