package session

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

func authOpen() *meshp2pb.SessionOpen {
	return &meshp2pb.SessionOpen{SessionId: make([]byte, 16), Epoch: 3, ModelFingerprint: fakeFP, NCtxNeeded: 64, MaxTokens: 8,
		Route: &meshp2pb.Route{ModelFingerprint: fakeFP, NLayer: fakeNLay, Epoch: 3, Hops: []*meshp2pb.RouteHop{
			{PeerId: []byte("a"), Start: 0, End: 2}, {PeerId: []byte("b"), Start: 2, End: 6}}}}
}

// Every key type libp2p identities use signs and verifies; the ones whose
// peer id does not embed the key (RSA) carry it, and it must be the id's.
func TestSignOpenKeyTypes(t *testing.T) {
	for _, tc := range []struct {
		name    string
		typ     int
		bits    int
		carries bool // origin_public_key set
	}{
		{"ed25519", crypto.Ed25519, 0, false},
		{"secp256k1", crypto.Secp256k1, 0, false},
		{"ecdsa", crypto.ECDSA, 0, true},
		{"rsa", crypto.RSA, 2048, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key, _, err := crypto.GenerateKeyPairWithReader(tc.typ, tc.bits, rand.Reader)
			if err != nil {
				t.Fatal(err)
			}
			open := authOpen()
			if err := SignOpen(open, key, time.Now()); err != nil {
				t.Fatal(err)
			}
			if got := len(open.GetOriginPublicKey()) > 0; got != tc.carries {
				t.Fatalf("origin_public_key set: %v, want %v", got, tc.carries)
			}
			id, err := VerifyOpenOrigin(open)
			if want, _ := peer.IDFromPrivateKey(key); err != nil || id != want {
				t.Fatalf("verify: %s, %v; want %s", id, err, want)
			}
			// Non-signed fields may change on the way (hop_index).
			open.HopIndex = 1
			if _, err := VerifyOpenOrigin(open); err != nil {
				t.Fatalf("unsigned fields changed: %v", err)
			}
			if tc.carries { // another key in origin_public_key
				other, _, _ := crypto.GenerateEd25519Key(rand.Reader)
				o := proto.Clone(open).(*meshp2pb.SessionOpen)
				o.OriginPublicKey, _ = crypto.MarshalPublicKey(other.GetPublic())
				if _, err := VerifyOpenOrigin(o); !errors.Is(err, ErrOriginAuth) {
					t.Fatalf("a foreign public key verified: %v", err)
				}
			}
		})
	}
}

// Changing any signed field breaks the signature.
func TestSignedFields(t *testing.T) {
	key, _, _ := crypto.GenerateEd25519Key(rand.Reader)
	for _, tc := range []struct {
		name   string
		change func(o *meshp2pb.SessionOpen)
	}{
		{"session id", func(o *meshp2pb.SessionOpen) { o.SessionId[0] ^= 1 }},
		{"epoch", func(o *meshp2pb.SessionOpen) { o.Epoch++ }},
		{"fingerprint", func(o *meshp2pb.SessionOpen) { o.ModelFingerprint += "0" }},
		{"route n_layer", func(o *meshp2pb.SessionOpen) { o.Route.NLayer++ }},
		{"route epoch", func(o *meshp2pb.SessionOpen) { o.Route.Epoch++ }},
		{"hop peer", func(o *meshp2pb.SessionOpen) { o.Route.Hops[1].PeerId = []byte("c") }},
		{"hop range", func(o *meshp2pb.SessionOpen) { o.Route.Hops[0].End, o.Route.Hops[1].Start = 3, 3 }},
		{"hop added", func(o *meshp2pb.SessionOpen) {
			o.Route.Hops = append(o.Route.Hops, &meshp2pb.RouteHop{PeerId: []byte("d"), Start: 6, End: 6})
		}},
		{"n_ctx_needed", func(o *meshp2pb.SessionOpen) { o.NCtxNeeded++ }},
		{"max_tokens", func(o *meshp2pb.SessionOpen) { o.MaxTokens++ }},
		{"issued_at", func(o *meshp2pb.SessionOpen) { o.IssuedAtMs++ }},
		// What the tail samples with and what an audit replays.
		{"sampling", func(o *meshp2pb.SessionOpen) { o.Sampling = &meshp2pb.SamplingParams{Temperature: 0.5} }},
		{"generated", func(o *meshp2pb.SessionOpen) { o.Generated = append(o.Generated, 7) }},
		{"speculation", func(o *meshp2pb.SessionOpen) {
			o.Speculation = &meshp2pb.Speculation{Mode: meshp2pb.SpecMode_SPEC_MODE_NGRAM}
		}},
		{"wire dtype", func(o *meshp2pb.SessionOpen) { o.WireDtype = meshp2pb.DType_DTYPE_F16 }},
		{"transcripts", func(o *meshp2pb.SessionOpen) { o.Transcripts = !o.Transcripts }},
		{"origin", func(o *meshp2pb.SessionOpen) {
			k, _, _ := crypto.GenerateEd25519Key(rand.Reader)
			id, _ := peer.IDFromPrivateKey(k)
			o.OriginPeerId = []byte(id)
		}},
		{"signature", func(o *meshp2pb.SessionOpen) { o.OriginSignature[0] ^= 1 }},
		{"no signature", func(o *meshp2pb.SessionOpen) { o.OriginSignature = nil }},
		{"garbage origin id", func(o *meshp2pb.SessionOpen) { o.OriginPeerId = []byte{0xff} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			open := authOpen()
			if err := SignOpen(open, key, time.Now()); err != nil {
				t.Fatal(err)
			}
			tc.change(open)
			if _, err := VerifyOpenOrigin(open); !errors.Is(err, ErrOriginAuth) {
				t.Fatalf("verified after changing the %s: %v", tc.name, err)
			}
		})
	}
}

// The replay memory admits each key once while fresh, forgets it after,
// and refuses new opens rather than forget fresh ones when full.
func TestOriginGuardMemory(t *testing.T) {
	now := time.Unix(1e9, 0)
	g := newOriginGuard(time.Minute, time.Second, 3, 2, func() time.Time { return now })
	k := func(o peer.ID, e uint64) Key { return Key{Origin: o, Epoch: e} }
	if err := g.use(k("o", 1), now, true); err != nil {
		t.Fatal(err)
	}
	if err := g.use(k("o", 1), now, true); !errors.Is(err, ErrOriginAuth) {
		t.Fatalf("replay admitted: %v", err)
	}
	if err := g.use(k("o", 2), now, true); err != nil {
		t.Fatal(err)
	}
	if err := g.use(k("o", 3), now, true); !errors.Is(err, errOpenMemoryFull) {
		t.Fatalf("one origin over its share: %v", err)
	}
	if err := g.use(k("t", 1), now, false); err != nil { // another origin still gets in
		t.Fatal(err)
	}
	if err := g.use(k("p", 1), now, true); !errors.Is(err, errOpenMemoryFull) {
		t.Fatalf("full memory: %v", err)
	}
	now = now.Add(time.Minute + 3*time.Second) // every entry stale
	if err := g.use(k("o", 3), now, true); err != nil {
		t.Fatalf("stale entries not dropped: %v", err)
	}
	if g.counts["o"] != 1 || len(g.counts) != 1 {
		t.Fatalf("per-origin counts after the sweep: %v", g.counts)
	}
}

// VerifyOpenOrigin takes any SessionOpen a peer sends: it must never
// panic, and whatever it accepts must really be signed by its origin.
func FuzzVerifyOpenOrigin(f *testing.F) {
	key, _, _ := crypto.GenerateEd25519Key(rand.Reader)
	open := authOpen()
	_ = SignOpen(open, key, time.Unix(1e9, 0))
	b, _ := proto.Marshal(open)
	f.Add(b)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		var o meshp2pb.SessionOpen
		if proto.Unmarshal(b, &o) != nil {
			return
		}
		id, err := VerifyOpenOrigin(&o)
		if err != nil {
			if !errors.Is(err, ErrOriginAuth) {
				t.Fatalf("unwrapped error: %v", err)
			}
			return
		}
		if id != peer.ID(o.GetOriginPeerId()) {
			t.Fatalf("verified origin %s, open names %x", id, o.GetOriginPeerId())
		}
	})
}
