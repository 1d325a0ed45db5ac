package session

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
)

// Hot standby (docs/architecture.md, "Hot standby"). A session may name
// one replica for one of its hops (SessionOpen.standby): a peer on no hop
// of the route that serves exactly the covered hop's layers with the same
// kernel class. The hop before the covered hop (the mirror) sends it
// every frame it sends the covered hop, through a bounded queue it never
// waits on: a standby that falls behind is dropped with a log line and the
// session goes on without one. The head's upstream is the origin, so the
// origin is the mirror of a head standby (headstandby.go): it sends the
// standby the prompt and then the committed tokens the head feeds back
// in, which the standby's fromOrigin check admits (it has no ring). The standby runs the frames through its
// layers and discards the output, so its KV holds bitwise what the covered
// hop's does (same layers, same kernel class, batch invariance). It keeps
// the session's blocks when it ends like any hop (prefix.go, under the
// session's own scope), and when the covered hop fails the origin puts the
// standby in its place: the next epoch's open supersedes the standby's
// epoch, which keeps its blocks, and adopts them (failover.go), so no hop
// of the new route prefills the context again.

// StandbyQueueFrames and StandbyQueueBytes bound what the mirror holds for
// a standby that has not taken it yet: beyond either, the standby lags
// and is dropped (the covered hop is never waited for).
const (
	StandbyQueueFrames = 64
	StandbyQueueBytes  = 64 << 20
)

// DefaultStandbyAbove is the prompt length from which an origin gives a
// session a standby without being asked (Origin.StandbyAbove; chosen by
// measurement, docs/performance.md "Hot standby").
const DefaultStandbyAbove = 1024

// StandbyStats is what standbys cost and did on one hop: as a standby
// (sessions, rows computed and the compute time, whose outputs were
// discarded) and as a mirror (frames and payload bytes sent to standbys,
// standbys dropped for lagging or failing).
type StandbyStats struct {
	Sessions     int64
	Rows         int64
	Compute      time.Duration
	MirrorFrames int64
	MirrorBytes  int64
	Dropped      int64
}

// standbyCounters are a HopService's StandbyStats.
type standbyCounters struct {
	sessions, rows, computeNs, frames, bytes, dropped atomic.Int64
}

// computed counts rows a standby computed in d.
func (c *standbyCounters) computed(rows int, d time.Duration) {
	c.rows.Add(int64(rows))
	c.computeNs.Add(int64(d))
}

// StandbyStats reports what standbys cost on this hop so far.
func (h *HopService) StandbyStats() StandbyStats {
	c := &h.standby
	return StandbyStats{Sessions: c.sessions.Load(), Rows: c.rows.Load(), Compute: time.Duration(c.computeNs.Load()),
		MirrorFrames: c.frames.Load(), MirrorBytes: c.bytes.Load(), Dropped: c.dropped.Load()}
}

// standbyHop is the replica hop an open names for this peer at its hop
// index (nil: the open is not a standby's). An open that names this peer
// as the standby of another index, of another range or while on the route
// too is refused.
func standbyHop(open *meshp2pb.SessionOpen, me peer.ID) (*meshp2pb.RouteHop, *hopError) {
	sb := open.GetStandby()
	if sb == nil || peer.ID(sb.GetHop().GetPeerId()) != me {
		return nil, nil
	}
	hops := open.GetRoute().GetHops()
	i := int(sb.GetHopIndex())
	switch {
	case i != int(open.GetHopIndex()):
		return nil, nil // this peer's open as a route hop (checked there)
	case i < 0 || i >= len(hops):
		return nil, codeErr(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "a standby covers a hop of the route", "")
	case sb.GetHop().GetStart() != hops[i].GetStart() || sb.GetHop().GetEnd() != hops[i].GetEnd():
		return nil, codeErr(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "a standby serves exactly the layers of the hop it covers", "")
	case slices.ContainsFunc(hops, func(x *meshp2pb.RouteHop) bool { return peer.ID(x.GetPeerId()) == me }):
		return nil, codeErr(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "a standby is on no hop of the route", "")
	}
	return sb.GetHop(), nil
}

// hops is the route as this session computes it: the open's, with the
// standby in the place of the hop it covers on a standby.
func (hs *hopSession) hops() []*meshp2pb.RouteHop {
	hops := hs.open.GetRoute().GetHops()
	if !hs.standby {
		return hops
	}
	out := slices.Clone(hops)
	out[hs.idx] = hs.open.GetStandby().GetHop()
	return out
}

// mirror sends a standby the frames the covered hop (the next hop) gets.
type mirror struct {
	hs   *hopSession
	peer peer.ID
	q    chan *meshp2pb.StreamMessage // activations carry their payload in pay
	pay  map[*meshp2pb.StreamMessage][]byte
	mu   sync.Mutex // guards pay, queued
	// queued is the payload bytes in q; a drop stops everything.
	queued int
	standbyLink
	start standbyStart // the mirror goroutine's alone (standbystart.go)
}

// startMirror (connect, on the hop before the covered hop) starts sending
// the open's standby what the next hop gets, if the open names one for
// it. Admission never waits for the standby.
func (hs *hopSession) startMirror() {
	sb := hs.open.GetStandby()
	if hs.standby || hs.tail || sb == nil || int(sb.GetHopIndex()) != hs.idx+1 {
		return
	}
	m := &mirror{hs: hs, peer: peer.ID(sb.GetHop().GetPeerId()), q: make(chan *meshp2pb.StreamMessage, StandbyQueueFrames),
		pay: map[*meshp2pb.StreamMessage][]byte{}, standbyLink: newStandbyLink(),
		start: standbyStart{fill: hs.replay, fillTo: hs.replayTo, wire: hs.wire, nEmbd: hs.se.info.NEmbd}}
	hs.mirror = m
	go m.run()
}

// drop ends the standby (once), saying why.
func (m *mirror) drop(why string, err error) {
	if m == nil {
		return
	}
	m.markDropped(func() {
		m.hs.h.standby.dropped.Add(1)
		m.hs.h.log.Warn("standby dropped: the session goes on without it", "session", m.hs.key, "standby", m.peer, "why", why, "err", err)
	})
}

// activation queues a copy of a frame the next hop got (never blocks: a
// full queue drops the standby).
func (m *mirror) activation(hdr *meshp2pb.ActivationHeader, payload []byte) {
	if m == nil || m.dropped.Load() {
		return
	}
	m.push(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Activation{Activation: hdr}}, slices.Clone(payload))
}

// message queues a message the next hop got (a clean close).
func (m *mirror) message(msg *meshp2pb.StreamMessage) { m.push(msg, nil) }

func (m *mirror) push(msg *meshp2pb.StreamMessage, payload []byte) {
	if m == nil || m.dropped.Load() {
		return
	}
	m.mu.Lock()
	if m.queued+len(payload) > StandbyQueueBytes {
		m.mu.Unlock()
		m.drop("lagging", fmt.Errorf("%d bytes queued for it", m.queued))
		return
	}
	select {
	case m.q <- msg:
		m.queued += len(payload)
		if payload != nil {
			m.pay[msg] = payload
		}
		m.mu.Unlock()
	default:
		m.mu.Unlock()
		m.drop("lagging", fmt.Errorf("%d frames queued for it", StandbyQueueFrames))
	}
}

func (m *mirror) take(msg *meshp2pb.StreamMessage) []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.pay[msg]
	delete(m.pay, msg)
	m.queued -= len(p)
	return p
}

// run opens the standby's session and sends it the queue until the
// session here ends (then it closes the standby's stream: the standby
// ends and keeps its blocks) or the standby is dropped.
func (m *mirror) run() {
	hs, h := m.hs, m.hs.h
	select {
	case <-hs.done: // ended before its standby could start
		return
	default:
	}
	ctx, cancel := context.WithTimeout(context.Background(), h.cfg.OpenTimeout)
	defer cancel()
	addAddrs(h.host, m.peer, hs.open.GetStandby().GetHop().GetAddrs())
	s, err := h.host.NewStream(ctx, m.peer, h.host.ProtocolID(ProtoSession, ProtoVersion))
	if err != nil {
		m.drop("unreachable", err)
		return
	}
	seam := NewSeam(s, h.cfg.Limits)
	defer seam.Close()
	open := cloneOpen(hs.open)
	open.HopIndex = uint32(hs.idx + 1)
	deadline, _ := ctx.Deadline() // the open's budget, from before the dial
	r, from, err := admitStandby(s, seam, h.cfg.Limits, open, deadline)
	if err != nil {
		m.drop("admission", err)
		seam.Reset()
		return
	}
	m.start.from = from
	h.log.Info("standby open", "session", hs.key, "covers", hs.route[hs.idx+1], "standby", m.peer, "from", m.start.from)
	go m.watch(r, hs.done, m.drop)
	for {
		select {
		case msg := <-m.q:
			if err := m.send(seam, msg); err != nil {
				m.drop(dropReason(err), err)
				seam.Reset()
				return
			}
		case <-m.gone:
			seam.Reset()
			return
		case <-hs.done:
			m.flush(seam)
			return
		}
	}
}

// send writes one queued message to the standby.
func (m *mirror) send(seam *Seam, msg *meshp2pb.StreamMessage) error {
	deadline := WriteDeadline(m.hs.h.cfg.Idle)
	a := msg.GetActivation()
	if a == nil {
		m.closed.Store(msg.GetClose() != nil)
		return seam.Send(msg, deadline)
	}
	frames, err := m.start.align(a, m.take(msg))
	if err != nil {
		return err
	}
	for _, f := range frames {
		if err := seam.SendActivation(f.GetHeader(), f.GetPayload(), deadline); err != nil {
			return err
		}
		m.hs.h.standby.frames.Add(1)
		m.hs.h.standby.bytes.Add(int64(len(f.GetPayload())))
	}
	return nil
}

// dropReason is the log's "why" of a standby dropped for err.
func dropReason(err error) string {
	if errors.Is(err, errCannotFollow) {
		return "cannot follow"
	}
	return "write"
}

// flush (the session here ended) sends what is queued, within a write
// deadline, before the standby's stream closes.
func (m *mirror) flush(seam *Seam) {
	for {
		select {
		case msg := <-m.q:
			if m.dropped.Load() {
				return
			}
			if err := m.send(seam, msg); err != nil {
				m.drop(dropReason(err), err)
				return
			}
		default:
			return
		}
	}
}

// standbyPick is an epoch's standby: the hop index of the route it
// covers and the replica.
type standbyPick struct {
	idx     int
	covered peer.ID
	hop     route.Hop
	took    bool // it took over (counted once)
}

// wire is the open's Standby field for p (nil for none).
func (p *standbyPick) wire() *meshp2pb.Standby {
	if p == nil {
		return nil
	}
	return (&route.StandbyHop{Index: p.idx, Hop: p.hop}).Wire()
}

// pickStandby chooses the standby of an epoch (route.PickStandby: the hop
// with the most layers that has a replica; the head only on a
// batch-invariant route, its standby fed by the origin, headstandby.go);
// nil when the request does not want one or none exists. A tracker's
// route has the standby its ticket names, if any: hops that demand
// tickets admit no other.
func (o *Origin) pickStandby(rt *route.Route, req GenerateRequest, need int, exclude map[peer.ID]bool, warm []route.Hop) *standbyPick {
	if !o.wantsStandby(req) {
		return nil
	}
	avoid := func(p peer.ID) bool { return exclude[p] || o.Failures.Avoided(p) }
	sb := rt.Standby
	if rt.Ticket == nil {
		if o.Shards == nil {
			return nil
		}
		sb = route.PickStandby(rt, o.Shards(rt.Fingerprint), need, avoid, warm)
	}
	if sb == nil || sb.Index >= len(rt.Hops) || avoid(sb.Hop.Peer) || (sb.Index == 0 && !rt.BatchInvariant()) {
		return nil
	}
	return &standbyPick{idx: sb.Index, covered: rt.Hops[sb.Index].Peer, hop: sb.Hop}
}

// wantsStandby reports whether req gets a standby: asked for, or a prompt
// of at least StandbyAbove tokens not refused one.
func (o *Origin) wantsStandby(req GenerateRequest) bool {
	if req.NoStandby && !req.Standby {
		return false
	}
	above := o.StandbyAbove
	if above == 0 {
		above = DefaultStandbyAbove
	}
	return req.Standby || (above > 0 && len(req.Prompt) >= above)
}

// standbys is an origin's standby across a generation's epochs: the
// current epoch's, and after a failure the standby of the epoch that
// failed (prev) and the peer it failed on.
type standbys struct {
	cur, prev *standbyPick
	failed    peer.ID
	lost      map[peer.ID]bool // standbys a mirror dropped: not named again in this generation
}

// dropped forgets the failed epoch's standby, which its mirror had dropped
// (standbyLost): it neither takes over nor covers a later epoch.
func (s *standbys) dropped() {
	if s.prev == nil {
		return
	}
	if s.lost == nil {
		s.lost = map[peer.ID]bool{}
	}
	s.lost[s.prev.hop.Peer] = true
	s.prev = nil
}

// next settles the standbys of an epoch about to run on rt: the failed
// epoch's standby takes the failed hop's place, and one is picked for
// this epoch (need: its KV cells), counted in res.
func (s *standbys) next(o *Origin, rt *route.Route, req GenerateRequest, preq route.Request, res *Result) {
	need, exclude := preq.NeedKV, preq.Exclude
	if p := s.prev; p != nil && takeOver(rt, p, s.failed, exclude) && !p.took {
		p.took = true
		res.Takeovers++
		o.observer().TakenOver()
		o.logger().Info("standby takes over the failed hop's layers", "standby", p.hop.Peer, "failed_peer", s.failed, "epoch", rt.Epoch)
	}
	if len(s.lost) > 0 {
		exclude = maps.Clone(exclude)
		maps.Copy(exclude, s.lost)
	}
	s.cur = o.pickStandby(rt, req, need, exclude, append(slices.Clone(preq.WarmStandby), preq.Warm...))
	if s.cur != nil {
		res.Standbys++
	}
}

// takeover is the failed epoch's standby, when it covered the failed hop
// (it holds that hop's KV): the next plan routes that range through it
// (route.Request.Takeover); nil otherwise.
func (s *standbys) takeover() *route.Hop {
	if s.prev == nil || s.prev.covered != s.failed {
		return nil
	}
	h := s.prev.hop
	return &h
}

// standbyLost reports whether a failure's report says the hop mirroring
// the standby had dropped it (Error.standby_lost): its KV lags the
// covered hop's, and the peer may be gone.
func standbyLost(err error) bool {
	var re *frame.RemoteError
	return errors.As(err, &re) && re.E.GetStandbyLost()
}

// takeOver puts the previous epoch's standby (prev) in the place of the
// hop it covered when that hop failed (failed) and rt, the next epoch's
// plan, has a hop of the same layers: the standby holds the session's KV.
// It reports whether it did. A tracker's ticket is left as it is (it
// names its hops).
func takeOver(rt *route.Route, prev *standbyPick, failed peer.ID, exclude map[peer.ID]bool) bool {
	if prev == nil || prev.covered != failed || exclude[prev.hop.Peer] {
		return false
	}
	if i := slices.IndexFunc(rt.Hops, func(x route.Hop) bool { return x.Peer == prev.hop.Peer }); i >= 0 {
		return rt.Hops[i].Start == prev.hop.Start && rt.Hops[i].End == prev.hop.End // the plan chose it
	}
	if rt.Ticket != nil {
		return false
	}
	for i, x := range rt.Hops {
		if x.Start == prev.hop.Start && x.End == prev.hop.End {
			rt.Hops[i] = prev.hop
			return true
		}
	}
	return false
}
