package route

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"
)

// A model name resolves to the fingerprint most distinct peers advertise
// under it: a stranger advertising another model under a popular name
// neither takes the name nor makes it unresolvable; an even split is
// ambiguous, and a fingerprint always reaches its model.
func TestNameTrustRule(t *testing.T) {
	fpA, fpB := strings.Repeat("a", 64), strings.Repeat("b", 64)
	type claim struct {
		fp    string
		peers int
	}
	for _, tc := range []struct {
		name   string
		claims []claim
		want   string // "" : ambiguous
	}{
		{"one model", []claim{{fpA, 3}}, fpA},
		{"a stranger's claim", []claim{{fpA, 3}, {fpB, 1}}, fpA},
		{"the stranger brings more peers", []claim{{fpA, 2}, {fpB, 5}}, fpB},
		{"an even split", []claim{{fpA, 2}, {fpB, 2}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb := NewTable()
			n := 0
			for _, c := range tc.claims {
				for range c.peers {
					n++
					p := peer.ID(fmt.Sprintf("peer-%02d", n))
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
