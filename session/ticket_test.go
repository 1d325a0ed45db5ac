package session

import (
	"context"
	crand "crypto/rand"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
)

const ticketTestNetwork = "ticket-test"

// ticketPlanner always plans rt (a route carrying a ticket).
type ticketPlanner struct{ rt *route.Route }

func (p ticketPlanner) Plan(_ context.Context, req route.Request) (*route.Route, error) {
	cp := *p.rt
	cp.Epoch = req.Epoch
	return &cp, nil
}

// issue signs a ticket for hops as the tracker key would, issued to client;
// edit adjusts it before signing.
func issue(t *testing.T, key crypto.PrivKey, client peer.ID, hops []route.Hop, edit func(*meshp2pb.RouteTicket)) *meshp2pb.SignedRouteTicket {
	t.Helper()
	id, err := peer.IDFromPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	nonce, err := route.NewNonce()
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tk := &meshp2pb.RouteTicket{Network: ticketTestNetwork, Route: route.WireRoute(&route.Route{Fingerprint: fakeFP, NLayer: fakeNLay, Epoch: 1, Hops: hops}),
		ClientPeerId: []byte(client), Nonce: nonce, IssuedAtMs: now.UnixMilli(), ExpiresAtMs: now.Add(time.Minute).UnixMilli(), TrackerPeerId: []byte(id)}
	if edit != nil {
		edit(tk)
	}
	st, err := route.SignTicket(key, tk)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// ticketOpen is the SessionOpen hop idx of hops receives for ticket st.
func ticketOpen(sid []byte, hops []route.Hop, idx int, kv uint32, st *meshp2pb.SignedRouteTicket) *meshp2pb.SessionOpen {
	return &meshp2pb.SessionOpen{SessionId: sid, Epoch: 1, ModelFingerprint: fakeFP, NCtxNeeded: kv, HopIndex: uint32(idx), Ticket: st,
		Route: route.WireRoute(&route.Route{Fingerprint: fakeFP, NLayer: fakeNLay, Epoch: 1, Hops: hops})}
}

// A hop of a ticketed route cannot reuse the ticket for sessions of its
// own: the next hop remembers the nonces it admitted and refuses a ticket
// already used by another session; a ticket bound to a session id admits
// only that session, and one planned for n_ctx_needed KV cells admits no
// session asking for more. (Any hop used to be able to replay a ticket it
// was shown for TTL + skew.)
func TestTicketReplayRefused(t *testing.T) {
	tkey, _, err := crypto.GenerateEd25519Key(crand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tid, _ := peer.IDFromPrivateKey(tkey)
	admit := func(c *HopConfig) {
		c.Admit = TicketAdmission(TicketPolicy{Network: ticketTestNetwork, Trusted: []peer.ID{tid}})
	}
	a, b := startHop(t, 0, 3, admit), startHop(t, 3, 6, admit)
	o, c := newOrigin(t, nil, a, b)
	hops := []route.Hop{a.hop(), b.hop()}
	const kv = 64

	// The honest session through the route: admitted by both hops.
	st := issue(t, tkey, c.ID(), hops, func(tk *meshp2pb.RouteTicket) { tk.NCtxNeeded = kv })
	o.Planner = ticketPlanner{&route.Route{Fingerprint: fakeFP, NLayer: fakeNLay, Hops: hops, Ticket: st}}
	prompt := []int32{5, 6, 7}
	res, err := o.Generate(context.Background(), GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: prompt, MaxTokens: kv - len(prompt) - 1})
	if err != nil {
		t.Fatal(err)
	}
	if want := reference(prompt, kv-len(prompt)-1, 0); !equal(res.Tokens, want) {
		t.Fatalf("tokens %v, want %v", res.Tokens, want)
	}

	refused := func(name string, from *testHost, to *fakeHop, open *meshp2pb.SessionOpen) {
		t.Helper()
		_, msg := rawOpen(t, from, to.host.ID(), open)
		acc := msg.GetAccept()
		switch {
		case acc == nil || acc.GetOk():
			t.Errorf("%s: admitted (%v)", name, msg)
		case acc.GetError().GetCode() != meshp2pb.ErrorCode_ERROR_CODE_TICKET_INVALID:
			t.Errorf("%s: code %s (%s), want TICKET_INVALID", name, acc.GetError().GetCode(), acc.GetError().GetMessage())
		default:
			t.Logf("%s: refused: %s", name, acc.GetError().GetMessage())
		}
	}
	admitted := func(name string, from *testHost, to *fakeHop, open *meshp2pb.SessionOpen) {
		t.Helper()
		s, msg := rawOpen(t, from, to.host.ID(), open)
		if acc := msg.GetAccept(); acc == nil || !acc.GetOk() {
			t.Errorf("%s: refused: %v", name, msg)
		}
		_ = s.Reset() // the session ends (origin gone); the hops free it
		waitReleased(t, a, b)
	}

	// Hop a (the head) replays the ticket it was shown, as hop 0 of a
	// session of its own, to b.
	refused("replay by a hop", a.host, b, ticketOpen(newSID(), hops, 1, kv, st))

	// An unbound ticket binds to its first session; others may not
	// present it. (The same session and epoch cannot be opened twice at
	// all: the hop remembers the signed open — TestOpenReplayRefused.)
	st2 := issue(t, tkey, c.ID(), hops, nil)
	sid := newSID()
	admitted("first use", a.host, b, ticketOpen(sid, hops, 1, kv, st2))
	refused("second session", a.host, b, ticketOpen(newSID(), hops, 1, kv, st2))

	// A ticket bound to a session id admits only that session, from its
	// first use on.
	bound := newSID()
	st3 := issue(t, tkey, c.ID(), hops, func(tk *meshp2pb.RouteTicket) { tk.SessionId = bound; tk.NCtxNeeded = kv })
	refused("bound to another session", c, a, ticketOpen(newSID(), hops, 0, kv, st3))
	refused("more KV than the ticket", c, a, ticketOpen(bound, hops, 0, 2*kv, st3))
	admitted("bound session", c, a, ticketOpen(bound, hops, 0, kv, st3))
}

// A hop that demands tickets admits an open naming a standby only when
// the ticket names exactly that standby: an origin cannot make a peer the
// tracker did not choose hold a copy of a hop's KV (NOT_IN_TICKET).
func TestTicketNamesTheStandby(t *testing.T) {
	tkey, _, err := crypto.GenerateEd25519Key(crand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tid, _ := peer.IDFromPrivateKey(tkey)
	admit := func(c *HopConfig) {
		c.Admit = TicketAdmission(TicketPolicy{Network: ticketTestNetwork, Trusted: []peer.ID{tid}})
	}
	a, b, x := startHop(t, 0, 3, admit), startHop(t, 3, 6, admit), startHop(t, 3, 6, admit)
	_, c := newOrigin(t, nil, a, b, x)
	hops := []route.Hop{a.hop(), b.hop()}
	sb := (&route.StandbyHop{Index: 1, Hop: x.hop()}).Wire()
	other := (&route.StandbyHop{Index: 1, Hop: a.hop()}).Wire()
	for _, tc := range []struct {
		name          string
		ticket, named *meshp2pb.Standby
		ok            bool
	}{
		{"the ticket names none", nil, sb, false},
		{"another standby than the ticket's", other, sb, false},
		{"the ticket's", sb, sb, true},
		{"none named", sb, nil, true},
	} {
		st := issue(t, tkey, c.ID(), hops, func(tk *meshp2pb.RouteTicket) { tk.Standby = tc.ticket })
		open := ticketOpen(newSID(), hops, 0, 64, st)
		open.Standby = tc.named
		s, msg := rawOpen(t, c, a.host.ID(), open)
		acc := msg.GetAccept()
		switch {
		case tc.ok && !acc.GetOk():
			t.Errorf("%s: refused: %v", tc.name, msg)
		case !tc.ok && (acc.GetOk() || acc.GetError().GetCode() != meshp2pb.ErrorCode_ERROR_CODE_NOT_IN_TICKET):
			t.Errorf("%s: %v, want NOT_IN_TICKET", tc.name, msg)
		}
		_ = s.Reset()
		waitReleased(t, a, b, x)
	}
}
