package route

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// Route protocol: /meshp2p/<network>/route/1.0.0, one RouteRequest and
// one RouteResponse per stream.
const (
	ProtoRoute        = "route"
	ProtoRouteVersion = "1.0.0"
)

// Errors of the tracker planner.
var (
	// ErrNoTicket: no tracker returned a valid ticket (and fallback was
	// not allowed). It wraps every tracker's error, so errors.Is also
	// finds ErrTicketExpired and the other ticket errors.
	ErrNoTicket = errors.New("route: no valid ticket from any tracker")
	// ErrTrackerRefused: a tracker answered with an error (e.g. no route).
	ErrTrackerRefused = errors.New("route: tracker refused")
	// ErrTrackerBusy: the tracker asked this client to come back later
	// (NO_CAPACITY with retry_after_ms): it rate-limited the client, or it
	// is still verifying the model's layer count; the wrapped error says
	// which. Ask again after that long, or plan locally.
	ErrTrackerBusy = errors.New("route: tracker busy, retry later")
)

// TrackerHost is what the tracker planner needs from the p2p host.
type TrackerHost interface {
	NewStream(ctx context.Context, p peer.ID, pids ...protocol.ID) (network.Stream, error)
	// AddAddrs makes a pinned tracker's addresses dialable.
	AddAddrs(ai peer.AddrInfo)
}

// TrackerPlanner asks trackers for signed routes and verifies them:
// signature by the pinned tracker id, expiry, model, layer cover, epoch,
// exclusions, and that every hop matches that peer's signed advert in
// Table. Several trackers may be given; the first valid ticket wins. When
// none answers with a valid ticket it falls back to Fallback (local
// planning) unless Require is set.
type TrackerPlanner struct {
	Host     TrackerHost
	Trackers []peer.AddrInfo
	Protocol protocol.ID
	Network  string
	// Self is this origin's id; a ticket issued to another client is
	// refused.
	Self peer.ID
	// Table holds the adverts hops are checked against (nil: not checked).
	Table     *Table
	Fallback  Planner
	Require   bool
	Objective Objective
	// Timeout bounds each tracker query (default 5 s).
	Timeout time.Duration
	Limits  frame.Limits
	Logger  *slog.Logger
	Now     func() time.Time
}

// Plan implements Planner.
func (p *TrackerPlanner) Plan(ctx context.Context, req Request) (*Route, error) {
	var errs []error
	for _, ai := range p.Trackers {
		rt, err := p.Ask(ctx, ai, req)
		if err == nil {
			return rt, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		p.log().Warn("tracker gave no usable route", "tracker", ai.ID, "epoch", req.Epoch, "err", err)
		errs = append(errs, fmt.Errorf("tracker %s: %w", ai.ID, err))
	}
	if len(p.Trackers) == 0 {
		errs = append(errs, errors.New("no trackers configured"))
	}
	err := fmt.Errorf("%w: %w", ErrNoTicket, errors.Join(errs...))
	if p.Require || p.Fallback == nil {
		return nil, err
	}
	p.log().Warn("falling back to local route planning", "epoch", req.Epoch, "err", err)
	return p.Fallback.Plan(ctx, req)
}

func (p *TrackerPlanner) log() *slog.Logger {
	if p.Logger != nil {
		return p.Logger
	}
	return slog.Default()
}

// Ask queries one tracker and verifies its ticket.
func (p *TrackerPlanner) Ask(ctx context.Context, ai peer.AddrInfo, req Request) (*Route, error) {
	to := p.Timeout
	if to <= 0 {
		to = DefaultTrackerTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, to)
	defer cancel()
	if len(ai.Addrs) > 0 {
		p.Host.AddAddrs(ai)
	}
	s, err := p.Host.NewStream(ctx, ai.ID, p.Protocol)
	if err != nil {
		return nil, fmt.Errorf("open route stream: %w", err)
	}
	defer s.Close()
	stop := context.AfterFunc(ctx, func() { _ = s.Reset() })
	defer stop()
	rq := &meshp2pb.RouteRequest{ModelFingerprint: req.Fingerprint, NLayer: uint32(req.NLayer), MaxHops: uint32(max(req.MaxHops, 0)),
		Objective: meshp2pb.RouteObjective(p.Objective), Epoch: req.Epoch, NeedKv: uint32(max(req.NeedKV, 0)), SessionId: req.SessionID}
	for id := range req.Exclude {
		rq.Exclude = append(rq.Exclude, []byte(id))
	}
	for _, h := range req.Warm[:min(len(req.Warm), MaxWarmHops)] {
		rq.Warm = append(rq.Warm, &meshp2pb.WarmHop{Peer: []byte(h.Peer), Start: uint32(h.Start), End: uint32(h.End)})
	}
	for _, h := range req.WarmStandby[:min(len(req.WarmStandby), MaxWarmHops)] {
		rq.WarmStandby = append(rq.WarmStandby, &meshp2pb.WarmHop{Peer: []byte(h.Peer), Start: uint32(h.Start), End: uint32(h.End)})
	}
	rq.Standby = req.Standby
	if h := req.Takeover; h != nil {
		rq.Takeover = &meshp2pb.WarmHop{Peer: []byte(h.Peer), Start: uint32(h.Start), End: uint32(h.End)}
	}
	if err := frame.WriteMessage(s, rq); err != nil {
		return nil, fmt.Errorf("send route request: %w", err)
	}
	_ = s.CloseWrite()
	var resp meshp2pb.RouteResponse
	if err := frame.ReadMessage(s, &resp, p.Limits); err != nil {
		return nil, fmt.Errorf("read route response: %w", err)
	}
	if e := resp.GetError(); e != nil {
		if e.GetCode() == meshp2pb.ErrorCode_ERROR_CODE_NO_CAPACITY && e.GetRetryAfterMs() > 0 { // rate limited
			return nil, fmt.Errorf("%w: %w: %w", ErrTrackerRefused, ErrTrackerBusy, frame.FromProto(e))
		}
		if e.GetCode() == meshp2pb.ErrorCode_ERROR_CODE_NO_CAPACITY { // the tracker knows no route
			return nil, fmt.Errorf("%w: %w: %w", ErrTrackerRefused, ErrNoRoute, frame.FromProto(e))
		}
		return nil, fmt.Errorf("%w: %w", ErrTrackerRefused, frame.FromProto(e))
	}
	rt, err := p.Verify(resp.GetTicket(), ai.ID, req)
	if err != nil {
		return nil, err
	}
	if a := resp.GetAudit(); a != nil {
		// Verify checked the ticket's signature: read its bytes, do not
		// verify them again.
		var t meshp2pb.RouteTicket
		if err := proto.Unmarshal(resp.GetTicket().GetTicket(), &t); err != nil {
			return nil, ticketErr(ErrTicketInvalid, "%v", err)
		}
		if err := CheckAuditAssignment(&t, a); err != nil {
			return nil, err
		}
		rt.Audit = a
	}
	return rt, nil
}

// Verify checks a ticket from tracker for req and returns its route.
func (p *TrackerPlanner) Verify(st *meshp2pb.SignedRouteTicket, tracker peer.ID, req Request) (*Route, error) {
	t, err := VerifyTicket(st, VerifyOptions{Trusted: []peer.ID{tracker}, Network: p.Network, Fingerprint: req.Fingerprint,
		NLayer: req.NLayer, Epoch: max(req.Epoch, 1), Now: p.Now})
	if err != nil {
		return nil, err
	}
	if c := t.GetClientPeerId(); len(c) > 0 && p.Self != "" && peer.ID(c) != p.Self {
		return nil, ticketErr(ErrTicketInvalid, "ticket issued to %s, not to this origin %s", peer.ID(c), p.Self)
	}
	// A ticket for another session, or for fewer KV cells than asked,
	// would be refused by the hops.
	if err := CheckTicketSession(t, req.SessionID, uint32(max(req.NeedKV, 0))); err != nil {
		return nil, err
	}
	rt := TicketRoute(t, st)
	if req.MaxHops > 0 && len(rt.Hops) > req.MaxHops {
		return nil, ticketErr(ErrNotInTicket, "ticket has %d hops, at most %d asked", len(rt.Hops), req.MaxHops)
	}
	var shards []Shard
	if p.Table != nil {
		shards = p.Table.Shards(req.Fingerprint)
	}
	for i := range rt.Hops {
		h := &rt.Hops[i]
		if req.Exclude[h.Peer] {
			return nil, ticketErr(ErrNotInTicket, "ticket routes through excluded peer %s", h.Peer)
		}
		if p.Table == nil {
			continue
		}
		found := false
		for _, s := range shards {
			if s.Peer == h.Peer && s.Start == h.Start && s.End == h.End && s.NLayer == req.NLayer {
				found = true
				h.Reach, h.KernelClass, h.MsPerLayer = s.Reach, s.KernelClass, float64(s.DecodeMsPerLayer)
				if len(h.Addrs) == 0 {
					h.Addrs = s.Addrs
				}
				break
			}
		}
		if !found {
			return nil, ticketErr(ErrTicketAdvert, "hop %d: %s does not advertise layers %d-%d of model %.16s", i, h.Peer, h.Start, h.End, req.Fingerprint)
		}
	}
	sb, err := ticketStandby(t.GetStandby(), rt)
	if err != nil || sb == nil {
		return rt, err
	}
	if req.Exclude[sb.Hop.Peer] {
		return nil, ticketErr(ErrNotInTicket, "ticket's standby is excluded peer %s", sb.Hop.Peer)
	}
	if p.Table != nil {
		i := slices.IndexFunc(shards, func(s Shard) bool {
			return s.Peer == sb.Hop.Peer && s.Start == sb.Hop.Start && s.End == sb.Hop.End && s.NLayer == req.NLayer
		})
		if i < 0 {
			return nil, ticketErr(ErrTicketAdvert, "standby %s does not advertise layers %d-%d of model %.16s", sb.Hop.Peer, sb.Hop.Start, sb.Hop.End, req.Fingerprint)
		}
		s := shards[i]
		sb.Hop.Reach, sb.Hop.KernelClass, sb.Hop.MsPerLayer = s.Reach, s.KernelClass, float64(s.DecodeMsPerLayer)
		if len(sb.Hop.Addrs) == 0 {
			sb.Hop.Addrs = s.Addrs
		}
	}
	rt.Standby = sb
	return rt, nil
}
