package client

import (
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/route"
	"github.com/neuron-tai/meshp2p/session"
)

// The vocabulary is asked of peers the failure memory avoids last, and of
// peers without it never.
func TestVocabSourcesAvoidLast(t *testing.T) {
	const fp = "fp"
	tab := route.NewTable()
	liar, honest, other, novocab := peer.ID("liar"), peer.ID("honest"), peer.ID("other"), peer.ID("novocab")
	for _, p := range []peer.ID{liar, honest, other} {
		tab.Set(p, []route.Shard{{Peer: p, Fingerprint: fp, NLayer: 4, End: 4, HasVocab: true}})
	}
	tab.Set(novocab, []route.Shard{{Peer: novocab, Fingerprint: fp, NLayer: 4, End: 4}})
	mem := session.NewFailureMemory(0, 0)
	mem.Blame(liar)
	for _, tc := range []struct {
		name   string
		origin *session.Origin
		last   bool // the liar comes last
	}{
		{"no origin", nil, false},
		{"no memory", &session.Origin{}, false},
		{"memory", &session.Origin{Failures: mem}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for range 20 { // the table's order is a map's
				c := &Client{cfg: Config{Table: tab, Origin: tc.origin}}
				got := c.vocabSources(fp)
				if len(got) != 3 {
					t.Fatalf("sources %v: want the three holding the vocabulary", got)
				}
				if tc.last && got[2].Peer != liar {
					t.Fatalf("sources %v: the avoided peer is not last", got)
				}
			}
		})
	}
}
