package p2p

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	pb "github.com/libp2p/go-libp2p-pubsub/pb"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/record"
	"github.com/multiformats/go-multiaddr"
)

// rawRecord signs arbitrary payload bytes under any domain and codec.
type rawRecord struct {
	domain  string
	codec   []byte
	payload []byte
}

func (r *rawRecord) Domain() string                 { return r.domain }
func (r *rawRecord) Codec() []byte                  { return r.codec }
func (r *rawRecord) MarshalRecord() ([]byte, error) { return r.payload, nil }
func (r *rawRecord) UnmarshalRecord(b []byte) error { r.payload = b; return nil }

type signer struct {
	key crypto.PrivKey
	id  peer.ID
}

func newSigner(t testing.TB) signer {
	t.Helper()
	k, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := peer.IDFromPrivateKey(k)
	return signer{k, id}
}

func TestValidator(t *testing.T) {
	now := time.Now()
	cfg := DiscoveryConfig{RepublishInterval: time.Minute}.withDefaults() // TTL 3 min, MaxAge 3 min
	alice, mallory := newSigner(t), newSigner(t)
	addr := multiaddr.StringCast("/ip4/127.0.0.1/tcp/4001")

	good := func(s signer, seq uint64) *advertRecord {
		return &advertRecord{
			domain: advertDomain("test"), Peer: s.id, Seq: seq,
			IssuedAt: now.Add(-time.Second), ExpiresAt: now.Add(time.Minute),
			Keys: []string{"fp"}, Body: []byte("BODYBODY"), Addrs: []multiaddr.Multiaddr{addr},
		}
	}
	seal := func(rec *advertRecord, s signer) []byte {
		env, err := sealAdvert(rec, s.key)
		if err != nil {
			t.Fatal(err)
		}
		return env
	}
	sealRaw := func(domain string, codec, payload []byte, s signer) []byte {
		env, err := record.Seal(&rawRecord{domain, codec, payload}, s.key)
		if err != nil {
			t.Fatal(err)
		}
		b, err := env.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	msg := func(from peer.ID, data []byte) *pubsub.Message {
		return &pubsub.Message{Message: &pb.Message{From: []byte(from), Data: data, Seqno: []byte{1}, Signature: []byte("sig")}}
	}
	with := func(mod func(r *advertRecord)) []byte {
		r := good(alice, 10)
		mod(r)
		return seal(r, alice)
	}
	goodPayload, _ := good(alice, 10).MarshalRecord()
	tampered := bytes.Replace(seal(good(alice, 10), alice), []byte("BODYBODY"), []byte("EVILBODY"), 1)

	tests := []struct {
		name string
		msg  *pubsub.Message
		want error // nil: accept
	}{
		{"valid", msg(alice.id, seal(good(alice, 10), alice)), nil},
		{"unsigned gossip message", &pubsub.Message{Message: &pb.Message{From: []byte(alice.id), Data: seal(good(alice, 11), alice)}}, ErrAdvertUnsigned},
		{"bare record, no envelope", msg(alice.id, goodPayload), ErrAdvertUnsigned},
		{"garbage", msg(alice.id, []byte("not protobuf \xff\xff\xff")), ErrAdvertUnsigned},
		{"tampered body", msg(alice.id, tampered), ErrAdvertBadSignature},
		{"signed for another network", msg(alice.id, sealRaw(advertDomain("other"), advertCodec, goodPayload, alice)), ErrAdvertBadSignature},
		{"wrong payload type", msg(alice.id, sealRaw(advertDomain("test"), []byte("/x"), goodPayload, alice)), ErrAdvertMalformed},
		{"payload not a record", msg(alice.id, sealRaw(advertDomain("test"), advertCodec, []byte{0x0a, 0xff}, alice)), ErrAdvertMalformed},
		{"missing seq", msg(alice.id, with(func(r *advertRecord) { r.Seq = 0 })), ErrAdvertMalformed},
		{"empty key", msg(alice.id, with(func(r *advertRecord) { r.Keys = []string{""} })), ErrAdvertMalformed},
		{"expires before issue", msg(alice.id, with(func(r *advertRecord) { r.ExpiresAt = r.IssuedAt.Add(-time.Second) })), ErrAdvertMalformed},
		{"body too large", msg(alice.id, with(func(r *advertRecord) { r.Body = make([]byte, cfg.MaxBody+1) })), ErrAdvertOversized},
		{"too many keys", msg(alice.id, with(func(r *advertRecord) {
			r.Keys = strings.Split(strings.Repeat("k,", cfg.MaxKeys+1), ",")[:cfg.MaxKeys+1]
		})), ErrAdvertOversized},
		{"key too long", msg(alice.id, with(func(r *advertRecord) { r.Keys = []string{strings.Repeat("k", cfg.MaxKeyLen+1)} })), ErrAdvertOversized},
		{"message too large", msg(alice.id, make([]byte, maxEnvelopeSize(cfg)+1)), ErrAdvertOversized},
		{"issued too long ago", msg(alice.id, with(func(r *advertRecord) { r.IssuedAt = now.Add(-cfg.MaxAge - time.Second) })), ErrAdvertStale},
		{"expired", msg(alice.id, with(func(r *advertRecord) { r.IssuedAt = now.Add(-time.Minute); r.ExpiresAt = now.Add(-time.Second) })), ErrAdvertStale},
		{"issued in the future", msg(alice.id, with(func(r *advertRecord) {
			r.IssuedAt = now.Add(cfg.ClockSkew + time.Minute)
			r.ExpiresAt = now.Add(time.Hour)
		})), ErrAdvertStale},
		{"author is not the signer", msg(mallory.id, seal(good(alice, 12), alice)), ErrAdvertSigner},
		{"advert for another peer", msg(mallory.id, seal(good(alice, 12), mallory)), ErrAdvertSigner},
		{"replay of accepted seq", msg(alice.id, seal(good(alice, 10), alice)), ErrAdvertReplayed},
		{"older seq", msg(alice.id, seal(good(alice, 9), alice)), ErrAdvertReplayed},
		{"newer seq", msg(alice.id, seal(good(alice, 11), alice)), nil},
	}
	d := &Discovery{checker: newAdvertChecker("test", cfg), log: testLogger()}
	for _, tt := range tests { // in order: the replay cases depend on "valid"
		t.Run(tt.name, func(t *testing.T) {
			_, err := d.checkMessage(tt.msg, now)
			if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Fatalf("checkMessage error = %v, want %v", err, tt.want)
			}
		})
	}

	// The gossip validator maps the errors to pubsub decisions.
	d2 := &Discovery{checker: newAdvertChecker("test", cfg), log: testLogger()}
	freshMsg := msg(alice.id, seal(good(alice, 100), alice))
	if r := d2.validate(t.Context(), alice.id, freshMsg); r != pubsub.ValidationAccept {
		t.Fatalf("valid advert: %v, want accept", r)
	}
	if _, ok := freshMsg.ValidatorData.(*advertRecord); !ok {
		t.Fatal("accepted message carries no decoded advert")
	}
	if r := d2.validate(t.Context(), alice.id, msg(alice.id, seal(good(alice, 100), alice))); r != pubsub.ValidationIgnore {
		t.Fatalf("replay: %v, want ignore", r)
	}
	if r := d2.validate(t.Context(), alice.id, msg(mallory.id, seal(good(alice, 101), alice))); r != pubsub.ValidationReject {
		t.Fatalf("forged author: %v, want reject", r)
	}
	// A clock a minute fast makes adverts "stale": dropped, but not
	// rejected (rejection would graylist an honest peer).
	future := good(alice, 200)
	future.IssuedAt, future.ExpiresAt = now.Add(cfg.ClockSkew+time.Minute), now.Add(time.Hour)
	if r := d2.validate(t.Context(), alice.id, msg(alice.id, seal(future, alice))); r != pubsub.ValidationIgnore {
		t.Fatalf("advert from a fast clock: %v, want ignore", r)
	}
}

// One author cannot flood the topic: a burst of adverts passes, the rest
// is dropped until the bucket refills; a withdrawal always passes.
func TestAdvertAuthorRateLimit(t *testing.T) {
	now := time.Now()
	cfg := DefaultDiscoveryConfig()
	c := newAdvertChecker("test", cfg)
	flooder := newSigner(t)
	advert := func(seq uint64, at time.Time, withdrawn bool) []byte {
		env, err := sealAdvert(&advertRecord{domain: advertDomain("test"), Peer: flooder.id, Seq: seq,
			IssuedAt: at, ExpiresAt: at.Add(time.Minute), Withdrawn: withdrawn}, flooder.key)
		if err != nil {
			t.Fatal(err)
		}
		return env
	}
	accepted := 0
	for i := range 3 * authorBurst {
		if _, err := c.accept(flooder.id, advert(uint64(i+1), now, false), now); err == nil {
			accepted++
		} else if !errors.Is(err, ErrAdvertRateLimited) {
			t.Fatal(err)
		}
	}
	if accepted != authorBurst {
		t.Fatalf("%d of %d back-to-back adverts accepted, want the burst of %d", accepted, 3*authorBurst, authorBurst)
	}
	if _, err := c.accept(flooder.id, advert(1000, now, true), now); err != nil {
		t.Fatalf("withdrawal refused while rate limited: %v", err)
	}
	later := now.Add(3 * authorRefill)
	accepted = 0
	for i := range 10 {
		if _, err := c.accept(flooder.id, advert(uint64(2000+i), later, false), later); err == nil {
			accepted++
		}
	}
	if accepted != 3 {
		t.Fatalf("after %v, %d adverts accepted, want 3 (one per %v)", 3*authorRefill, accepted, authorRefill)
	}
}

// The replay state is bounded: past maxSeqState peers, the least recently
// heard is forgotten.
func TestReplayStateBounded(t *testing.T) {
	now := time.Now()
	c := newAdvertChecker("test", DefaultDiscoveryConfig())
	for i := range maxSeqState {
		c.lastSeq.Put(peer.ID(fmt.Sprintf("fake-%d", i)), seqSeen{seq: 1, at: now.Add(-time.Hour + time.Duration(i)*time.Millisecond)})
	}
	s := newSigner(t)
	env, err := sealAdvert(&advertRecord{domain: advertDomain("test"), Peer: s.id, Seq: 1, IssuedAt: now, ExpiresAt: now.Add(time.Minute)}, s.key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.accept(s.id, env, now); err != nil {
		t.Fatal(err)
	}
	if c.lastSeq.Len() != maxSeqState {
		t.Fatalf("replay state holds %d peers, want the cap %d", c.lastSeq.Len(), maxSeqState)
	}
	if _, ok := c.lastSeq.Peek("fake-0"); ok {
		t.Fatal("the least recently heard peer was kept")
	}
}

func TestAdvertRecordRoundTrip(t *testing.T) {
	s := newSigner(t)
	in := &advertRecord{
		domain: advertDomain("n"), Peer: s.id, Seq: 42,
		IssuedAt: time.UnixMilli(1_700_000_000_000), ExpiresAt: time.UnixMilli(1_700_000_060_000),
		Keys: []string{"a", "b"}, Body: []byte{0, 1, 2}, Addrs: []multiaddr.Multiaddr{multiaddr.StringCast("/ip4/1.2.3.4/udp/1/quic-v1")},
		Withdrawn: true,
	}
	b, err := in.MarshalRecord()
	if err != nil {
		t.Fatal(err)
	}
	// An unknown field (number 99) must be skipped, for forward compatibility.
	b = append(b, 0x9a, 0x06, 0x01, 'x')
	out := &advertRecord{domain: in.domain}
	if err := out.UnmarshalRecord(b); err != nil {
		t.Fatal(err)
	}
	if out.Peer != in.Peer || out.Seq != in.Seq || !out.IssuedAt.Equal(in.IssuedAt) || !out.ExpiresAt.Equal(in.ExpiresAt) ||
		strings.Join(out.Keys, ",") != "a,b" || !bytes.Equal(out.Body, in.Body) || len(out.Addrs) != 1 ||
		!out.Addrs[0].Equal(in.Addrs[0]) || !out.Withdrawn {
		t.Fatalf("round trip: got %+v, want %+v", out, in)
	}
}

// FuzzAdvertEnvelope feeds arbitrary bytes to the advert checker (what
// gossip, the advert protocol and pull-on-connect hand it).
func FuzzAdvertEnvelope(f *testing.F) {
	cfg := DefaultDiscoveryConfig()
	s := newSigner(f)
	now := time.Unix(1_800_000_000, 0)
	env, err := sealAdvert(&advertRecord{domain: advertDomain("test"), Peer: s.id, Seq: 1, IssuedAt: now, ExpiresAt: now.Add(time.Minute),
		Keys: []string{"k"}, Body: []byte("body"), Addrs: []multiaddr.Multiaddr{multiaddr.StringCast("/ip4/127.0.0.1/tcp/1")}}, s.key)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(env)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, in []byte) {
		c := newAdvertChecker("test", cfg)
		signer, err := envelopeSigner(in)
		if err != nil {
			return
		}
		rec, err := c.open(signer, in, now)
		if err != nil {
			return
		}
		if rec.Peer != signer || len(rec.Body) > cfg.MaxBody || len(rec.Keys) > cfg.MaxKeys || len(rec.Addrs) > maxAdvertAddrs {
			t.Fatalf("accepted an advert over its bounds or for another peer: %+v", rec)
		}
	})
}
