package p2p

import (
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// Settling: when does a client know what the swarm serves?
//
// A peer holds the adverts of the swarm it knows (pull on connect,
// advertsync.go). Our first pull from it may race an advert on its way to
// it (a node that connected to it a moment before us), so a client looks
// twice: the swarm's adverts are in ("settled") when every connected peer
// that speaks advert sync has answered a pull begun at least the settle
// gap after its first answered pull, and after the moment the caller asks
// about (a long-lived client asks about now, not about when it connected).
// A client waiting for a model (Resolve) can then tell "nobody serves
// that" from "not known yet" within about the gap, rather than after its
// whole wait.

// pullLook is what this node knows of its pulls from one peer.
type pullLook struct {
	first, last time.Time // begin of the first and of the latest answered pull
	tried       time.Time // begin of the latest pull
	busy        bool      // a pull runs now
}

// pullBegins notes that a pull from p begins now.
func (s *syncState) pullBegins(p peer.ID, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, _ := s.looks.Peek(p)
	l.tried, l.busy = now, true
	s.looks.Put(p, l)
}

// pullEnds notes that the pull from p begun at began ended, answered or
// not.
func (s *syncState) pullEnds(p peer.ID, began time.Time, answered bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, _ := s.looks.Peek(p)
	l.busy = false
	if answered {
		if l.first.IsZero() {
			l.first = began
		}
		l.last = began
	}
	s.looks.Put(p, l)
}

// Settle reports whether the swarm's adverts are in as of since (see
// above): this node is connected, identify has completed with every peer
// it is connected to, and each of them that speaks advert sync has
// answered a pull begun at least gap after both its first answered pull
// and since. It begins, in the background, the pulls that are due for
// that (a failed one again after gap), so a caller polls it.
func (d *Discovery) Settle(since time.Time, gap time.Duration) bool {
	h := d.n.host
	peers := h.Network().Peers()
	if len(peers) == 0 {
		return false
	}
	now := time.Now()
	settled := true
	for _, p := range peers {
		protos, err := h.Peerstore().GetProtocols(p)
		if err != nil || len(protos) == 0 {
			settled = false // identify has not told us what it speaks yet
			continue
		}
		if ok, _ := h.Peerstore().SupportsProtocols(p, d.syncPID); len(ok) == 0 {
			continue // not a swarm member that holds adverts
		}
		d.sync.mu.Lock()
		l, _ := d.sync.looks.Peek(p)
		d.sync.mu.Unlock()
		due := since
		if l.first.After(due) {
			due = l.first
		}
		due = due.Add(gap)
		if !l.first.IsZero() && !l.last.Before(due) {
			continue
		}
		settled = false
		if !l.busy && now.Sub(l.tried) >= gap && (l.first.IsZero() || !now.Before(due)) {
			d.pullNow(p, now)
		}
	}
	return settled
}

// pullNow begins a pull from p in the background, whether or not one ran
// within syncRepull (Settle's looks).
func (d *Discovery) pullNow(p peer.ID, now time.Time) {
	d.sync.mu.Lock()
	d.sync.pulled.Put(p, now)
	d.sync.mu.Unlock()
	d.sync.pullBegins(p, now)
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		d.pullLimited(d.ctx, p)
	}()
}
