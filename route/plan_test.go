package route

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

const fp = "f00d"

func offer(id string, s, e int, reach p2p.Path, free uint32) Shard {
	return Shard{Peer: peer.ID(id), Fingerprint: fp, NLayer: 6, Start: s, End: e, Reach: reach,
		Capacity: &meshp2pb.ShardCapacity{FreeSessions: free, MaxSessions: 4, FreeKvTokens: 4096, NCtx: 4096}}
}

func table(offers ...Shard) *Table {
	t := NewTable()
	by := map[peer.ID][]Shard{}
	for _, o := range offers {
		by[o.Peer] = append(by[o.Peer], o)
	}
	for p, ss := range by {
		t.Set(p, ss)
	}
	return t
}

func hops(r *Route) string {
	s := ""
	for _, h := range r.Hops {
		s += fmt.Sprintf("%s[%d,%d) ", string(h.Peer), h.Start, h.End)
	}
	return s
}

func TestPlan(t *testing.T) {
	D, R := p2p.PathDirect, p2p.PathRelayed
	cases := []struct {
		name    string
		offers  []Shard
		exclude []string
		maxHops int
		want    string // hops, or "gap a-b"
	}{
		{"exact three", []Shard{offer("a", 0, 2, D, 4), offer("b", 2, 4, D, 4), offer("c", 4, 6, D, 4)}, nil, 0, "a[0,2) b[2,4) c[4,6) "},
		{"fewer hops win", []Shard{offer("a", 0, 2, D, 4), offer("b", 2, 4, D, 4), offer("c", 4, 6, D, 4), offer("w", 0, 6, D, 4)}, nil, 0, "w[0,6) "},
		{"overlapping ranges join end to start", []Shard{offer("a", 0, 3, D, 4), offer("b", 2, 6, D, 4), offer("c", 3, 6, D, 4)}, nil, 0, "a[0,3) c[3,6) "},
		{"direct over relayed", []Shard{offer("a", 0, 3, D, 4), offer("r", 3, 6, R, 4), offer("d", 3, 6, D, 4)}, nil, 0, "a[0,3) d[3,6) "},
		{"relayed when it is all there is", []Shard{offer("a", 0, 3, D, 4), offer("r", 3, 6, R, 4)}, nil, 0, "a[0,3) r[3,6) "},
		{"full peers are skipped", []Shard{offer("a", 0, 3, D, 4), offer("f", 3, 6, D, 0), offer("g", 3, 6, R, 1)}, nil, 0, "a[0,3) g[3,6) "},
		{"excluded peer", []Shard{offer("a", 0, 3, D, 4), offer("b", 3, 6, D, 4), offer("c", 3, 6, D, 4)}, []string{"b"}, 0, "a[0,3) c[3,6) "},
		{"gap in the middle", []Shard{offer("a", 0, 2, D, 4), offer("c", 4, 6, D, 4)}, nil, 0, "gap 2-4"},
		{"nothing after exclusion", []Shard{offer("a", 0, 3, D, 4), offer("b", 3, 6, D, 4)}, []string{"b"}, 0, "gap 3-6"},
		{"no head", []Shard{offer("b", 2, 6, D, 4)}, nil, 0, "gap 0-2"},
		{"max hops", []Shard{offer("a", 0, 2, D, 4), offer("b", 2, 4, D, 4), offer("c", 4, 6, D, 4)}, nil, 2, "gap 6-6"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ex := map[peer.ID]bool{}
			for _, e := range tc.exclude {
				ex[peer.ID(e)] = true
			}
			p := &LocalPlanner{Table: table(tc.offers...), Rand: rand.New(rand.NewPCG(1, 2))}
			r, err := p.Plan(context.Background(), Request{Fingerprint: fp, NLayer: 6, Exclude: ex, MaxHops: tc.maxHops, Epoch: 3})
			var nr *NoRouteError
			switch {
			case errors.As(err, &nr):
				if got := fmt.Sprintf("gap %d-%d", nr.MissingStart, nr.MissingEnd); got != tc.want || nr.MaxHops != tc.maxHops {
					t.Fatalf("got %s (%v), want %s", got, err, tc.want)
				}
			case err != nil:
				t.Fatal(err)
			default:
				if got := hops(r); got != tc.want {
					t.Fatalf("route %s, want %s", got, tc.want)
				}
				if r.Epoch != 3 {
					t.Fatalf("epoch %d", r.Epoch)
				}
			}
		})
	}
}

// Equal routes share the load: the jitter term spreads sessions.
func TestPlanSpreadsEqualRoutes(t *testing.T) {
	tb := table(offer("a", 0, 3, p2p.PathDirect, 4), offer("b", 0, 3, p2p.PathDirect, 4), offer("c", 3, 6, p2p.PathDirect, 4))
	p := &LocalPlanner{Table: tb, Rand: rand.New(rand.NewPCG(7, 7))}
	count := map[peer.ID]int{}
	for range 200 {
		r, err := p.Plan(context.Background(), Request{Fingerprint: fp, NLayer: 6})
		if err != nil {
			t.Fatal(err)
		}
		count[r.Hops[0].Peer]++
	}
	if count["a"] < 60 || count["b"] < 60 {
		t.Fatalf("heads chosen %v: not spread", count)
	}
}

func TestResolve(t *testing.T) {
	tb := table(offer("a", 0, 6, p2p.PathDirect, 4))
	other := "beef" + strings.Repeat("0", 60)
	tb.Set("x", []Shard{{Peer: "x", Fingerprint: other, ModelName: "m2", NLayer: 2, Start: 0, End: 2}})
	s := tb.Shards(fp)
	s[0].ModelName = "ignored"
	for _, tc := range []struct{ in, fp string }{{fp, fp}, {"m2", other}, {other[:MinPrefix], other}} {
		got, _, err := tb.Resolve(tc.in)
		if err != nil || got != tc.fp {
			t.Errorf("Resolve(%q) = %q, %v", tc.in, got, err)
		}
	}
	if _, _, err := tb.Resolve("nope"); !errors.Is(err, ErrUnknownModel) {
		t.Errorf("unknown model: %v", err)
	}
	if _, _, err := tb.Resolve(other[:8]); !errors.Is(err, ErrUnknownModel) {
		t.Errorf("8-character prefix resolved: %v", err)
	}
}

// Warm hops (a conversation's earlier route) are preferred over a replica
// with more free sessions, never over a route with fewer hops or a direct
// leg over a relayed one, and ignored when excluded or full.
func TestPlanPrefersWarmHops(t *testing.T) {
	D, R := p2p.PathDirect, p2p.PathRelayed
	warmB := []Hop{{Peer: "a", Start: 0, End: 3}, {Peer: "b", Start: 3, End: 6}}
	cases := []struct {
		name    string
		offers  []Shard
		warm    []Hop
		exclude []string
		want    string
	}{
		{"no warm: the idler replica", []Shard{offer("a", 0, 3, D, 4), offer("b", 3, 6, D, 1), offer("c", 3, 6, D, 4)}, nil, nil, "a[0,3) c[3,6) "},
		{"warm replica though busier", []Shard{offer("a", 0, 3, D, 4), offer("b", 3, 6, D, 1), offer("c", 3, 6, D, 4)}, warmB, nil, "a[0,3) b[3,6) "},
		{"same peer, other range: not warm", []Shard{offer("a", 0, 3, D, 4), offer("b", 2, 6, D, 1), offer("c", 3, 6, D, 4)}, warmB, nil, "a[0,3) c[3,6) "},
		{"fewer hops beat warm", []Shard{offer("a", 0, 3, D, 4), offer("b", 3, 6, D, 4), offer("w", 0, 6, D, 4)}, warmB, nil, "w[0,6) "},
		{"direct beats warm relayed", []Shard{offer("a", 0, 3, D, 4), offer("b", 3, 6, R, 4), offer("c", 3, 6, D, 4)}, warmB, nil, "a[0,3) c[3,6) "},
		{"warm but full", []Shard{offer("a", 0, 3, D, 4), offer("b", 3, 6, D, 0), offer("c", 3, 6, D, 4)}, warmB, nil, "a[0,3) c[3,6) "},
		{"warm but excluded", []Shard{offer("a", 0, 3, D, 4), offer("b", 3, 6, D, 4), offer("c", 3, 6, D, 4)}, warmB, []string{"b"}, "a[0,3) c[3,6) "},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tb := table(tc.offers...)
			ex := map[peer.ID]bool{}
			for _, e := range tc.exclude {
				ex[peer.ID(e)] = true
			}
			for seed := range uint64(20) { // over the jitter
				p := &LocalPlanner{Table: tb, Rand: rand.New(rand.NewPCG(seed, 1))}
				r, err := p.Plan(context.Background(), Request{Fingerprint: fp, NLayer: 6, Exclude: ex, Warm: tc.warm})
				if err != nil {
					t.Fatal(err)
				}
				if got := hops(r); got != tc.want {
					t.Fatalf("seed %d: %s, want %s", seed, got, tc.want)
				}
			}
		})
	}
}
