package placement

import (
	"math/rand/v2"
	"testing"
)

// Five nodes of 5–7 layers of a 12-layer model started together (the
// issue's start): how many settle on windows of at most 2 layers (no
// slack for a crash), over 200 seeds. Measured, not asserted beyond
// "every start covers the model".
func TestStartFragments(t *testing.T) {
	frag, total, heals := 0, 0, 0
	for seed := range uint64(200) {
		s := &sim{t: t, rng: rand.New(rand.NewPCG(seed, 77)), sz: uniformSizing(12), interval: 120, gapSince: -1}
		s.joinN(5, 6, 7, 5, 6)
		s.runUntil(10)
		if s.score().Deficit != 0 {
			t.Fatalf("seed %d: five nodes found no route", seed)
		}
		for _, n := range s.nodes {
			total++
			if n.cur.Len() <= 2 {
				frag++
			}
		}
		// Single crashes the survivors can heal without moving anyone:
		// the slack a start leaves.
		for _, n := range s.nodes {
			v := View{NLayer: 12}
			for _, o := range s.nodes {
				if o != n {
					v.Servers = append(v.Servers, Server{Peer: o.id, Range: o.cur})
				}
			}
			if v.Deficit() == 0 {
				heals++
			}
		}
	}
	t.Logf("windows of ≤ 2 layers: %d of %d (%.0f%%); single crashes that leave a route: %d of %d", frag, total, 100*float64(frag)/float64(total), heals, total)
}
