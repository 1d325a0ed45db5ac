package route

import (
	"crypto/rand"
	"errors"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

func newKey(t testing.TB) (crypto.PrivKey, peer.ID) {
	t.Helper()
	k, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id, err := peer.IDFromPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return k, id
}

const testFP = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"

func testTicket(tracker peer.ID, hops []peer.ID, now time.Time) *meshp2pb.RouteTicket {
	rt := &meshp2pb.Route{ModelFingerprint: testFP, NLayer: uint32(2 * len(hops)), Epoch: 1}
	for i, h := range hops {
		rt.Hops = append(rt.Hops, &meshp2pb.RouteHop{PeerId: []byte(h), Start: uint32(2 * i), End: uint32(2*i + 2), Addrs: []string{"/ip4/127.0.0.1/tcp/1"}})
	}
	return &meshp2pb.RouteTicket{Network: "net", Route: rt, ClientPeerId: []byte(hops[0]), Nonce: make([]byte, 16),
		IssuedAtMs: now.UnixMilli(), ExpiresAtMs: now.Add(time.Minute).UnixMilli(), TrackerPeerId: []byte(tracker)}
}

// Every field of a signed ticket is covered by the signature: changing any
// one (re-serialising, keeping the signature) is TICKET_INVALID; the other
// refusals each get their own error and wire code.
func TestVerifyTicket(t *testing.T) {
	key, tracker := newKey(t)
	otherKey, other := newKey(t)
	_, a := newKey(t)
	_, b := newKey(t)
	now := time.Now()
	opts := VerifyOptions{Trusted: []peer.ID{tracker}, Network: "net", Fingerprint: testFP, NLayer: 4, Epoch: 1}
	sign := func(k crypto.PrivKey, tk *meshp2pb.RouteTicket) *meshp2pb.SignedRouteTicket {
		st, err := SignTicket(k, tk)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	good := sign(key, testTicket(tracker, []peer.ID{a, b}, now))
	if _, err := VerifyTicket(good, opts); err != nil {
		t.Fatalf("valid ticket refused: %v", err)
	}
	// tamper re-serialises the ticket after f, keeping the old signature.
	tamper := func(f func(*meshp2pb.RouteTicket)) *meshp2pb.SignedRouteTicket {
		tk := testTicket(tracker, []peer.ID{a, b}, now)
		f(tk)
		bs, err := proto.MarshalOptions{Deterministic: true}.Marshal(tk)
		if err != nil {
			t.Fatal(err)
		}
		return &meshp2pb.SignedRouteTicket{Ticket: bs, Signature: good.Signature}
	}
	cases := []struct {
		name string
		st   *meshp2pb.SignedRouteTicket
		opts VerifyOptions
		want error
		code meshp2pb.ErrorCode
	}{
		{"missing", nil, opts, ErrTicketMissing, meshp2pb.ErrorCode_ERROR_CODE_TICKET_INVALID},
		{"tamper network", tamper(func(tk *meshp2pb.RouteTicket) { tk.Network = "other" }), opts, ErrTicketInvalid, meshp2pb.ErrorCode_ERROR_CODE_TICKET_INVALID},
		{"tamper fingerprint", tamper(func(tk *meshp2pb.RouteTicket) { tk.Route.ModelFingerprint = "bb" }), opts, ErrTicketInvalid, meshp2pb.ErrorCode_ERROR_CODE_TICKET_INVALID},
		{"tamper n_layer", tamper(func(tk *meshp2pb.RouteTicket) { tk.Route.NLayer = 5 }), opts, ErrTicketInvalid, meshp2pb.ErrorCode_ERROR_CODE_TICKET_INVALID},
		{"tamper epoch", tamper(func(tk *meshp2pb.RouteTicket) { tk.Route.Epoch = 2 }), opts, ErrTicketInvalid, meshp2pb.ErrorCode_ERROR_CODE_TICKET_INVALID},
		{"tamper hop peer", tamper(func(tk *meshp2pb.RouteTicket) { tk.Route.Hops[1].PeerId = []byte(other) }), opts, ErrTicketInvalid, meshp2pb.ErrorCode_ERROR_CODE_TICKET_INVALID},
		{"tamper hop range", tamper(func(tk *meshp2pb.RouteTicket) { tk.Route.Hops[0].End, tk.Route.Hops[1].Start = 1, 1 }), opts, ErrTicketInvalid, meshp2pb.ErrorCode_ERROR_CODE_TICKET_INVALID},
		{"tamper hop addrs", tamper(func(tk *meshp2pb.RouteTicket) { tk.Route.Hops[0].Addrs = []string{"/ip4/10.0.0.1/tcp/1"} }), opts, ErrTicketInvalid, meshp2pb.ErrorCode_ERROR_CODE_TICKET_INVALID},
		{"tamper client", tamper(func(tk *meshp2pb.RouteTicket) { tk.ClientPeerId = []byte(b) }), opts, ErrTicketInvalid, meshp2pb.ErrorCode_ERROR_CODE_TICKET_INVALID},
		{"tamper nonce", tamper(func(tk *meshp2pb.RouteTicket) { tk.Nonce[0] = 1 }), opts, ErrTicketInvalid, meshp2pb.ErrorCode_ERROR_CODE_TICKET_INVALID},
		{"tamper issued_at", tamper(func(tk *meshp2pb.RouteTicket) { tk.IssuedAtMs-- }), opts, ErrTicketInvalid, meshp2pb.ErrorCode_ERROR_CODE_TICKET_INVALID},
		{"tamper expires_at", tamper(func(tk *meshp2pb.RouteTicket) { tk.ExpiresAtMs += 3600e3 }), opts, ErrTicketInvalid, meshp2pb.ErrorCode_ERROR_CODE_TICKET_INVALID},
		{"tamper tracker id", tamper(func(tk *meshp2pb.RouteTicket) { tk.TrackerPeerId = []byte(other) }), opts, ErrTicketInvalid, meshp2pb.ErrorCode_ERROR_CODE_TICKET_INVALID},
		{"tamper signature", &meshp2pb.SignedRouteTicket{Ticket: good.Ticket, Signature: append([]byte{good.Signature[0] ^ 1}, good.Signature[1:]...)}, opts, ErrTicketInvalid, meshp2pb.ErrorCode_ERROR_CODE_TICKET_INVALID},
		{"garbage", &meshp2pb.SignedRouteTicket{Ticket: []byte{0xff, 0xff}, Signature: good.Signature}, opts, ErrTicketInvalid, meshp2pb.ErrorCode_ERROR_CODE_TICKET_INVALID},
		{"wrong signer", sign(otherKey, testTicket(other, []peer.ID{a, b}, now)), opts, ErrTicketUntrusted, meshp2pb.ErrorCode_ERROR_CODE_TICKET_UNTRUSTED},
		{"expired", sign(key, testTicket(tracker, []peer.ID{a, b}, now.Add(-time.Hour))), opts, ErrTicketExpired, meshp2pb.ErrorCode_ERROR_CODE_TICKET_EXPIRED},
		{"not yet valid", sign(key, testTicket(tracker, []peer.ID{a, b}, now.Add(time.Hour))), opts, ErrTicketExpired, meshp2pb.ErrorCode_ERROR_CODE_TICKET_EXPIRED},
		{"other model", good, VerifyOptions{Trusted: opts.Trusted, Network: "net", Fingerprint: "bb"}, ErrTicketModel, meshp2pb.ErrorCode_ERROR_CODE_MODEL_MISMATCH},
		{"other epoch", good, VerifyOptions{Trusted: opts.Trusted, Epoch: 2}, ErrNotInTicket, meshp2pb.ErrorCode_ERROR_CODE_NOT_IN_TICKET},
		{"other network", good, VerifyOptions{Network: "x"}, ErrTicketInvalid, meshp2pb.ErrorCode_ERROR_CODE_TICKET_INVALID},
		{"gap in route", sign(key, func() *meshp2pb.RouteTicket {
			tk := testTicket(tracker, []peer.ID{a, b}, now)
			tk.Route.Hops[1].Start = 3
			return tk
		}()), opts, ErrTicketInvalid, meshp2pb.ErrorCode_ERROR_CODE_TICKET_INVALID},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := VerifyTicket(c.st, c.opts)
			if !errors.Is(err, c.want) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
			if got := TicketCode(err); got != c.code {
				t.Fatalf("code %s, want %s", got, c.code)
			}
		})
	}
}

func TestSameRoute(t *testing.T) {
	_, tr := newKey(t)
	_, a := newKey(t)
	_, b := newKey(t)
	_, c := newKey(t)
	tk := testTicket(tr, []peer.ID{a, b}, time.Now()).Route
	same := proto.Clone(tk).(*meshp2pb.Route)
	same.Hops[0].Addrs = nil // addresses are hints
	if err := SameRoute(tk, same); err != nil {
		t.Fatal(err)
	}
	other := proto.Clone(tk).(*meshp2pb.Route)
	other.Hops[1].PeerId = []byte(c)
	if err := SameRoute(tk, other); !errors.Is(err, ErrNotInTicket) {
		t.Fatalf("hop not in ticket: %v", err)
	}
	model := proto.Clone(tk).(*meshp2pb.Route)
	model.ModelFingerprint = "cc"
	if err := SameRoute(tk, model); !errors.Is(err, ErrTicketModel) {
		t.Fatalf("other model: %v", err)
	}
}

// BenchmarkVerifyTicket: the cost a hop pays per admitted session.
func BenchmarkVerifyTicket(b *testing.B) {
	key, tracker := newKey(b)
	var hops []peer.ID
	for range 4 {
		_, h := newKey(b)
		hops = append(hops, h)
	}
	st, err := SignTicket(key, testTicket(tracker, hops, time.Now()))
	if err != nil {
		b.Fatal(err)
	}
	opts := VerifyOptions{Trusted: []peer.ID{tracker}, Network: "net", Fingerprint: testFP, NLayer: 8, Epoch: 1}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := VerifyTicket(st, opts); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSignTicket(b *testing.B) {
	key, tracker := newKey(b)
	_, h := newKey(b)
	tk := testTicket(tracker, []peer.ID{h, h, h, h}, time.Now())
	for b.Loop() {
		if _, err := SignTicket(key, tk); err != nil {
			b.Fatal(err)
		}
	}
}
