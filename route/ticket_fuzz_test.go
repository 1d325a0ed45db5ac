package route

import (
	"bytes"
	"crypto/ed25519"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// fuzzKey is a fixed tracker key, so fuzz inputs are reproducible.
func fuzzKey(t testing.TB) (crypto.PrivKey, peer.ID) {
	k, err := crypto.UnmarshalEd25519PrivateKey(ed25519.NewKeyFromSeed(bytes.Repeat([]byte{7}, 32)))
	if err != nil {
		t.Fatal(err)
	}
	id, _ := peer.IDFromPrivateKey(k)
	return k, id
}

// FuzzVerifyTicket feeds arbitrary bytes as a signed ticket (what a hop or
// origin receives in SessionOpen.ticket or a RouteResponse).
func FuzzVerifyTicket(f *testing.F) {
	key, tracker := fuzzKey(f)
	_, a := fuzzKey(f)
	st, err := SignTicket(key, testTicket(tracker, []peer.ID{a, tracker}, time.Now()))
	if err != nil {
		f.Fatal(err)
	}
	good, _ := proto.Marshal(st)
	f.Add(good)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, in []byte) {
		var st meshp2pb.SignedRouteTicket
		if proto.Unmarshal(in, &st) != nil {
			return
		}
		_, _ = VerifyTicket(&st, VerifyOptions{Network: "net", Fingerprint: testFP})
	})
}

// FuzzVerifySignedTicket signs arbitrary ticket bytes with a trusted key, so
// the checks after the signature (route cover, hop ids, validity window)
// see hostile content a compromised or buggy tracker could produce.
func FuzzVerifySignedTicket(f *testing.F) {
	key, tracker := fuzzKey(f)
	_, a := fuzzKey(f)
	b, _ := proto.Marshal(testTicket(tracker, []peer.ID{a, tracker}, time.Now()))
	f.Add(b)
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) > MaxTicketBytes {
			return
		}
		sig, err := key.Sign(signedBytes(in))
		if err != nil {
			t.Fatal(err)
		}
		rt, err := VerifyTicket(&meshp2pb.SignedRouteTicket{Ticket: in, Signature: sig}, VerifyOptions{Trusted: []peer.ID{tracker}})
		if err == nil && checkCover(rt.GetRoute()) != nil {
			t.Fatal("accepted a ticket whose route does not cover its layers")
		}
	})
}
