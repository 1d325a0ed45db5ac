package p2p

import (
	"context"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
)

// Liveness from the connection.
//
// An advert lives AdvertTTL (6 minutes) after it is issued. A node that
// dies without withdrawing it (SIGKILL, a crash, a pulled cable) would
// keep steering routes for that long: every client planning through it
// pays a refused dial and a re-route, and advert sync hands the dead
// advert to every newcomer. So when the last connection to a peer with
// an advert closes, discovery checks the peer: after LivenessGrace (the
// peer, or the connection manager's trim, may reconnect) it dials the
// peer's advertised addresses, bounded by LivenessDialTimeout. A dial
// that fails drops the advert (AdvertRemoved, ReasonUnreachable), and
// that advert (its seq and any older) is refused from then on, whether
// it comes back by gossip or by another peer's sync batch. Any newer
// advert is accepted (a restarted node signs a newer seq), and a new
// connection to the peer clears the mark (it is alive: the pull on
// connect brings its advert back).
//
// Peers we never connected to are not checked: their adverts live out
// their TTL (the origin's failure memory steers around them meanwhile).
// A false drop (the peer lives but our dial failed) costs at most one
// republish interval (2 minutes) of that peer missing from this node's
// view; reconnection ends it sooner.
//
// Bounds: at most livenessParallel probes at once (one per peer), and the
// marks are pruned with the adverts' expiry (at most maxTableSize).

// livenessParallel bounds concurrent liveness probes.
const livenessParallel = 8

// goneMark is a dropped peer's last advert: its seq (it and older are
// refused) and its expiry (when the mark is pruned).
type goneMark struct {
	seq     uint64
	expires time.Time
}

// livenessLoop follows connection events: a disconnect from a peer with
// an advert starts a probe; a connection clears the peer's mark.
func (d *Discovery) livenessLoop(events <-chan ConnEvent) {
	defer d.wg.Done()
	sem := make(chan struct{}, livenessParallel)
	for {
		select {
		case <-d.ctx.Done():
			return
		case ev, ok := <-events:
			if !ok {
				return
			}
			switch ev.Kind {
			case Connected:
				d.mu.Lock()
				delete(d.gone, ev.Peer)
				d.mu.Unlock()
			case Disconnected:
				if d.startProbe(ev.Peer) {
					d.wg.Add(1)
					go d.probe(ev.Peer, sem)
				}
			}
		}
	}
}

// startProbe reports whether p needs a probe (it has an advert and none
// runs) and marks it probing.
func (d *Discovery) startProbe(p peer.ID) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.table[p] == nil || d.probing[p] || d.closed {
		return false
	}
	d.probing[p] = true
	return true
}

// probe waits LivenessGrace, then dials p unless a connection came back;
// a failed dial drops p's advert.
func (d *Discovery) probe(p peer.ID, sem chan struct{}) {
	defer d.wg.Done()
	defer func() {
		d.mu.Lock()
		delete(d.probing, p)
		d.mu.Unlock()
	}()
	select {
	case <-d.ctx.Done():
		return
	case <-time.After(d.cfg.LivenessGrace):
	}
	select {
	case <-d.ctx.Done():
		return
	case sem <- struct{}{}:
	}
	defer func() { <-sem }()
	if d.n.host.Network().Connectedness(p) == network.Connected {
		return
	}
	ad, ok := d.Advert(p)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(d.ctx, d.cfg.LivenessDialTimeout)
	err := d.n.host.Connect(ctx, peer.AddrInfo{ID: p, Addrs: ad.Addrs})
	cancel()
	if err == nil || d.ctx.Err() != nil {
		return
	}
	d.dropUnreachable(p, err)
}

// dropUnreachable removes p's advert and refuses it (and older ones)
// until p connects again or signs a newer one.
func (d *Discovery) dropUnreachable(p peer.ID, why error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ad := d.table[p]
	if ad == nil || d.closed {
		return
	}
	delete(d.table, p)
	d.gone[p] = goneMark{seq: ad.Seq, expires: ad.ExpiresAt}
	d.emitLocked(AdvertEvent{Kind: AdvertRemoved, Advert: *ad, Reason: ReasonUnreachable})
	d.log.Debug("peer unreachable after its connection closed; advert dropped", "peer", p, "err", why)
}

// refusedLocked reports whether rec is a dropped peer's advert (or older).
func (d *Discovery) refusedLocked(rec *advertRecord) bool {
	g, ok := d.gone[rec.Peer]
	return ok && rec.Seq <= g.seq
}

// pruneGoneLocked forgets marks whose advert has expired anyway.
func (d *Discovery) pruneGoneLocked(now time.Time) {
	for p, g := range d.gone {
		if !g.expires.After(now) {
			delete(d.gone, p)
		}
	}
}
