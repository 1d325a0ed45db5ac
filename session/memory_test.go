package session

import (
	"bytes"
	"strings"
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"
	rcmgr "github.com/libp2p/go-libp2p/p2p/host/resource-manager"

	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// Item 10: frame payload buffers count against the libp2p resource
// manager. A hop whose streams may hold 1 MiB refuses a 2 MiB activation
// from its header, with FRAME_TOO_LARGE blaming the sender, instead of
// waiting for (and buffering) the payload. An ordinary frame still passes.
func TestFrameBuffersChargedToResourceManager(t *testing.T) {
	limits := rcmgr.DefaultLimits
	limits.StreamBaseLimit.Memory = 1 << 20
	rm, err := rcmgr.NewResourceManager(rcmgr.NewFixedLimiter(limits.AutoScale()))
	if err != nil {
		t.Fatal(err)
	}
	tail := startHopOn(t, newTestHostRM(t, rm), 2, 6, nil)
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
	w := frame.NewWriter(s, frame.Limits{})
	// One honest row (token 5 at position 0, layers 0-2 done).
	if err := w.WriteActivation(activation(sid, []int64{1, fakeEmbd}), frame.F32Bytes([]float32{5, 0, 2, 0})); err != nil {
		t.Fatal(err)
	}
	// Then the prefix and header of a 2 MiB frame, and no payload.
	const rows, width = 16384, 32
	hdr := activation(sid, []int64{rows, width})
	hdr.NRows, hdr.PosStart = rows, 1
	var whole bytes.Buffer
	if err := frame.NewWriter(&whole, frame.Limits{}).WriteActivation(hdr, make([]byte, rows*width*4)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Write(whole.Bytes()[:whole.Len()-rows*width*4]); err != nil {
		t.Fatal(err)
	}
	m = readReply(t, s)
	e := m.GetError()
	if e.GetCode() != meshp2pb.ErrorCode_ERROR_CODE_FRAME_TOO_LARGE || !strings.Contains(e.GetMessage(), "memory limit") || peer.ID(e.GetFailedPeerId()) != c.ID() {
		t.Fatalf("want FRAME_TOO_LARGE (memory limit) blaming the sender %s, got %v", c.ID(), m)
	}
	waitReleased(t, tail)
}
