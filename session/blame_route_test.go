package session

import (
	"context"
	"strconv"
	"sync"
	"testing"

	"github.com/libp2p/go-libp2p/core/network"

	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// A head that accepts and then reports a failure blaming a bystander (a
// peer not on the route) gets itself excluded, not the bystander: the
// origin avoids the peer that relayed the report.
func TestOriginBlamesOnlyRoutePeers(t *testing.T) {
	evil := startHop(t, 0, fakeNLay, nil)
	spare := startHop(t, 0, fakeNLay, nil)
	bystander := newTestHost(t)
	evil.host.SetStreamHandler(evil.host.ProtocolID(ProtoSession, ProtoVersion), func(s network.Stream) {
		defer s.Close()
		r, w := frame.NewReader(s, frame.Limits{}), frame.NewWriter(s, frame.Limits{})
		msg, _, err := r.ReadStream()
		if err != nil || msg.GetOpen() == nil {
			_ = s.Reset()
			return
		}
		if w.WriteStream(acceptance(msg.GetOpen())) != nil {
			return
		}
		_ = w.WriteStream(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Error{Error: &meshp2pb.Error{
			Code: meshp2pb.ErrorCode_ERROR_CODE_NEXT_HOP_UNREACHABLE, Message: "made up", FailedPeerId: []byte(bystander.ID())}}})
		_, _, _ = r.ReadStream()
	})
	o, _ := newOrigin(t, stagePlanner{[][]*fakeHop{{evil, spare}}}, evil, spare)
	res, err := o.Generate(context.Background(), GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: []int32{1, 2, 3}, MaxTokens: 4})
	if err != nil {
		t.Fatalf("generation failed (the bystander was excluded instead of the head?): %v", err)
	}
	if res.Reroutes != 1 || res.Route.Hops[0].Peer != spare.host.ID() {
		t.Fatalf("reroutes %d, final head %s; want 1 re-route onto the spare", res.Reroutes, res.Route.Hops[0].Peer)
	}
}

// A route hands a hop at most MaxRouteAddrs addresses per peer.
func TestRouteAddrsBounded(t *testing.T) {
	h := newTestHost(t)
	p := newTestHost(t).ID()
	var addrs []string
	for i := range 100 {
		addrs = append(addrs, "/ip4/10.0.0.1/tcp/"+itoa(1000+i))
	}
	addAddrs(h, p, addrs)
	if n := len(h.Peerstore().Addrs(p)); n != MaxRouteAddrs {
		t.Fatalf("peerstore holds %d route addresses for one peer, want %d", n, MaxRouteAddrs)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// A hop that closes its own link to the next hop (its host shutting down
// closes connections one at a time; its connection manager may trim one)
// blames itself, not the next hop, so the origin re-routes around it and
// keeps the next hop: here the tail is the only one serving its layers, so
// blaming it would end the generation.
func TestHopClosingItsOwnLinkBlamesItself(t *testing.T) {
	for _, tc := range []struct {
		name  string
		close func(mid, tail *fakeHop)
	}{
		{"connection to the next hop closed here", func(mid, tail *fakeHop) { _ = mid.host.Network().ClosePeer(tail.host.ID()) }},
		{"whole host closed", func(mid, _ *fakeHop) { _ = mid.host.Close() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			head, tail := startHop(t, 0, 2, nil), startHop(t, 4, fakeNLay, nil)
			mid, spare := startHop(t, 2, 4, nil), startHop(t, 2, 4, nil)
			o, _ := newOrigin(t, stagePlanner{[][]*fakeHop{{head}, {mid, spare}, {tail}}}, head, mid, spare, tail)
			var once sync.Once
			mid.eng.mu.Lock()
			mid.eng.onStep = func(steps int) {
				if steps >= 5 {
					once.Do(func() { tc.close(mid, tail) })
				}
			}
			mid.eng.mu.Unlock()
			prompt := []int32{3, 1, 4}
			const maxTok = 30
			res, err := o.Generate(context.Background(), GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: prompt, MaxTokens: maxTok})
			if err != nil {
				t.Fatalf("generation failed (the tail was blamed for the middle hop's own close?): %v", err)
			}
			if res.Reroutes != 1 || res.Route.Hops[1].Peer != spare.host.ID() || res.Route.Hops[2].Peer != tail.host.ID() {
				t.Fatalf("reroutes %d, final route %v; want 1 re-route onto the spare middle, same tail (failures %v)", res.Reroutes, res.Route.Hops, res.Failures)
			}
			if want := reference(prompt, maxTok, 0); !equal(res.Tokens, want) {
				t.Fatalf("tokens %v\nwant   %v", res.Tokens, want)
			}
		})
	}
}
