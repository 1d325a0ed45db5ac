package route

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

type synthPeer struct {
	id         peer.ID
	start, end int
	st         PeerStats
	used, max  uint32
	msPerLayer float32
}

func synthTable(peers []synthPeer, nLayer int) (*Table, func(peer.ID) PeerStats) {
	tb := NewTable()
	stats := map[peer.ID]PeerStats{}
	for _, p := range peers {
		mx := p.max
		if mx == 0 {
			mx = 8
		}
		tb.Set(p.id, []Shard{{Peer: p.id, Fingerprint: testFP, NLayer: nLayer, Start: p.start, End: p.end, DecodeMsPerLayer: p.msPerLayer,
			Capacity: &meshp2pb.ShardCapacity{MaxSessions: mx, FreeSessions: mx - p.used, FreeKvTokens: 1 << 20, NCtx: 4096}}})
		stats[p.id] = p.st
	}
	return tb, func(id peer.ID) PeerStats { return stats[id] }
}

func pid(i int) peer.ID { return peer.ID(fmt.Sprintf("peer-%04d", i)) }

func hopsOf(r *Route) string {
	s := ""
	for _, h := range r.Hops {
		s += fmt.Sprintf("%s[%d-%d] ", h.Peer, h.Start, h.End)
	}
	return s
}

func TestCostPlanner(t *testing.T) {
	ms := time.Millisecond
	cases := []struct {
		name  string
		peers []synthPeer
		obj   Objective
		req   Request
		want  []peer.ID // chosen hops in order
		err   error
	}{
		{"direct beats relayed", []synthPeer{
			{id: pid(1), start: 0, end: 4, st: PeerStats{RTT: 5 * ms, Relayed: true}},
			{id: pid(2), start: 0, end: 4, st: PeerStats{RTT: 20 * ms}},
		}, ObjectiveLatency, Request{}, []peer.ID{pid(2)}, nil},
		{"limited relay never used", []synthPeer{
			{id: pid(1), start: 0, end: 4, st: PeerStats{RTT: ms, Relayed: true, Limited: true}},
		}, ObjectiveLatency, Request{}, nil, ErrNoRoute},
		{"stale aged out", []synthPeer{
			{id: pid(1), start: 0, end: 4, st: PeerStats{RTT: ms, Stale: true}},
			{id: pid(2), start: 0, end: 4, st: PeerStats{RTT: 80 * ms}},
		}, ObjectiveLatency, Request{}, []peer.ID{pid(2)}, nil},
		{"full node skipped", []synthPeer{
			{id: pid(1), start: 0, end: 4, used: 8},
			{id: pid(2), start: 0, end: 4, st: PeerStats{RTT: 80 * ms}},
		}, ObjectiveLatency, Request{}, []peer.ID{pid(2)}, nil},
		{"loaded node costs more", []synthPeer{
			{id: pid(1), start: 0, end: 4, used: 6, msPerLayer: 10},
			{id: pid(2), start: 0, end: 4, used: 0, msPerLayer: 10},
		}, ObjectiveLatency, Request{}, []peer.ID{pid(2)}, nil},
		{"fewer hops when latency dominates", []synthPeer{
			{id: pid(1), start: 0, end: 2, st: PeerStats{RTT: 40 * ms}},
			{id: pid(2), start: 2, end: 4, st: PeerStats{RTT: 40 * ms}},
			{id: pid(3), start: 0, end: 4, st: PeerStats{RTT: 40 * ms}},
		}, ObjectiveLatency, Request{}, []peer.ID{pid(3)}, nil},
		{"hop may start inside another range", []synthPeer{
			{id: pid(1), start: 0, end: 3, st: PeerStats{RTT: 2 * ms}},
			{id: pid(2), start: 0, end: 2, st: PeerStats{RTT: 2 * ms}},
			{id: pid(3), start: 2, end: 4, st: PeerStats{RTT: 2 * ms}},
		}, ObjectiveLatency, Request{}, []peer.ID{pid(2), pid(3)}, nil},
		{"throughput: slowest stage first", []synthPeer{
			// one fast-network but slow-compute node vs two faster halves
			{id: pid(1), start: 0, end: 4, msPerLayer: 10, st: PeerStats{RTT: ms}},
			{id: pid(2), start: 0, end: 2, msPerLayer: 8, st: PeerStats{RTT: 30 * ms}},
			{id: pid(3), start: 2, end: 4, msPerLayer: 8, st: PeerStats{RTT: 30 * ms}},
		}, ObjectiveThroughput, Request{}, []peer.ID{pid(2), pid(3)}, nil},
		{"latency: same swarm, one hop", []synthPeer{
			{id: pid(1), start: 0, end: 4, msPerLayer: 10, st: PeerStats{RTT: ms}},
			{id: pid(2), start: 0, end: 2, msPerLayer: 8, st: PeerStats{RTT: 30 * ms}},
			{id: pid(3), start: 2, end: 4, msPerLayer: 8, st: PeerStats{RTT: 30 * ms}},
		}, ObjectiveLatency, Request{}, []peer.ID{pid(1)}, nil},
		{"exclude", []synthPeer{
			{id: pid(1), start: 0, end: 4, st: PeerStats{RTT: ms}},
			{id: pid(2), start: 0, end: 4, st: PeerStats{RTT: 50 * ms}},
		}, ObjectiveLatency, Request{Exclude: map[peer.ID]bool{pid(1): true}}, []peer.ID{pid(2)}, nil},
		{"max hops", []synthPeer{
			{id: pid(1), start: 0, end: 2, st: PeerStats{RTT: ms}},
			{id: pid(2), start: 2, end: 4, st: PeerStats{RTT: ms}},
		}, ObjectiveLatency, Request{MaxHops: 1}, nil, ErrNoRoute},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tb, stats := synthTable(c.peers, 4)
			p := &CostPlanner{Table: tb, Stats: stats}
			req := c.req
			req.Fingerprint, req.NLayer, req.Epoch = testFP, 4, 3
			rt, est, err := p.PlanObjective(context.Background(), req, c.obj)
			if c.err != nil {
				if !errors.Is(err, c.err) {
					t.Fatalf("got %v, want %v", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if rt.Epoch != 3 {
				t.Fatalf("epoch %d", rt.Epoch)
			}
			got := []peer.ID{}
			for _, h := range rt.Hops {
				got = append(got, h.Peer)
			}
			if fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Fatalf("route %s, want %v (estimate %+v)", hopsOf(rt), c.want, est)
			}
		})
	}
}

// Two equivalent routes: successive plans take turns, and the pending
// count keeps a burst from piling onto one replica.
func TestCostPlannerSpreads(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		name     string
		msA, msB float32 // per-layer speed of the two replicas of each range
	}{
		{"identical replicas", 0, 0},
		// 1.2 vs 1.6 ms per hop (RTT/2 + 2 layers): less than a quantum
		// apart but on both sides of a rounding boundary; must still tie.
		{"noise across a rounding boundary", 0.1, 0.3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb, stats := synthTable([]synthPeer{
				{id: pid(1), start: 0, end: 2, st: PeerStats{RTT: 2 * ms}, msPerLayer: tc.msA},
				{id: pid(2), start: 0, end: 2, st: PeerStats{RTT: 2 * ms}, msPerLayer: tc.msB},
				{id: pid(3), start: 2, end: 4, st: PeerStats{RTT: 2 * ms}, msPerLayer: tc.msA},
				{id: pid(4), start: 2, end: 4, st: PeerStats{RTT: 2 * ms}, msPerLayer: tc.msB},
			}, 4)
			checkSpread(t, &CostPlanner{Table: tb, Stats: stats})
		})
	}
}

func checkSpread(t *testing.T, p *CostPlanner) {
	t.Helper()
	count := map[peer.ID]int{}
	routes := map[string]int{}
	for range 8 {
		rt, err := p.Plan(context.Background(), Request{Fingerprint: testFP, NLayer: 4, Epoch: 1})
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range rt.Hops {
			count[h.Peer]++
		}
		routes[hopsOf(rt)]++
	}
	t.Logf("per-route counts: %v", routes)
	for _, id := range []peer.ID{pid(1), pid(2), pid(3), pid(4)} {
		if count[id] != 4 {
			t.Fatalf("peer %s got %d of 8 sessions, want 4 (counts %v)", id, count[id], count)
		}
	}
}

// synthetic1000 is a swarm of 1,000 adverts: 100-layer model, replicas of
// ranges of 5-20 layers starting at every 5th layer, random RTTs and loads.
func synthetic1000() ([]synthPeer, int) {
	var peers []synthPeer
	const nLayer = 100
	for i := range 1000 {
		start := (i * 5) % nLayer
		end := min(nLayer, start+5*(1+i%4))
		peers = append(peers, synthPeer{id: pid(i), start: start, end: end, used: uint32(i % 7), max: 8,
			msPerLayer: float32(1 + i%5), st: PeerStats{RTT: time.Duration(1+(i*37)%80) * time.Millisecond, Relayed: i%11 == 0}})
	}
	return peers, nLayer
}

func TestCostPlanner1000(t *testing.T) {
	peers, nl := synthetic1000()
	tb, stats := synthTable(peers, nl)
	p := &CostPlanner{Table: tb, Stats: stats}
	for _, obj := range []Objective{ObjectiveLatency, ObjectiveThroughput} {
		rt, est, err := p.PlanObjective(context.Background(), Request{Fingerprint: testFP, NLayer: nl, Epoch: 1}, obj)
		if err != nil {
			t.Fatal(err)
		}
		if rt.Hops[0].Start != 0 || rt.Hops[len(rt.Hops)-1].End != nl {
			t.Fatalf("route does not cover the model: %s", hopsOf(rt))
		}
		t.Logf("%s: %d hops, %.1f ms/token, bottleneck %.1f ms, %d candidates", obj, len(rt.Hops), est.PerTokenMs, est.BottleneckMs, est.Candidates)
	}
}

// BenchmarkPlan1000: planning over a table of 1,000 synthetic adverts.
func BenchmarkPlan1000(b *testing.B) {
	peers, nl := synthetic1000()
	tb, stats := synthTable(peers, nl)
	for _, obj := range []Objective{ObjectiveLatency, ObjectiveThroughput} {
		b.Run(obj.String(), func(b *testing.B) {
			// Every plan is an issue that counts as pending load; move the
			// clock past the pending window so the table stays the same.
			now := time.Now()
			p := &CostPlanner{Table: tb, Stats: stats, Now: func() time.Time { now = now.Add(time.Minute); return now }}
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := p.PlanObjective(context.Background(), Request{Fingerprint: testFP, NLayer: nl, Epoch: 1}, obj); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// Warm hops win the tracker planner's ties: a conversation's second turn
// lands on the replicas of its first, where the recency tie-break would
// send it to the other pair; but a faster cold replica still wins.
func TestCostPlannerPrefersWarmTies(t *testing.T) {
	ms := time.Millisecond
	table := func(msB float32) *CostPlanner {
		tb, stats := synthTable([]synthPeer{
			{id: pid(1), start: 0, end: 2, st: PeerStats{RTT: 2 * ms}},
			{id: pid(2), start: 0, end: 2, st: PeerStats{RTT: 2 * ms}, msPerLayer: msB},
			{id: pid(3), start: 2, end: 4, st: PeerStats{RTT: 2 * ms}},
			{id: pid(4), start: 2, end: 4, st: PeerStats{RTT: 2 * ms}, msPerLayer: msB},
		}, 4)
		return &CostPlanner{Table: tb, Stats: stats}
	}
	plan := func(p *CostPlanner, warm []Hop) *Route {
		t.Helper()
		rt, err := p.Plan(context.Background(), Request{Fingerprint: testFP, NLayer: 4, Epoch: 1, Warm: warm})
		if err != nil {
			t.Fatal(err)
		}
		return rt
	}
	p := table(0)
	first := plan(p, nil)
	if second := plan(p, first.Hops); hopsOf(second) != hopsOf(first) {
		t.Fatalf("second turn on %s, want the first's %s", hopsOf(second), hopsOf(first))
	}
	if other := plan(p, nil); hopsOf(other) == hopsOf(first) {
		t.Fatalf("a session without warm hops also got %s: the recency tie-break should spread it", hopsOf(other))
	}
	// Replicas 2 and 4 are 5 ms per layer slower: warm or not, they lose.
	p = table(5)
	slow := []Hop{{Peer: pid(2), Start: 0, End: 2}, {Peer: pid(4), Start: 2, End: 4}}
	if rt := plan(p, slow); rt.Hops[0].Peer != pid(1) || rt.Hops[1].Peer != pid(3) {
		t.Fatalf("warm but slower replicas chosen: %s", hopsOf(rt))
	}
}
