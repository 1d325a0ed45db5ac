package session

import (
	"context"
	"strconv"
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
