package p2p

import (
	"context"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/protocol/holepunch"
	"github.com/multiformats/go-multiaddr"
)

// connSubBuffer bounds each SubscribeConn channel. When a subscriber falls
// behind, the oldest undelivered event is dropped; ConnStatus always has the
// current state.
const connSubBuffer = 64

// maxHolePunchPeers bounds how many peers' hole-punch stats are kept after
// they disconnect.
const maxHolePunchPeers = 1024

// connTracker follows connections (network notifications) and DCUtR events
// (holepunch tracer) and reports per-peer status and changes.
type connTracker struct {
	net func() network.Network // nil until the host exists

	mu    sync.Mutex
	paths map[peer.ID]Path
	hp    map[peer.ID]*HolePunchStats
	subs  map[chan ConnEvent]struct{}
}

func newConnTracker() *connTracker {
	return &connTracker{
		paths: make(map[peer.ID]Path),
		hp:    make(map[peer.ID]*HolePunchStats),
		subs:  make(map[chan ConnEvent]struct{}),
	}
}

func isRelayed(a multiaddr.Multiaddr) bool {
	_, err := a.ValueForProtocol(multiaddr.P_CIRCUIT)
	return err == nil
}

// status computes p's status from the live connections; the caller holds mu
// or does not need hole-punch stats consistency.
func (t *connTracker) statusLocked(p peer.ID) ConnStatus {
	var st ConnStatus
	if hp := t.hp[p]; hp != nil {
		st.HolePunch = *hp
	}
	if t.net == nil {
		return st
	}
	n := t.net()
	if n == nil {
		return st
	}
	conns := n.ConnsToPeer(p)
	st.Limited = len(conns) > 0
	for _, c := range conns {
		if c.IsClosed() {
			continue
		}
		st.Conns++
		if !c.Stat().Limited {
			st.Limited = false
		}
		if isRelayed(c.RemoteMultiaddr()) {
			if st.Path == PathNone {
				st.Path = PathRelayed
			}
		} else {
			st.Path = PathDirect
		}
	}
	if st.Conns == 0 {
		st.Limited = false
	}
	return st
}

func (t *connTracker) status(p peer.ID) ConnStatus {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.statusLocked(p)
}

// update recomputes p's path and emits Connected/Disconnected/PathChanged.
func (t *connTracker) update(p peer.ID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := t.statusLocked(p)
	old := t.paths[p]
	if st.Path == old {
		return
	}
	if st.Path == PathNone {
		delete(t.paths, p)
		if len(t.hp) > maxHolePunchPeers {
			delete(t.hp, p) // bound memory: forget stats of gone peers
		}
	} else {
		t.paths[p] = st.Path
	}
	ev := ConnEvent{Peer: p, Status: st, At: time.Now()}
	switch {
	case old == PathNone:
		ev.Kind = Connected
	case st.Path == PathNone:
		ev.Kind = Disconnected
	default:
		ev.Kind = PathChanged
	}
	t.emitLocked(ev)
}

func (t *connTracker) emitLocked(ev ConnEvent) {
	for ch := range t.subs {
		sendDropOldest(ch, ev)
	}
}

// Trace implements holepunch.EventTracer.
func (t *connTracker) Trace(evt *holepunch.Event) {
	if evt == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	hp := t.hp[evt.Remote]
	if hp == nil {
		hp = &HolePunchStats{}
		t.hp[evt.Remote] = hp
	}
	ev := ConnEvent{Peer: evt.Remote, At: time.Unix(0, evt.Timestamp)}
	switch e := evt.Evt.(type) {
	case *holepunch.StartHolePunchEvt:
		hp.Attempts++
		ev.Kind = HolePunchStarted
	case *holepunch.EndHolePunchEvt:
		if e.Success {
			hp.Successes++
		} else {
			hp.Failures++
			hp.LastError = e.Error
		}
		hp.LastAt = ev.At
		ev.Kind = HolePunchFinished
		ev.Success = e.Success
		ev.Error = e.Error
	default:
		return
	}
	ev.Status = t.statusLocked(evt.Remote)
	t.emitLocked(ev)
}

func (t *connTracker) subscribe(ctx, life context.Context) <-chan ConnEvent {
	ch := make(chan ConnEvent, connSubBuffer)
	t.mu.Lock()
	t.subs[ch] = struct{}{}
	t.mu.Unlock()
	go func() {
		select {
		case <-ctx.Done():
		case <-life.Done():
		}
		t.mu.Lock()
		delete(t.subs, ch)
		close(ch)
		t.mu.Unlock()
	}()
	return ch
}

// notifiee returns network callbacks that keep the tracker current. They
// run on libp2p's notification goroutine and only take t.mu briefly.
func (t *connTracker) notifiee() network.Notifiee {
	return &network.NotifyBundle{
		ConnectedF:    func(_ network.Network, c network.Conn) { t.update(c.RemotePeer()) },
		DisconnectedF: func(_ network.Network, c network.Conn) { t.update(c.RemotePeer()) },
	}
}

// sendDropOldest delivers v on a subscriber's bounded channel without
// blocking: when the channel is full the oldest event is dropped, so a slow
// reader loses old events, never the newest.
func sendDropOldest[T any](ch chan T, v T) {
	select {
	case ch <- v:
		return
	default:
	}
	select {
	case <-ch:
	default:
	}
	select {
	case ch <- v:
	default:
	}
}
