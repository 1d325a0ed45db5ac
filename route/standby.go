package route

import (
	"fmt"
	"slices"

	"github.com/libp2p/go-libp2p/core/peer"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// StandbyHop is a hot standby of a route (docs/architecture.md, "Hot
// standby"): a replica serving exactly the layers of hop Index, on no hop
// of the route, that computes what that hop computes so that it can take
// its place without any prefill.
type StandbyHop struct {
	Index int
	Hop   Hop
}

// Wire is the Standby message naming s (nil for none).
func (s *StandbyHop) Wire() *meshp2pb.Standby {
	if s == nil {
		return nil
	}
	return &meshp2pb.Standby{HopIndex: uint32(s.Index), Hop: WireRoute(&Route{Hops: []Hop{s.Hop}}).GetHops()[0]}
}

// StandbyCandidate reports whether s is a replica of hop i of rt that may
// stand by for it: the same model, layers and kernel class, a free slot
// and room for need cells, on no hop of rt, and not avoided.
func StandbyCandidate(s Shard, rt *Route, i, need int, avoid func(peer.ID) bool) bool {
	h := rt.Hops[i]
	if s.Fingerprint != rt.Fingerprint || s.Start != h.Start || s.End != h.End || s.KernelClass != h.KernelClass || (avoid != nil && avoid(s.Peer)) {
		return false
	}
	if slices.ContainsFunc(rt.Hops, func(x Hop) bool { return x.Peer == s.Peer }) {
		return false
	}
	c := s.Capacity
	return c == nil || (c.GetFreeSessions() > 0 && c.GetFreeKvTokens() >= uint64(need))
}

// PickStandby chooses rt's standby among shards: for the hop with the
// most layers (what a failure would have a replacement recompute) that
// has a candidate replica, a warm one (it holds KV the session reuses: a
// conversation's earlier standby, which a mirror can only follow from
// what it holds) or else the first one shards lists; nil when none
// exists. The hops after the head come first, in order, and the head last
// (it wins with strictly more layers): the head's standby is fed by the
// origin, in another batching than the head's, so it is picked only on a
// batch-invariant route.
func PickStandby(rt *Route, shards []Shard, need int, avoid func(peer.ID) bool, warm []Hop) *StandbyHop {
	shards = slices.Clone(shards)
	slices.SortStableFunc(shards, func(a, b Shard) int { // warm first
		switch wa, wb := isWarm(a, warm), isWarm(b, warm); {
		case wa && !wb:
			return -1
		case wb && !wa:
			return 1
		}
		return 0
	})
	var best *StandbyHop
	layers := 0
	for k := 1; k <= len(rt.Hops); k++ {
		i := k % len(rt.Hops) // 1, ..., n-1, then the head
		if n := rt.Hops[i].End - rt.Hops[i].Start; n <= layers || (i == 0 && !rt.BatchInvariant()) {
			continue
		}
		for _, s := range shards {
			if StandbyCandidate(s, rt, i, need, avoid) {
				best = &StandbyHop{Index: i, Hop: Hop{Peer: s.Peer, Start: s.Start, End: s.End, Addrs: s.Addrs,
					Reach: s.Reach, KernelClass: s.KernelClass, MsPerLayer: float64(s.DecodeMsPerLayer)}}
				layers = s.End - s.Start
				break
			}
		}
	}
	return best
}

// ticketStandby reads a ticket's standby of route rt (nil: none). It
// checks the standby's shape only (it covers a hop of rt with that hop's
// layers and is on no hop); the peer's advert is checked by the verifier.
func ticketStandby(w *meshp2pb.Standby, rt *Route) (*StandbyHop, error) {
	if w == nil {
		return nil, nil
	}
	i := int(w.GetHopIndex())
	if i >= len(rt.Hops) || w.GetHop() == nil {
		return nil, ticketErr(ErrTicketInvalid, "standby covers hop %d of a %d-hop route", i, len(rt.Hops))
	}
	h := w.GetHop()
	sb := &StandbyHop{Index: i, Hop: Hop{Peer: peer.ID(h.GetPeerId()), Start: int(h.GetStart()), End: int(h.GetEnd()), Addrs: parseAddrs(h.GetAddrs())}}
	if sb.Hop.Start != rt.Hops[i].Start || sb.Hop.End != rt.Hops[i].End {
		return nil, ticketErr(ErrTicketInvalid, "standby serves layers %d-%d, the hop it covers %d-%d", sb.Hop.Start, sb.Hop.End, rt.Hops[i].Start, rt.Hops[i].End)
	}
	if slices.ContainsFunc(rt.Hops, func(x Hop) bool { return x.Peer == sb.Hop.Peer }) {
		return nil, ticketErr(ErrTicketInvalid, "standby %s is a hop of the route", sb.Hop.Peer)
	}
	return sb, nil
}

// SameStandby checks that an open's standby (nil: none) is the one its
// ticket names: a ticket without one admits no standby.
func SameStandby(ticket, open *meshp2pb.Standby) error {
	if open == nil {
		return nil
	}
	if ticket == nil {
		return fmt.Errorf("%w: the session names a standby, its ticket none", ErrNotInTicket)
	}
	if ticket.GetHopIndex() != open.GetHopIndex() || peer.ID(ticket.GetHop().GetPeerId()) != peer.ID(open.GetHop().GetPeerId()) ||
		ticket.GetHop().GetStart() != open.GetHop().GetStart() || ticket.GetHop().GetEnd() != open.GetHop().GetEnd() {
		return fmt.Errorf("%w: the session's standby is not its ticket's", ErrNotInTicket)
	}
	return nil
}

// pinTakeover routes the range of the failed epoch's standby (tk: it holds
// the failed hop's KV) through it: the other edges of the same range are
// dropped when the standby's own edge is usable. Other ranges stay: a
// route may still avoid that range altogether.
func pinTakeover(byStart [][]edge, tk *Hop) {
	if tk == nil || tk.Start < 0 || tk.Start >= len(byStart) {
		return
	}
	es := byStart[tk.Start]
	if !slices.ContainsFunc(es, func(e edge) bool { return e.s.Peer == tk.Peer && e.s.End == tk.End }) {
		return
	}
	byStart[tk.Start] = slices.DeleteFunc(es, func(e edge) bool { return e.s.End == tk.End && e.s.Peer != tk.Peer })
}

// takeoverShard is s as the planners see it: the failed epoch's standby
// (req.Takeover) with the slot and the cells its standby session holds
// counted free, since the new epoch takes exactly those (its open
// supersedes the standby epoch and adopts its cells); its advert, which
// counts that session, would otherwise show it full.
func takeoverShard(s Shard, req Request) Shard {
	tk := req.Takeover
	if tk == nil || s.Peer != tk.Peer || s.Start != tk.Start || s.End != tk.End || s.Capacity == nil {
		return s
	}
	c := proto.Clone(s.Capacity).(*meshp2pb.ShardCapacity)
	if c.GetMaxSessions() == 0 || c.GetFreeSessions() < c.GetMaxSessions() {
		c.FreeSessions++
	}
	c.FreeKvTokens += uint64(max(req.NeedKV, 0))
	s.Capacity = c
	return s
}
