package session

import (
	"errors"
	"fmt"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
)

// TicketPolicy is what a hop started with --require-ticket demands.
type TicketPolicy struct {
	Network string
	// Trusted trackers; a ticket signed by anyone else is refused.
	Trusted   []peer.ID
	Now       func() time.Time
	ClockSkew time.Duration
}

// TicketAdmission returns a HopConfig.Admit hook that refuses sessions
// whose ticket is missing (TICKET_INVALID), forged or tampered
// (TICKET_INVALID), expired (TICKET_EXPIRED), signed by an untrusted
// tracker (TICKET_UNTRUSTED), for another model (MODEL_MISMATCH) or whose
// route — hops, ranges, epoch — is not the ticket's (NOT_IN_TICKET; the
// built-in admission already checks that route hop idx is this peer with
// its range, so the ticket then lists this hop too). Refusals are not
// retryable (another route would carry the same ticket problem) except
// TICKET_EXPIRED, which blames the ticket's tracker so that the origin
// re-plans with a fresh ticket.
func TicketAdmission(pol TicketPolicy) func(open *meshp2pb.SessionOpen, idx int, from peer.ID) *meshp2pb.Error {
	return func(open *meshp2pb.SessionOpen, idx int, from peer.ID) *meshp2pb.Error {
		tk, err := route.VerifyTicket(open.GetTicket(), route.VerifyOptions{Trusted: pol.Trusted, Network: pol.Network,
			Fingerprint: open.GetModelFingerprint(), Epoch: open.GetEpoch(), Now: pol.Now, ClockSkew: pol.ClockSkew})
		if err == nil {
			err = route.SameRoute(tk.GetRoute(), open.GetRoute())
		}
		// A ticket issued to a client is good for that client only: the
		// head, which the origin dials, checks who presents it.
		if c := tk.GetClientPeerId(); err == nil && idx == 0 && len(c) > 0 && peer.ID(c) != from {
			err = fmt.Errorf("%w: ticket was issued to %s, presented by %s", route.ErrTicketInvalid, peer.ID(c), from)
		}
		if err == nil {
			return nil
		}
		e := &meshp2pb.Error{Code: route.TicketCode(err), Message: fmt.Sprintf("hop %d: %v", idx, err)}
		if errors.Is(err, route.ErrTicketExpired) {
			// Retryable: a fresh ticket will do. The admission hook blames
			// this hop for retryable errors unless told otherwise, and the
			// origin excludes whoever is blamed; blame the ticket's issuer
			// instead (it serves no layers, so the re-plan for epoch+1 only
			// fetches a fresh ticket).
			if tk := ticketSigner(open.GetTicket()); tk != "" {
				e.FailedPeerId = []byte(tk)
			}
		}
		return e
	}
}

// ticketSigner is the tracker id a ticket claims ("" if unreadable).
func ticketSigner(st *meshp2pb.SignedRouteTicket) peer.ID {
	var t meshp2pb.RouteTicket
	if st == nil || proto.Unmarshal(st.GetTicket(), &t) != nil {
		return ""
	}
	id, err := peer.IDFromBytes(t.GetTrackerPeerId())
	if err != nil {
		return ""
	}
	return id
}
