package session

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/route"
)

// tableOf is a capability table holding the hops' offers, as discovery
// fills it.
func tableOf(hops ...*fakeHop) *route.Table {
	t := route.NewTable()
	for _, h := range hops {
		i := h.eng.info
		t.Set(h.host.ID(), []route.Shard{{Peer: h.host.ID(), Fingerprint: fakeFP, NLayer: fakeNLay, NEmbd: fakeEmbd,
			Start: i.Start, End: i.End, HasVocab: true, Addrs: h.host.Addrs()}})
	}
	return t
}

// Item 5: a peer claiming every layer wins the local planner on hop count
// whatever it then does. Here it cannot compute them: each generation it
// is planned into fails on it and re-routes. With a FailureMemory shared
// by the node's origins only the first generation is captured; the others
// go straight to the honest two-hop route.
func TestFailureMemoryAvoidsALiar(t *testing.T) {
	liar, a, b := startHop(t, 0, 6, nil), startHop(t, 0, 3, nil), startHop(t, 3, 6, nil)
	liar.eng.mu.Lock()
	liar.eng.broken = errors.New("compute failed")
	liar.eng.mu.Unlock()
	pl := &route.LocalPlanner{Table: tableOf(liar, a, b)}
	for _, tc := range []struct {
		name        string
		mem         *FailureMemory
		wantReroute []int
	}{
		{"without memory", nil, []int{1, 1, 1}},
		{"with memory", NewFailureMemory(0, 0), []int{1, 0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, _ := newOrigin(t, pl, liar, a, b)
			o.Failures = tc.mem
			prompt := []int32{3, 1, 4}
			var got []int
			for range tc.wantReroute {
				res, err := o.Generate(context.Background(), GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: prompt, MaxTokens: 8})
				if err != nil {
					t.Fatal(err)
				}
				if !equal(res.Tokens, reference(prompt, 8, 0)) {
					t.Fatalf("tokens %v, want %v", res.Tokens, reference(prompt, 8, 0))
				}
				if len(res.Route.Hops) != 2 {
					t.Fatalf("finished on a %d-hop route, want the honest two hops", len(res.Route.Hops))
				}
				got = append(got, res.Reroutes)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.wantReroute) {
				t.Fatalf("re-routes per generation %v, want %v", got, tc.wantReroute)
			}
			waitReleased(t, liar, a, b)
		})
	}
}

// The memory is bounded in peers and time, and soft: a remembered peer is
// planned again when no route avoids it.
func TestFailureMemoryBounds(t *testing.T) {
	now := time.Unix(1000, 0)
	m := NewFailureMemory(time.Minute, 3)
	m.now = func() time.Time { return now }
	ids := make([]peer.ID, 5)
	for i := range ids {
		ids[i] = peer.ID(fmt.Sprintf("peer-%d", i))
		m.Blame(ids[i])
		now = now.Add(time.Second)
	}
	if m.Len() != 3 || m.Avoided(ids[0]) || m.Avoided(ids[1]) || !m.Avoided(ids[4]) {
		t.Fatalf("holds %d peers (want 3, the newest): %v %v %v", m.Len(), m.Avoided(ids[0]), m.Avoided(ids[1]), m.Avoided(ids[4]))
	}
	now = now.Add(time.Minute)
	if m.Avoided(ids[4]) || m.avoiding(nil) != nil || m.Len() != 0 {
		t.Fatalf("still avoids peers after their minute: %d held", m.Len())
	}

	// Soft: the only route runs through a remembered peer, so it is used.
	whole := startHop(t, 0, 6, nil)
	o, _ := newOrigin(t, stagePlanner{stages: [][]*fakeHop{{whole}}}, whole)
	o.Failures = NewFailureMemory(0, 0)
	o.Failures.Blame(whole.host.ID())
	res, err := o.Generate(context.Background(), GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: []int32{7}, MaxTokens: 4})
	if err != nil || res.Reroutes != 0 {
		t.Fatalf("the only route through a remembered peer: %v, %+v", err, res)
	}
}

// Snapshot and Restore carry a memory between runs: ended entries are
// dropped, a peer held both ways keeps the later end, an end beyond the
// TTL is cut to it, and the bound keeps the latest-ending peers.
func TestFailureMemorySnapshotRestore(t *testing.T) {
	now := time.Unix(1000, 0)
	m := NewFailureMemory(time.Minute, 3)
	m.now = func() time.Time { return now }
	m.Blame("a")
	now = now.Add(10 * time.Second)
	m.Blame("b")
	snap := m.Snapshot()
	if len(snap) != 2 || snap[0].Peer != "b" || !snap[0].Until.Equal(now.Add(time.Minute)) || snap[1].Peer != "a" {
		t.Fatalf("snapshot %v: want b then a, ending a minute after their blame", snap)
	}

	r := NewFailureMemory(time.Minute, 3)
	r.now = m.now
	r.Blame("a") // later than the snapshot's a
	r.Restore(append(snap,
		FailureEntry{Peer: "gone", Until: now.Add(-time.Second)},     // ended
		FailureEntry{Peer: "future", Until: now.Add(24 * time.Hour)}, // beyond the TTL
		FailureEntry{Peer: "", Until: now.Add(time.Second)},          // no peer
	))
	got := map[peer.ID]time.Time{}
	for _, e := range r.Snapshot() {
		got[e.Peer] = e.Until
	}
	want := map[peer.ID]time.Time{"a": now.Add(time.Minute), "b": now.Add(time.Minute), "future": now.Add(time.Minute)}
	if len(got) != len(want) {
		t.Fatalf("restored %v, want %v", got, want)
	}
	for p, u := range want {
		if !got[p].Equal(u) {
			t.Fatalf("restored %v, want %v", got, want)
		}
	}

	// The bound: 3 peers, the ones ending last.
	b := NewFailureMemory(time.Minute, 3)
	b.now = m.now
	var many []FailureEntry
	for i := range 5 {
		many = append(many, FailureEntry{Peer: peer.ID(fmt.Sprintf("p%d", i)), Until: now.Add(time.Duration(i+1) * time.Second)})
	}
	b.Restore(many)
	if b.Len() != 3 || b.Avoided("p0") || b.Avoided("p1") || !b.Avoided("p2") || !b.Avoided("p4") {
		t.Fatalf("bounded restore holds %v", b.Snapshot())
	}
	var nilMem *FailureMemory
	nilMem.Restore(many)
	if nilMem.Snapshot() != nil {
		t.Fatal("a nil memory remembers")
	}
}
