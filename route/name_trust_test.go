package route

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// A model name resolves to the fingerprint most distinct peers advertise
// under it: a stranger advertising another model under a popular name
// neither takes the name nor makes it unresolvable; an even split is
// ambiguous, and a fingerprint always reaches its model. Offers count for
// a name only when nobody serves a model under it (issue 37, row 8).
func TestNameTrustRule(t *testing.T) {
	fpA, fpB := strings.Repeat("a", 64), strings.Repeat("b", 64)
	type claim struct {
		fp    string
		peers int
		offer bool // an offer-only advert: no shard, only a model it could warm
	}
	for _, tc := range []struct {
		name   string
		claims []claim
		want   string // "" : ambiguous
	}{
		{"one model", []claim{{fpA, 3, false}}, fpA},
		{"a stranger's claim", []claim{{fpA, 3, false}, {fpB, 1, false}}, fpA},
		{"the stranger brings more peers", []claim{{fpA, 2, false}, {fpB, 5, false}}, fpB},
		{"an even split", []claim{{fpA, 2, false}, {fpB, 2, false}}, ""},
		// Offers cost nothing but an advert: free keys offering another
		// model under a served name neither tie nor take it.
		{"offers tie the served peers", []claim{{fpA, 3, false}, {fpB, 3, true}}, fpA},
		{"offers outnumber the served peers", []claim{{fpA, 3, false}, {fpB, 4, true}}, fpA},
		{"a served model offered too", []claim{{fpA, 1, false}, {fpA, 3, true}, {fpB, 2, true}}, fpA},
		{"offers only: the majority", []claim{{fpA, 1, true}, {fpB, 2, true}}, fpB},
		{"offers only: an even split", []claim{{fpA, 2, true}, {fpB, 2, true}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb := NewTable()
			n := 0
			for _, c := range tc.claims {
				for range c.peers {
					n++
					p := peer.ID(fmt.Sprintf("peer-%02d", n))
					if c.offer {
						b, _ := proto.Marshal(&meshp2pb.CapabilityAdvert{Offers: []*meshp2pb.ModelOffer{{ModelFingerprint: c.fp, ModelName: "popular", NLayer: 4}}})
						tb.noteExtras(p2p.Advert{Peer: p, Body: b})
						continue
					}
					tb.Set(p, []Shard{{Peer: p, Fingerprint: c.fp, ModelName: "popular", NLayer: 4, Start: 0, End: 4}})
				}
			}
			got, err := tb.Fingerprint("popular")
			if tc.want == "" {
				if !errors.Is(err, ErrAmbiguousModel) || !strings.Contains(err.Error(), "give the fingerprint") {
					t.Fatalf("Fingerprint = %q, %v: want ambiguous", got, err)
				}
			} else if err != nil || got != tc.want {
				t.Fatalf("Fingerprint = %.8q, %v: want %.8q", got, err, tc.want)
			}
			for _, c := range tc.claims {
				if got, err := tb.Fingerprint(c.fp); err != nil || got != c.fp {
					t.Fatalf("by fingerprint %.8q: %.8q, %v", c.fp, got, err)
				}
			}
		})
	}
}
