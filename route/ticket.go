package route

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/multiformats/go-multiaddr"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// TicketDomain prefixes the bytes a tracker signs (proto/README.md): the
// signature covers TicketDomain || serialized RouteTicket, so a route
// ticket signature can never be replayed as another kind of signed record
// (capability adverts use "meshp2p/capability-advert/v1\x00").
const TicketDomain = "meshp2p/route-ticket/v1\x00"

// Ticket size bounds: a ticket is a few hundred bytes per hop; anything
// larger is refused before it is parsed.
const (
	MaxTicketBytes = 64 << 10
	MaxTicketHops  = 256
	// TicketNonceLen is the nonce length trackers use.
	TicketNonceLen = 16
)

// Ticket errors. Each maps to its own wire code (TicketCode), so origins and
// hops report why a ticket was refused.
var (
	// ErrTicketMissing: a ticket was required and none was sent (wire code
	// TICKET_INVALID).
	ErrTicketMissing = errors.New("route ticket missing")
	// ErrTicketInvalid: malformed, oversized, bad signature, signer key not
	// matching the signer id, wrong network or a route that is not a
	// contiguous cover of the model's layers (TICKET_INVALID).
	ErrTicketInvalid = errors.New("route ticket invalid")
	// ErrTicketExpired: now is outside [issued_at, expires_at] beyond the
	// allowed clock skew (TICKET_EXPIRED).
	ErrTicketExpired = errors.New("route ticket expired")
	// ErrTicketUntrusted: validly signed by a tracker that is not trusted
	// (TICKET_UNTRUSTED).
	ErrTicketUntrusted = errors.New("route ticket from an untrusted tracker")
	// ErrNotInTicket: the session's route (a hop, its range, the epoch)
	// differs from the ticket's route, or the ticket routes through an
	// excluded peer (NOT_IN_TICKET).
	ErrNotInTicket = errors.New("route not in ticket")
	// ErrTicketModel: the ticket is for another model (MODEL_MISMATCH).
	ErrTicketModel = errors.New("route ticket for another model")
	// ErrTicketAdvert: a ticket hop does not match that peer's signed
	// capability advert (no such peer, range or model in the origin's
	// table); the tracker's view is wrong or it lies (TICKET_INVALID).
	ErrTicketAdvert = errors.New("route ticket hop does not match the peer's advert")
	// ErrTicketReplayed: the ticket is bound to another session, or a hop
	// already admitted it for another session (TICKET_INVALID).
	ErrTicketReplayed = errors.New("route ticket used for another session")
	// ErrTicketKV: the session asks for more KV cells than the ticket was
	// planned for (TICKET_INVALID).
	ErrTicketKV = errors.New("route ticket planned for fewer KV cells")
)

// TicketError is a refused ticket: one of the sentinels above plus detail.
type TicketError struct {
	Err    error // a sentinel
	Detail string
}

func (e *TicketError) Error() string { return e.Err.Error() + ": " + e.Detail }
func (e *TicketError) Unwrap() error { return e.Err }

func ticketErr(sentinel error, format string, args ...any) error {
	return &TicketError{Err: sentinel, Detail: fmt.Sprintf(format, args...)}
}

// TicketCode maps a ticket error to its wire code (INTERNAL for others).
func TicketCode(err error) meshp2pb.ErrorCode {
	switch {
	case errors.Is(err, ErrTicketMissing), errors.Is(err, ErrTicketInvalid), errors.Is(err, ErrTicketAdvert),
		errors.Is(err, ErrTicketReplayed), errors.Is(err, ErrTicketKV):
		return meshp2pb.ErrorCode_ERROR_CODE_TICKET_INVALID
	case errors.Is(err, ErrTicketExpired):
		return meshp2pb.ErrorCode_ERROR_CODE_TICKET_EXPIRED
	case errors.Is(err, ErrTicketUntrusted):
		return meshp2pb.ErrorCode_ERROR_CODE_TICKET_UNTRUSTED
	case errors.Is(err, ErrNotInTicket):
		return meshp2pb.ErrorCode_ERROR_CODE_NOT_IN_TICKET
	case errors.Is(err, ErrTicketModel):
		return meshp2pb.ErrorCode_ERROR_CODE_MODEL_MISMATCH
	}
	return meshp2pb.ErrorCode_ERROR_CODE_INTERNAL
}

// NewNonce returns TicketNonceLen random bytes.
func NewNonce() ([]byte, error) {
	b := make([]byte, TicketNonceLen)
	_, err := rand.Read(b)
	return b, err
}

// SignTicket serializes t (deterministic encoding) and signs
// TicketDomain || bytes with key. t.TrackerPeerId must be key's peer id.
// The public key is inlined in Ed25519 peer ids; other key types carry it
// in SignedRouteTicket.public_key.
func SignTicket(key crypto.PrivKey, t *meshp2pb.RouteTicket) (*meshp2pb.SignedRouteTicket, error) {
	id, err := peer.IDFromPrivateKey(key)
	if err != nil {
		return nil, err
	}
	if !bytes.Equal(t.GetTrackerPeerId(), []byte(id)) {
		return nil, fmt.Errorf("route: ticket names tracker %x, key is %s", t.GetTrackerPeerId(), id)
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(t)
	if err != nil {
		return nil, err
	}
	sig, err := key.Sign(signedBytes(b))
	if err != nil {
		return nil, err
	}
	st := &meshp2pb.SignedRouteTicket{Ticket: b, Signature: sig}
	if _, err := id.ExtractPublicKey(); err != nil {
		if st.PublicKey, err = crypto.MarshalPublicKey(key.GetPublic()); err != nil {
			return nil, err
		}
	}
	return st, nil
}

func signedBytes(ticket []byte) []byte {
	out := make([]byte, 0, len(TicketDomain)+len(ticket))
	return append(append(out, TicketDomain...), ticket...)
}

// VerifyOptions says what a valid ticket must satisfy.
type VerifyOptions struct {
	// Trusted tracker ids; empty: any signer (the caller then checks who
	// signed).
	Trusted []peer.ID
	Network string // required network ("" : not checked)
	// Fingerprint is the model the ticket must be for ("": not checked).
	Fingerprint string
	// NLayer, when > 0, must equal the route's layer count.
	NLayer int
	// Epoch, when > 0, must equal the route's epoch.
	Epoch uint64
	// Now defaults to time.Now; ClockSkew (default 30 s) is tolerated on
	// both ends of the validity window.
	Now       func() time.Time
	ClockSkew time.Duration
}

// VerifyTicket checks a signed ticket: size, structure, signature (over
// TicketDomain || ticket bytes, by the key of tracker_peer_id), trust,
// network, model, layer cover, epoch and validity window, in that order.
// It returns the parsed ticket or a *TicketError.
func VerifyTicket(st *meshp2pb.SignedRouteTicket, o VerifyOptions) (*meshp2pb.RouteTicket, error) {
	if st == nil || len(st.GetTicket()) == 0 {
		return nil, ticketErr(ErrTicketMissing, "no ticket")
	}
	if len(st.GetTicket()) > MaxTicketBytes || len(st.GetSignature()) > 1024 || len(st.GetPublicKey()) > 1024 {
		return nil, ticketErr(ErrTicketInvalid, "ticket too large")
	}
	var t meshp2pb.RouteTicket
	if err := proto.Unmarshal(st.GetTicket(), &t); err != nil {
		return nil, ticketErr(ErrTicketInvalid, "parse: %v", err)
	}
	signer, err := peer.IDFromBytes(t.GetTrackerPeerId())
	if err != nil {
		return nil, ticketErr(ErrTicketInvalid, "tracker peer id: %v", err)
	}
	pub, err := signer.ExtractPublicKey()
	if err != nil {
		if len(st.GetPublicKey()) == 0 {
			return nil, ticketErr(ErrTicketInvalid, "no public key for tracker %s", signer)
		}
		if pub, err = crypto.UnmarshalPublicKey(st.GetPublicKey()); err != nil {
			return nil, ticketErr(ErrTicketInvalid, "public key: %v", err)
		}
		if !signer.MatchesPublicKey(pub) {
			return nil, ticketErr(ErrTicketInvalid, "public key does not match tracker %s", signer)
		}
	}
	ok, err := pub.Verify(signedBytes(st.GetTicket()), st.GetSignature())
	if err != nil || !ok {
		return nil, ticketErr(ErrTicketInvalid, "bad signature (claimed tracker %s)", signer)
	}
	if len(o.Trusted) > 0 {
		trusted := false
		for _, p := range o.Trusted {
			trusted = trusted || p == signer
		}
		if !trusted {
			return nil, ticketErr(ErrTicketUntrusted, "signed by %s", signer)
		}
	}
	if o.Network != "" && t.GetNetwork() != o.Network {
		return nil, ticketErr(ErrTicketInvalid, "ticket for network %q, this is %q", t.GetNetwork(), o.Network)
	}
	rt := t.GetRoute()
	if rt == nil {
		return nil, ticketErr(ErrTicketInvalid, "no route")
	}
	if o.Fingerprint != "" && rt.GetModelFingerprint() != o.Fingerprint {
		return nil, ticketErr(ErrTicketModel, "ticket for model %.16s, want %.16s", rt.GetModelFingerprint(), o.Fingerprint)
	}
	if o.NLayer > 0 && int(rt.GetNLayer()) != o.NLayer {
		return nil, ticketErr(ErrTicketModel, "ticket route has %d layers, model has %d", rt.GetNLayer(), o.NLayer)
	}
	if err := checkCover(rt); err != nil {
		return nil, err
	}
	if o.Epoch > 0 && rt.GetEpoch() != o.Epoch {
		return nil, ticketErr(ErrNotInTicket, "ticket for epoch %d, session epoch %d", rt.GetEpoch(), o.Epoch)
	}
	now := time.Now()
	if o.Now != nil {
		now = o.Now()
	}
	skew := o.ClockSkew
	if skew <= 0 {
		skew = DefaultClockSkew
	}
	iss, exp := time.UnixMilli(t.GetIssuedAtMs()), time.UnixMilli(t.GetExpiresAtMs())
	if t.GetExpiresAtMs() <= t.GetIssuedAtMs() {
		return nil, ticketErr(ErrTicketInvalid, "expires_at %d not after issued_at %d", t.GetExpiresAtMs(), t.GetIssuedAtMs())
	}
	if now.After(exp.Add(skew)) {
		return nil, ticketErr(ErrTicketExpired, "expired at %s (now %s)", exp.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
	}
	if now.Before(iss.Add(-skew)) {
		return nil, ticketErr(ErrTicketExpired, "not valid before %s (now %s)", iss.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
	}
	return &t, nil
}

// checkCover requires hops with valid peer ids whose ranges join end to
// start and cover [0, n_layer).
func checkCover(rt *meshp2pb.Route) error {
	hops := rt.GetHops()
	if len(hops) == 0 || len(hops) > MaxTicketHops {
		return ticketErr(ErrTicketInvalid, "route has %d hops", len(hops))
	}
	at := uint32(0)
	for i, h := range hops {
		if _, err := peer.IDFromBytes(h.GetPeerId()); err != nil {
			return ticketErr(ErrTicketInvalid, "hop %d peer id: %v", i, err)
		}
		if h.GetStart() != at || h.GetEnd() <= h.GetStart() {
			return ticketErr(ErrTicketInvalid, "hop %d range %d-%d does not continue at layer %d", i, h.GetStart(), h.GetEnd(), at)
		}
		at = h.GetEnd()
	}
	if at != rt.GetNLayer() || at == 0 {
		return ticketErr(ErrTicketInvalid, "route covers layers 0-%d of %d", at, rt.GetNLayer())
	}
	return nil
}

// CheckTicketSession checks what a ticket binds besides the route: the
// session id (when the ticket names one) and the KV cells the session may
// ask for (when the ticket says how many it was planned for). Tickets of
// trackers that bind neither pass.
func CheckTicketSession(t *meshp2pb.RouteTicket, sessionID []byte, nCtxNeeded uint32) error {
	if sid := t.GetSessionId(); len(sid) > 0 && !bytes.Equal(sid, sessionID) {
		return ticketErr(ErrTicketReplayed, "ticket is for session %x, presented for session %x", sid, sessionID)
	}
	if n := t.GetNCtxNeeded(); n > 0 && nCtxNeeded > n {
		return ticketErr(ErrTicketKV, "session asks for %d KV cells, ticket was planned for %d", nCtxNeeded, n)
	}
	return nil
}

// SameRoute reports whether a session's route is the ticket's route: same
// model, layer count, epoch and hops (peer and range; addresses are dial
// hints and may differ). A mismatch is an ErrNotInTicket.
func SameRoute(ticket, session *meshp2pb.Route) error {
	if ticket.GetModelFingerprint() != session.GetModelFingerprint() {
		return ticketErr(ErrTicketModel, "ticket for model %.16s, session for %.16s", ticket.GetModelFingerprint(), session.GetModelFingerprint())
	}
	if ticket.GetNLayer() != session.GetNLayer() {
		return ticketErr(ErrTicketModel, "ticket route has %d layers, session %d", ticket.GetNLayer(), session.GetNLayer())
	}
	if ticket.GetEpoch() != session.GetEpoch() {
		return ticketErr(ErrNotInTicket, "ticket for epoch %d, session epoch %d", ticket.GetEpoch(), session.GetEpoch())
	}
	th, sh := ticket.GetHops(), session.GetHops()
	if len(th) != len(sh) {
		return ticketErr(ErrNotInTicket, "ticket has %d hops, session route %d", len(th), len(sh))
	}
	for i := range th {
		if !bytes.Equal(th[i].GetPeerId(), sh[i].GetPeerId()) || th[i].GetStart() != sh[i].GetStart() || th[i].GetEnd() != sh[i].GetEnd() {
			return ticketErr(ErrNotInTicket, "hop %d: session has %s layers %d-%d, ticket %s layers %d-%d", i,
				peer.ID(sh[i].GetPeerId()), sh[i].GetStart(), sh[i].GetEnd(), peer.ID(th[i].GetPeerId()), th[i].GetStart(), th[i].GetEnd())
		}
	}
	return nil
}

// TicketRoute converts a verified ticket's route into a Route (addresses
// parsed; unparseable ones dropped), carrying st as its ticket.
func TicketRoute(t *meshp2pb.RouteTicket, st *meshp2pb.SignedRouteTicket) *Route {
	rt := t.GetRoute()
	out := &Route{Fingerprint: rt.GetModelFingerprint(), NLayer: int(rt.GetNLayer()), Epoch: rt.GetEpoch(), Ticket: st}
	for _, h := range rt.GetHops() {
		hop := Hop{Peer: peer.ID(h.GetPeerId()), Start: int(h.GetStart()), End: int(h.GetEnd())}
		hop.Addrs = parseAddrs(h.GetAddrs())
		out.Hops = append(out.Hops, hop)
	}
	return out
}

// WireRoute converts a Route to its wire form.
func WireRoute(r *Route) *meshp2pb.Route {
	pr := &meshp2pb.Route{ModelFingerprint: r.Fingerprint, NLayer: uint32(r.NLayer), Epoch: r.Epoch}
	for _, h := range r.Hops {
		hop := &meshp2pb.RouteHop{PeerId: []byte(h.Peer), Start: uint32(h.Start), End: uint32(h.End), KernelClass: h.KernelClass}
		for _, a := range h.Addrs {
			hop.Addrs = append(hop.Addrs, a.String())
		}
		pr.Hops = append(pr.Hops, hop)
	}
	return pr
}

func parseAddrs(ss []string) []multiaddr.Multiaddr {
	var out []multiaddr.Multiaddr
	for _, s := range ss {
		if m, err := multiaddr.NewMultiaddr(s); err == nil {
			out = append(out, m)
		}
	}
	return out
}
