package placement

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// layers is a uniformSizing budget that holds k middle layers.
func layers(sz Sizing, k int) int64 { return sz.FixedBytes + int64(k)*(90+10) }

// applied is the view of members after plan.
func applied(sz Sizing, ms []Member, p HealPlan) View {
	v := View{NLayer: sz.NLayer}
	for _, m := range ms {
		r := m.Range
		if to, ok := p.Moves[m.Peer]; ok {
			r = to
		}
		if r.Len() > 0 {
			v.Servers = append(v.Servers, Server{Peer: m.Peer, Range: r})
		}
	}
	return v
}

func TestHeal(t *testing.T) {
	sz := uniformSizing(12)
	for _, tc := range []struct {
		name     string
		members  []Member
		moves    int // -1: no plan
		moveable []string
	}{
		{"route exists", []Member{{"a", Range{0, 6}, layers(sz, 7)}, {"b", Range{6, 12}, layers(sz, 7)}}, 0, nil},
		// The survivors: 7-12, 6-7, 1-6, budgets of 5-6 layers;
		// no single move closes 0-1 without opening another gap.
		{"issue survivors", []Member{{"a", Range{7, 12}, layers(sz, 5) + 60}, {"b", Range{6, 7}, layers(sz, 5)}, {"c", Range{1, 6}, layers(sz, 5)}}, 2, []string{"b", "c"}},
		{"fixed windows stay", []Member{{"f", Range{0, 4}, 0}, {"a", Range{8, 12}, layers(sz, 4) + 60}, {"b", Range{2, 3}, layers(sz, 4)}}, 1, []string{"b"}},
		{"too little memory", []Member{{"a", Range{0, 3}, layers(sz, 3) + 50}, {"b", Range{3, 6}, layers(sz, 3)}}, -1, nil},
		{"replica moves, chain kept", []Member{{"a", Range{0, 5}, layers(sz, 5) + 50}, {"b", Range{0, 5}, layers(sz, 6)}, {"c", Range{7, 12}, layers(sz, 5) + 60}}, 1, []string{"b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Heal(sz, tc.members)
			if tc.moves < 0 {
				if err == nil {
					t.Fatalf("plan %s for budgets that cannot hold a route", p)
				}
				t.Log(err)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(p.Moves) != tc.moves {
				t.Fatalf("plan %s moves %d nodes, want %d", p, len(p.Moves), tc.moves)
			}
			for _, id := range tc.moveable {
				if _, ok := p.Moves[id]; !ok {
					t.Fatalf("plan %s does not move %s", p, id)
				}
			}
			if d := applied(sz, tc.members, p).Deficit(); d != 0 {
				t.Fatalf("plan %s leaves %d layers off the route", p, d)
			}
			t.Log(p)
		})
	}
}

// Random swarms: whenever the members' budgets can hold a route at all
// (every one movable, from nothing), Heal finds a plan; the plan builds a
// route, fits every moved member's budget, never moves a fixed member, and
// is the same whatever order the members come in.
func TestHealRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(22, 22))
	for i := range 2000 {
		sz := uniformSizing(4 + rng.IntN(29))
		var ms []Member
		for j := range 2 + rng.IntN(7) {
			m := Member{Peer: fmt.Sprintf("p%d", j)}
			if rng.IntN(5) > 0 {
				m.Budget = layers(sz, 1+rng.IntN(sz.NLayer)) + 110
			}
			if rng.IntN(4) > 0 {
				s := rng.IntN(sz.NLayer)
				m.Range = Range{s, s + 1 + rng.IntN(sz.NLayer-s)}
			}
			ms = append(ms, m)
		}
		p, err := Heal(sz, ms)
		var free []Member
		for _, m := range ms {
			if m.Budget > 0 {
				free = append(free, Member{Peer: m.Peer, Budget: m.Budget})
			}
		}
		if _, ferr := Heal(sz, free); ferr == nil && err != nil {
			t.Fatalf("case %d: budgets hold a route, yet no plan: %v (%+v)", i, err, ms)
		}
		if err != nil {
			continue
		}
		if d := applied(sz, ms, p).Deficit(); d != 0 {
			t.Fatalf("case %d: plan %s leaves %d layers off (%+v)", i, p, d, ms)
		}
		for _, m := range ms {
			to, ok := p.Moves[m.Peer]
			if ok && (m.Budget <= 0 || sz.Need(to) > m.Budget) {
				t.Fatalf("case %d: plan moves %+v to %s", i, m, to)
			}
		}
		shuffled := append([]Member(nil), ms...)
		rng.Shuffle(len(shuffled), func(a, b int) { shuffled[a], shuffled[b] = shuffled[b], shuffled[a] })
		if q, _ := Heal(sz, shuffled); q.String() != p.String() {
			t.Fatalf("case %d: the plan depends on member order: %s vs %s", i, p, q)
		}
	}
}

// A peer that a heal plan moves but that never takes its window (it
// cannot get the layers) is planned around after HealStuckChecks checks,
// and the plan moves others instead.
func TestHealPlansAroundStuckPeer(t *testing.T) {
	sz := uniformSizing(12)
	// Layers 4-10 are missing. This node (0-4, room for 4) cannot close
	// the gap alone; the plan moves x (10-12, room for 8) to 4-12. x never
	// moves, so the plan turns to c (a replica of 0-4 with room for 6):
	// c → 4-10.
	view := View{NLayer: 12, Servers: []Server{
		{Peer: "x", Range: Range{10, 12}, Budget: layers(sz, 8) + 60},
		{Peer: "c", Range: Range{0, 4}, Budget: layers(sz, 6)},
	}}
	b := NewRebalancer(sz, layers(sz, 4)+50, rand.New(rand.NewPCG(1, 1)))
	var first, last string
	for i := range HealStuckChecks + 2 {
		d := b.Check(view, "me", Range{0, 4}, 1)
		if d.Plan == nil {
			t.Fatalf("check %d: no plan: %s", i, d.Why)
		}
		if i == 0 {
			first = d.Plan.String()
		}
		last = d.Plan.String()
	}
	if first == last {
		t.Fatalf("the plan %s still moves the peer that never moved", last)
	}
	t.Logf("plan %s, then around the stuck peer: %s", first, last)
}
