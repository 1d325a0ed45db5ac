package route

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// Lying adverts are dropped at decode, before anything is sized by them.
func TestDecodeAdvertBounds(t *testing.T) {
	fp := strings.Repeat("ab", 32)
	good := func() *meshp2pb.ShardAdvert {
		return &meshp2pb.ShardAdvert{ModelFingerprint: fp, ModelName: "m", NLayer: 32, Start: 0, End: 8, NEmbd: 4096,
			Capacity: &meshp2pb.ShardCapacity{MaxSessions: 8, FreeSessions: 8}, DecodeMsPerLayer: proto.Float32(0.5)}
	}
	ms := func(v float32) func(*meshp2pb.ShardAdvert) {
		return func(s *meshp2pb.ShardAdvert) { s.DecodeMsPerLayer = proto.Float32(v) }
	}
	for _, tc := range []struct {
		name string
		mod  func(*meshp2pb.ShardAdvert)
		ok   bool
	}{
		{"honest", func(*meshp2pb.ShardAdvert) {}, true},
		{"n_layer 2^32-1", func(s *meshp2pb.ShardAdvert) { s.NLayer, s.End = math.MaxUint32, math.MaxUint32 }, false},
		{"n_layer above llama.cpp's limit", func(s *meshp2pb.ShardAdvert) { s.NLayer = 513 }, false},
		{"n_layer 0", func(s *meshp2pb.ShardAdvert) { s.NLayer, s.End = 0, 0 }, false},
		{"empty range", func(s *meshp2pb.ShardAdvert) { s.End = 0 }, false},
		{"range past the model", func(s *meshp2pb.ShardAdvert) { s.End = 33 }, false},
		{"n_embd 0", func(s *meshp2pb.ShardAdvert) { s.NEmbd = 0 }, false},
		{"n_embd huge", func(s *meshp2pb.ShardAdvert) { s.NEmbd = 1 << 30 }, false},
		{"more free sessions than sessions", func(s *meshp2pb.ShardAdvert) { s.Capacity.FreeSessions = 1 << 20 }, false},
		{"absurd session count", func(s *meshp2pb.ShardAdvert) { s.Capacity.MaxSessions, s.Capacity.FreeSessions = 1<<20, 1<<20 }, false},
		{"NaN speed", ms(float32(math.NaN())), false},
		{"negative speed", ms(-1), false},
		{"infinite speed", ms(float32(math.Inf(1))), false},
		{"unknown speed (0)", ms(0), true},
		{"short fingerprint", func(s *meshp2pb.ShardAdvert) { s.ModelFingerprint = fp[:16] }, false},
		{"kernel class", func(s *meshp2pb.ShardAdvert) { s.KernelClass = "cpu/amd64/avx2+fma/llama.cpp@ec98e2002/fa" }, true},
		{"kernel class of 257 bytes", func(s *meshp2pb.ShardAdvert) { s.KernelClass = strings.Repeat("k", MaxKernelClass+1) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := good()
			tc.mod(s)
			err := checkShard(s)
			if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrBadAdvert)) {
				t.Fatalf("checkShard = %v, want ok=%v", err, tc.ok)
			}
			body, _ := proto.Marshal(&meshp2pb.CapabilityAdvert{Shards: []*meshp2pb.ShardAdvert{s, good()}})
			shards, err := DecodeAdvert(p2p.Advert{Peer: "p", Body: body})
			want := 1
			if tc.ok {
				want = 2
			}
			if err != nil || len(shards) != want {
				t.Fatalf("DecodeAdvert kept %d shards (%v), want %d (the bad one dropped, the rest kept)", len(shards), err, want)
			}
			if tc.ok && shards[0].KernelClass != s.GetKernelClass() {
				t.Fatalf("kernel class %q decoded as %q", s.GetKernelClass(), shards[0].KernelClass)
			}
		})
	}
}

// The layer count is what most peers advertise; a tie is refused.
func TestResolveLayerCountVote(t *testing.T) {
	fp := strings.Repeat("cd", 32)
	sh := func(p peer.ID, nl int) []Shard {
		return []Shard{{Peer: p, Fingerprint: fp, ModelName: "m", NLayer: nl, Start: 0, End: 1}}
	}
	tb := NewTable()
	tb.Set("a", sh("a", 5))
	tb.Set("b", sh("b", 5))
	tb.Set("liar", sh("liar", 500))
	if _, nl, err := tb.Resolve("m"); err != nil || nl != 5 {
		t.Fatalf("Resolve = %d, %v; want the majority's 5", nl, err)
	}
	tb.Set("liar2", sh("liar2", 500))
	if _, _, err := tb.Resolve("m"); !errors.Is(err, ErrUnknownModel) {
		t.Fatalf("tie resolved: %v", err)
	}
}

// Expired offers are not listed even when the removal event was lost, and
// a resync drops peers discovery no longer has and adds those it missed.
func TestTableExpiryAndResync(t *testing.T) {
	fp := strings.Repeat("ef", 32)
	tb := NewTable()
	tb.Set("dead", []Shard{{Peer: "dead", Fingerprint: fp, NLayer: 2, End: 2, ExpiresAt: time.Now().Add(-time.Second)}})
	if n := len(tb.Shards(fp)); n != 0 {
		t.Fatalf("expired shard listed (%d)", n)
	}
	tb.Set("gone", []Shard{{Peer: "gone", Fingerprint: fp, NLayer: 2, End: 2}})
	body, _ := proto.Marshal(&meshp2pb.CapabilityAdvert{Shards: []*meshp2pb.ShardAdvert{{ModelFingerprint: fp, NLayer: 2, End: 2, NEmbd: 8}}})
	tb.resync([]p2p.Advert{{Peer: "missed", Body: body, ExpiresAt: time.Now().Add(time.Minute)}})
	got := tb.Shards(fp)
	if len(got) != 1 || got[0].Peer != "missed" {
		t.Fatalf("after resync: %+v, want only the missed peer", got)
	}
}

// One advert listing many shards that claim another layer count is one
// peer's vote, not one vote per shard; and naming the model never depends
// on the vote (a tie still resolves the fingerprint).
func TestLayerCountOnePeerOneVote(t *testing.T) {
	fp := strings.Repeat("ab", 32)
	tb := NewTable()
	tb.Set("a", []Shard{{Peer: "a", Fingerprint: fp, ModelName: "m", NLayer: 8, Start: 0, End: 8}})
	tb.Set("b", []Shard{{Peer: "b", Fingerprint: fp, ModelName: "m", NLayer: 8, Start: 0, End: 4}})
	var lies []Shard
	for i := 0; i < 120; i++ {
		lies = append(lies, Shard{Peer: "liar", Fingerprint: fp, ModelName: "m", NLayer: 7, Start: i % 7, End: i%7 + 1})
	}
	tb.Set("liar", lies)
	if nl, err := tb.LayerCount(fp); err != nil || nl != 8 {
		t.Fatalf("LayerCount = %d, %v; want the two honest peers' 8 over one advert's 120 shards", nl, err)
	}
	tb.Set("liar2", []Shard{{Peer: "liar2", Fingerprint: fp, ModelName: "m", NLayer: 7, Start: 0, End: 1}})
	if _, err := tb.LayerCount(fp); !errors.Is(err, ErrUnknownModel) {
		t.Fatalf("tie counted: %v", err)
	}
	if got, err := tb.Fingerprint("m"); err != nil || got != fp {
		t.Fatalf("Fingerprint(m) = %q, %v during a layer-count tie; want %s", got, err, fp)
	}
}
