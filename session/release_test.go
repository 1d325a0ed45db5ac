package session

import (
	"errors"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// Release drain: a seam-move stream the previous hop attached (queued
// until the old stream ends) is reset when the session ends first, not
// left open until the peer gives up.
func TestReleaseDropsPendingResume(t *testing.T) {
	tail := startHop(t, 2, 6, nil)
	c := newTestHost(t)
	connectAll(c, tail.host)
	acceptRing(c)
	sid := newSID()
	open := &meshp2pb.SessionOpen{SessionId: sid, Epoch: 1, ModelFingerprint: fakeFP, NCtxNeeded: 64, HopIndex: 1,
		Route: &meshp2pb.Route{ModelFingerprint: fakeFP, NLayer: fakeNLay, Epoch: 1, Hops: []*meshp2pb.RouteHop{
			{PeerId: []byte(c.ID()), Start: 0, End: 2}, {PeerId: []byte(tail.host.ID()), Start: 2, End: 6}}}}
	s, m := rawOpen(t, c, tail.host.ID(), open)
	if !m.GetAccept().GetOk() {
		t.Fatal(m)
	}
	// The move: a second session stream with resume set. The tail queues
	// it until the old stream ends, which it does not.
	move := proto.Clone(open).(*meshp2pb.SessionOpen)
	move.Resume = true
	ns, m := rawOpen(t, c, tail.host.ID(), move)
	if !m.GetAccept().GetOk() {
		t.Fatalf("move refused: %v", m)
	}
	// The session ends on the old stream.
	if err := frame.NewWriter(s, frame.Limits{}).WriteStream(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Close{
		Close: &meshp2pb.SessionClose{SessionId: sid, Epoch: 1}}}); err != nil {
		t.Fatal(err)
	}
	waitReleased(t, tail)
	_ = ns.SetReadDeadline(time.Now().Add(hangGuard))
	_, err := ns.Read(make([]byte, 1))
	if !errors.Is(err, network.ErrReset) {
		t.Fatalf("queued move stream after the session ended: %v, want a reset", err)
	}
}
