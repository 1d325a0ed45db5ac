package session

import (
	"errors"
	"fmt"
	"sync"
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
	// MaxNonces bounds the ticket nonces remembered (default
	// DefaultMaxTicketNonces).
	MaxNonces int
}

// TicketAdmission returns a HopConfig.Admit hook that refuses sessions
// whose ticket is missing (TICKET_INVALID), forged or tampered
// (TICKET_INVALID), expired (TICKET_EXPIRED), signed by an untrusted
// tracker (TICKET_UNTRUSTED), for another model (MODEL_MISMATCH) or whose
// route — hops, ranges, epoch — or standby is not the ticket's
// (NOT_IN_TICKET; the built-in admission already checks that route hop
// idx, or the open's standby of hop idx, is this peer with its range, so
// the ticket then lists this peer too). Refusals are not
// retryable (another route would carry the same ticket problem) except
// TICKET_EXPIRED, which blames the ticket's tracker so that the origin
// re-plans with a fresh ticket.
//
// A ticket is good for one session: the session id it is bound to (when
// the tracker bound it) and at most the KV cells it was planned for
// (n_ctx_needed); and the hook remembers every nonce it admitted until the
// ticket expires, refusing it for any other session (TICKET_INVALID), so a
// hop that saw the ticket cannot replay it for sessions of its own.
func TicketAdmission(pol TicketPolicy) func(open *meshp2pb.SessionOpen, idx int, from peer.ID) *meshp2pb.Error {
	skew := pol.ClockSkew
	if skew <= 0 {
		skew = route.DefaultClockSkew
	}
	now := pol.Now
	if now == nil {
		now = time.Now
	}
	mem := &nonceMemory{max: pol.MaxNonces, seen: map[string]usedNonce{}}
	if mem.max <= 0 {
		mem.max = DefaultMaxTicketNonces
	}
	return func(open *meshp2pb.SessionOpen, idx int, from peer.ID) *meshp2pb.Error {
		tk, err := route.VerifyTicket(open.GetTicket(), route.VerifyOptions{Trusted: pol.Trusted, Network: pol.Network,
			Fingerprint: open.GetModelFingerprint(), Epoch: open.GetEpoch(), Now: now, ClockSkew: skew})
		if err == nil {
			err = route.SameRoute(tk.GetRoute(), open.GetRoute())
		}
		if err == nil { // a standby holds a copy of a hop: the tracker chooses it too
			err = route.SameStandby(tk.GetStandby(), open.GetStandby())
		}
		if err == nil {
			err = route.CheckTicketSession(tk, open.GetSessionId(), open.GetNCtxNeeded())
		}
		// A ticket issued to a client is good for that client only: the
		// head, which the origin dials, checks who presents it.
		if c := tk.GetClientPeerId(); err == nil && idx == 0 && len(c) > 0 && peer.ID(c) != from {
			err = fmt.Errorf("%w: ticket was issued to %s, presented by %s", route.ErrTicketInvalid, peer.ID(c), from)
		}
		if err == nil {
			// Last, so that refused opens do not bind the nonce.
			err = mem.use(tk.GetNonce(), open.GetSessionId(), time.UnixMilli(tk.GetExpiresAtMs()).Add(skew), now())
		}
		if err == nil {
			return nil
		}
		if errors.Is(err, errNonceMemoryFull) {
			return &meshp2pb.Error{Code: meshp2pb.ErrorCode_ERROR_CODE_NO_CAPACITY, Message: fmt.Sprintf("hop %d: %v", idx, err)}
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

// errNonceMemoryFull: the hop remembers DefaultMaxTicketNonces live
// tickets already.
var errNonceMemoryFull = errors.New("too many live route tickets remembered")

// nonceMemory is the set of ticket nonces a hop admitted, each with the
// session it was admitted for, until the ticket expires. Bounded: when
// full of live entries it refuses new tickets.
type nonceMemory struct {
	max int

	mu   sync.Mutex
	seen map[string]usedNonce
}

type usedNonce struct {
	session string
	until   time.Time
}

// use admits nonce for session: the first use binds it, later uses by
// the same session pass, by another are ErrTicketReplayed.
func (m *nonceMemory) use(nonce, session []byte, until, now time.Time) error {
	if len(nonce) == 0 {
		return fmt.Errorf("%w: ticket has no nonce", route.ErrTicketInvalid)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if u, ok := m.seen[string(nonce)]; ok && now.Before(u.until) {
		if u.session != string(session) {
			return fmt.Errorf("%w: ticket %x was admitted for session %x, now presented for %x", route.ErrTicketReplayed, nonce, u.session, session)
		}
		return nil
	}
	if len(m.seen) >= m.max {
		for k, u := range m.seen {
			if !now.Before(u.until) {
				delete(m.seen, k)
			}
		}
		if len(m.seen) >= m.max {
			return errNonceMemoryFull
		}
	}
	m.seen[string(nonce)] = usedNonce{session: string(session), until: until}
	return nil
}
