package route

import (
	"crypto/rand"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// Only a trusted tracker's published convictions drop a peer's shards: a
// stranger's advert listing honest peers as convicted changes nothing.
func TestTableHonoursTrustedConvictions(t *testing.T) {
	fp := strings.Repeat("ab", 32)
	shardBody := func(p peer.ID) []byte {
		b, _ := proto.Marshal(&meshp2pb.CapabilityAdvert{PeerId: []byte(p), Shards: []*meshp2pb.ShardAdvert{{ModelFingerprint: fp, NLayer: 4, Start: 0, End: 4, NEmbd: 8,
			Capacity: &meshp2pb.ShardCapacity{MaxSessions: 1, FreeSessions: 1}}}})
		return b
	}
	convicts := func(ps ...peer.ID) []byte {
		ad := &meshp2pb.CapabilityAdvert{Roles: []meshp2pb.Role{meshp2pb.Role_ROLE_TRACKER}}
		for _, p := range ps {
			ad.Convicted = append(ad.Convicted, &meshp2pb.Conviction{PeerId: []byte(p)})
		}
		b, _ := proto.Marshal(ad)
		return b
	}
	exp := time.Now().Add(time.Minute)
	id := func() peer.ID {
		k, _, _ := crypto.GenerateEd25519Key(rand.Reader)
		p, _ := peer.IDFromPrivateKey(k)
		return p
	}
	honest, cheat, stranger, tracker := id(), id(), id(), id()
	tb := NewTable()
	tb.TrustConvictions(tracker)
	tb.resync([]p2p.Advert{
		{Peer: honest, Body: shardBody(honest), ExpiresAt: exp},
		{Peer: cheat, Body: shardBody(cheat), ExpiresAt: exp},
		{Peer: stranger, Body: convicts(honest), ExpiresAt: exp},
	})
	if n := len(tb.Shards(fp)); n != 2 || tb.Convicted(honest) {
		t.Fatalf("a stranger's convictions counted: %d shards", n)
	}
	tb.resync([]p2p.Advert{
		{Peer: honest, Body: shardBody(honest), ExpiresAt: exp},
		{Peer: cheat, Body: shardBody(cheat), ExpiresAt: exp},
		{Peer: tracker, Body: convicts(cheat), ExpiresAt: exp},
	})
	ss := tb.Shards(fp)
	if len(ss) != 1 || ss[0].Peer != honest || !tb.Convicted(cheat) {
		t.Fatalf("shards after the trusted tracker's conviction: %v", ss)
	}
}
