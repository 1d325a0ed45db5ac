package route

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// PickStandby names a replica of the hop with the most layers, never a
// peer of the route, an avoided one, a full one or another kernel class;
// the head only on a batch-invariant route.
func TestPickStandby(t *testing.T) {
	D := p2p.PathDirect
	rt := &Route{Fingerprint: fp, NLayer: 6, Hops: []Hop{{Peer: "a", Start: 0, End: 3}, {Peer: "b", Start: 3, End: 5}, {Peer: "c", Start: 5, End: 6}}}
	gpu := *rt
	gpu.Hops = append([]Hop(nil), rt.Hops...)
	gpu.Hops[0].KernelClass = "cuda/sm90"
	gpuHead := offer("h", 0, 3, D, 4)
	gpuHead.KernelClass = "cuda/sm90"
	other := offer("k", 3, 5, D, 4)
	other.KernelClass = "cuda/sm90"
	cases := []struct {
		name   string
		rt     *Route
		shards []Shard
		avoid  string
		warm   []Hop
		want   string // "peer@index", or "" for none
	}{
		{"middle", rt, []Shard{offer("x", 3, 5, D, 4)}, "", nil, "x@1"},
		{"the first listed", rt, []Shard{offer("x", 3, 5, D, 4), offer("w", 3, 5, D, 4)}, "", nil, "x@1"},
		{"a warm one first", rt, []Shard{offer("x", 3, 5, D, 4), offer("w", 3, 5, D, 4)}, "", []Hop{{Peer: "w", Start: 3, End: 5}}, "w@1"},
		{"the head has more layers", rt, []Shard{offer("x", 3, 5, D, 4), offer("y", 0, 3, D, 4)}, "", nil, "y@0"},
		{"a tie goes to the later hop", rt, []Shard{offer("y", 0, 3, D, 4), offer("z", 5, 6, D, 4)}, "", nil, "y@0"},
		{"a peer of the route is no standby", rt, []Shard{offer("c", 3, 5, D, 4)}, "", nil, ""},
		{"avoided", rt, []Shard{offer("x", 3, 5, D, 4)}, "x", nil, ""},
		{"full", rt, []Shard{offer("x", 3, 5, D, 0)}, "", nil, ""},
		{"other layers", rt, []Shard{offer("x", 3, 6, D, 4)}, "", nil, ""},
		{"other kernel class", rt, []Shard{other}, "", nil, ""},
		{"no head standby off a batch-invariant route", &gpu, []Shard{gpuHead, offer("x", 3, 5, D, 4)}, "", nil, "x@1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sb := PickStandby(tc.rt, tc.shards, 100, func(p peer.ID) bool { return string(p) == tc.avoid }, tc.warm)
			got := ""
			if sb != nil {
				got = string(sb.Hop.Peer) + "@" + string(rune('0'+sb.Index))
				if sb.Hop.Start != tc.rt.Hops[sb.Index].Start || sb.Hop.End != tc.rt.Hops[sb.Index].End {
					t.Fatalf("standby %+v does not serve the covered hop's layers", sb)
				}
			}
			if got != tc.want {
				t.Fatalf("standby %q, want %q", got, tc.want)
			}
		})
	}
}

// Request.Takeover routes the failed hop's range through the failed
// epoch's standby, in both planners, while it is usable; other ranges
// are free.
func TestPlanTakeover(t *testing.T) {
	D := p2p.PathDirect
	offers := []Shard{offer("a", 0, 3, D, 4), offer("b", 3, 6, D, 4), offer("s", 3, 6, D, 1), offer("w", 0, 6, D, 4)}
	cases := []struct {
		name     string
		offers   []Shard
		takeover *Hop
		exclude  string
		want     string
	}{
		{"no takeover: the whole model", offers, nil, "", "w[0,6) "},
		{"takeover: the standby for its range (the busier replica)", offers[:3], &Hop{Peer: "s", Start: 3, End: 6}, "", "a[0,3) s[3,6) "},
		{"takeover whose advert counts its standby session (full)", []Shard{offers[0], offers[1], offer("s", 3, 6, D, 0)}, &Hop{Peer: "s", Start: 3, End: 6}, "", "a[0,3) s[3,6) "},
		{"takeover excluded: the other replica", offers[:3], &Hop{Peer: "s", Start: 3, End: 6}, "s", "a[0,3) b[3,6) "},
		{"takeover of a range no longer served", offers[:3], &Hop{Peer: "s", Start: 2, End: 6}, "", "a[0,3) b[3,6) "},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tb := table(tc.offers...)
			req := Request{Fingerprint: fp, NLayer: 6, Epoch: 2, Exclude: map[peer.ID]bool{peer.ID(tc.exclude): tc.exclude != ""}, Takeover: tc.takeover}
			for seed := range uint64(10) { // over the jitter
				p := &LocalPlanner{Table: tb, Rand: rand.New(rand.NewPCG(seed, 1))}
				r, err := p.Plan(context.Background(), req)
				if err != nil {
					t.Fatal(err)
				}
				if got := hops(r); got != tc.want {
					t.Fatalf("local planner, seed %d: %s, want %s", seed, got, tc.want)
				}
			}
			if tc.takeover == nil {
				return
			}
			// One plan: the next would count this one's pending session
			// (the standby has one slot).
			r, err := (&CostPlanner{Table: tb}).Plan(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			if got := hops(r); got != tc.want {
				t.Fatalf("cost planner: %s, want %s", got, tc.want)
			}
		})
	}
}

// A ticket's standby reaches the route only when it covers a hop of the
// route with that hop's layers, is no hop itself, is not excluded and
// advertises those layers; a hop admits an open's standby only when it is
// the ticket's.
func TestTicketStandby(t *testing.T) {
	key, tracker := newKey(t)
	_, a := newKey(t)
	_, b := newKey(t)
	_, s := newKey(t)
	_, stranger := newKey(t)
	now := time.Now()
	tb := NewTable()
	for _, id := range []peer.ID{a, b, s} {
		start := 0
		if id != a {
			start = 2
		}
		tb.Set(id, []Shard{{Peer: id, Fingerprint: testFP, NLayer: 4, Start: start, End: start + 2, KernelClass: "cpu/avx2"}})
	}
	p := &TrackerPlanner{Network: "net", Self: a, Table: tb}
	req := Request{Fingerprint: testFP, NLayer: 4, Epoch: 1}
	issue := func(sb *meshp2pb.Standby) *meshp2pb.SignedRouteTicket {
		tk := testTicket(tracker, []peer.ID{a, b}, now)
		tk.Standby = sb
		st, err := SignTicket(key, tk)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	standby := func(who peer.ID, idx, start, end uint32) *meshp2pb.Standby {
		return &meshp2pb.Standby{HopIndex: idx, Hop: &meshp2pb.RouteHop{PeerId: []byte(who), Start: start, End: end}}
	}
	good := standby(s, 1, 2, 4)
	rt, err := p.Verify(issue(good), tracker, req)
	if err != nil {
		t.Fatal(err)
	}
	if rt.Standby == nil || rt.Standby.Index != 1 || rt.Standby.Hop.Peer != s || rt.Standby.Hop.KernelClass != "cpu/avx2" {
		t.Fatalf("route's standby %+v, want %s for hop 1 with its advert's kernel class", rt.Standby, s)
	}
	if rt, err := p.Verify(issue(nil), tracker, req); err != nil || rt.Standby != nil {
		t.Fatalf("a ticket without a standby: %v, standby %+v", err, rt.Standby)
	}
	for _, tc := range []struct {
		name string
		sb   *meshp2pb.Standby
		req  Request
		want error
	}{
		{"other layers", standby(s, 1, 0, 4), req, ErrTicketInvalid},
		{"hop index outside the route", standby(s, 2, 2, 4), req, ErrTicketInvalid},
		{"a hop of the route", standby(b, 0, 0, 2), req, ErrTicketInvalid},
		{"excluded", good, Request{Fingerprint: testFP, NLayer: 4, Epoch: 1, Exclude: map[peer.ID]bool{s: true}}, ErrNotInTicket},
		{"no advert", standby(stranger, 1, 2, 4), req, ErrTicketAdvert},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := p.Verify(issue(tc.sb), tracker, tc.req); !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
	for _, tc := range []struct {
		name         string
		ticket, open *meshp2pb.Standby
		ok           bool
	}{
		{"none named", good, nil, true},
		{"the ticket's", good, standby(s, 1, 2, 4), true},
		{"the ticket names none", nil, good, false},
		{"another peer", good, standby(stranger, 1, 2, 4), false},
		{"another hop", good, standby(s, 0, 2, 4), false},
	} {
		t.Run("admission "+tc.name, func(t *testing.T) {
			err := SameStandby(tc.ticket, tc.open)
			if (err == nil) != tc.ok || (err != nil && TicketCode(err) != meshp2pb.ErrorCode_ERROR_CODE_NOT_IN_TICKET) {
				t.Fatalf("SameStandby: %v (code %s), want ok %v", err, TicketCode(err), tc.ok)
			}
		})
	}
}

// A tracker's cost planner names the standby when asked, from the shards
// it would route through now, and counts it as pending load: a replica
// with one free slot stands by for one session, not for the next one
// planned before its advert shows the slot taken.
func TestCostPlannerStandby(t *testing.T) {
	D := p2p.PathDirect
	tb := table(offer("a", 0, 3, D, 4), offer("b", 3, 6, D, 4), offer("s", 3, 6, D, 1))
	p := &CostPlanner{Table: tb}
	req := Request{Fingerprint: fp, NLayer: 6, Epoch: 1, Standby: true}
	r, err := p.Plan(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if r.Standby == nil || r.Standby.Index != 1 || slices.ContainsFunc(r.Hops, func(h Hop) bool { return h.Peer == r.Standby.Hop.Peer }) {
		t.Fatalf("route %s, standby %+v: want a replica of hop 1 off the route", hops(r), r.Standby)
	}
	if r.Standby.Hop.Peer != "s" || r.Hops[1].Peer != "b" {
		t.Fatalf("route %s, standby %s: want b routed (idler) and s standing by", hops(r), r.Standby.Hop.Peer)
	}
	if r, _ := p.Plan(context.Background(), Request{Fingerprint: fp, NLayer: 6, Epoch: 1}); r == nil || r.Standby != nil {
		t.Fatalf("a request without standby got one: %+v", r)
	}
	// s's single slot is counted pending now: the next session gets no
	// standby (b is on its route; nothing else serves 3-6).
	r, err = p.Plan(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if r.Standby != nil {
		t.Fatalf("s stood by twice with one free slot: route %s, standby %+v", hops(r), r.Standby)
	}
}
