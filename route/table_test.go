package route

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// Advert bodies come from other peers: decoding never panics and never
// lets a malformed shard entry into the table.
func FuzzDecodeAdvert(f *testing.F) {
	good := strings.Repeat("ab", 32)
	for _, sa := range []*meshp2pb.ShardAdvert{
		{ModelFingerprint: good, NLayer: 6, Start: 0, End: 3},
		{ModelFingerprint: good, NLayer: 6, Start: 4, End: 3},
		{ModelFingerprint: "../x", NLayer: 6, Start: 0, End: 6},
		{ModelFingerprint: good, NLayer: 2, Start: 0, End: 6},
	} {
		b, _ := proto.Marshal(&meshp2pb.CapabilityAdvert{Shards: []*meshp2pb.ShardAdvert{sa}})
		f.Add(b)
	}
	f.Add([]byte{0x42, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, body []byte) {
		shards, err := DecodeAdvert(p2p.Advert{Peer: "p", Body: body})
		if err != nil {
			return
		}
		for _, s := range shards {
			if s.End <= s.Start || s.End > s.NLayer || !ValidFingerprint(s.Fingerprint) {
				t.Fatalf("malformed shard admitted: %+v", s)
			}
		}
	})
}

func TestValidFingerprint(t *testing.T) {
	for _, tc := range []struct {
		fp string
		ok bool
	}{
		{strings.Repeat("0f", 32), true},
		{strings.Repeat("0F", 32), false},
		{strings.Repeat("0f", 31), false},
		{strings.Repeat("0f", 31) + "/x", false},
		{"", false},
	} {
		if got := ValidFingerprint(tc.fp); got != tc.ok {
			t.Errorf("ValidFingerprint(%q) = %v", tc.fp, got)
		}
	}
}

// A node that serves layers but lists none yet is choosing its window; a
// client, or a node with shards, is not.
func TestChoosing(t *testing.T) {
	advert := func(roles []meshp2pb.Role, shards ...*meshp2pb.ShardAdvert) p2p.Advert {
		b, err := proto.Marshal(&meshp2pb.CapabilityAdvert{Roles: roles, Shards: shards})
		if err != nil {
			t.Fatal(err)
		}
		return p2p.Advert{Body: b}
	}
	shard := []meshp2pb.Role{meshp2pb.Role_ROLE_SHARD}
	if !Choosing(advert(shard)) {
		t.Error("a shard node with no shards is not choosing")
	}
	if Choosing(advert(shard, &meshp2pb.ShardAdvert{Start: 0, End: 3, NLayer: 5})) {
		t.Error("a node with a shard is choosing")
	}
	if Choosing(advert([]meshp2pb.Role{meshp2pb.Role_ROLE_CLIENT})) || Choosing(p2p.Advert{Body: []byte{0xff}}) {
		t.Error("a client, or garbage, is choosing")
	}
}
