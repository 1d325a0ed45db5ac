package route

import (
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// Both planners filter candidates with usable: one capacity rule.
func TestUsable(t *testing.T) {
	req := Request{NLayer: 6, NeedKV: 100, Exclude: map[peer.ID]bool{"x": true}}
	capa := func(free uint32, kv uint64, nctx uint32) *meshp2pb.ShardCapacity {
		return &meshp2pb.ShardCapacity{FreeSessions: free, MaxSessions: 4, FreeKvTokens: kv, NCtx: nctx}
	}
	for _, tc := range []struct {
		name string
		s    Shard
		want bool
	}{
		{"no capacity advertised", Shard{Peer: "a", NLayer: 6, Start: 0, End: 3}, true},
		{"room", Shard{Peer: "a", NLayer: 6, Start: 0, End: 3, Capacity: capa(1, 100, 512)}, true},
		{"unknown n_ctx", Shard{Peer: "a", NLayer: 6, Start: 0, End: 3, Capacity: capa(1, 100, 0)}, true},
		{"excluded", Shard{Peer: "x", NLayer: 6, Start: 0, End: 3}, false},
		{"other layer count", Shard{Peer: "a", NLayer: 7, Start: 0, End: 3}, false},
		{"outside the model", Shard{Peer: "a", NLayer: 6, Start: 3, End: 7}, false},
		{"empty range", Shard{Peer: "a", NLayer: 6, Start: 3, End: 3}, false},
		{"no free session", Shard{Peer: "a", NLayer: 6, Start: 0, End: 3, Capacity: capa(0, 1000, 512)}, false},
		{"no free KV", Shard{Peer: "a", NLayer: 6, Start: 0, End: 3, Capacity: capa(1, 99, 512)}, false},
		{"context too small", Shard{Peer: "a", NLayer: 6, Start: 0, End: 3, Capacity: capa(1, 1000, 64)}, false},
	} {
		if got := usable(tc.s, req); got != tc.want {
			t.Errorf("%s: usable = %v, want %v", tc.name, got, tc.want)
		}
	}
}
