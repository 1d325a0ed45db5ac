package session

import (
	"context"
	"fmt"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// connect opens the stream to the next hop (and, on the tail, the ring to
// the head) and waits for the rest of the route to admit the session.
func (hs *hopSession) connect(ctx context.Context) *hopError {
	h := hs.h
	hops := hs.open.GetRoute().GetHops()
	if hs.standby {
		return nil // it sends nothing on (standby.go)
	}
	if !hs.tail {
		next := hops[hs.idx+1]
		np := peer.ID(next.GetPeerId())
		addAddrs(h.host, np, next.GetAddrs())
		ds, err := h.host.NewStream(ctx, np, h.host.ProtocolID(ProtoSession, ProtoVersion))
		if err != nil {
			return linkErr(fmt.Sprintf("open stream to next hop %s", np), err, np, h.host.ID())
		}
		h.host.Protect(np, RouteProtectTag)
		fwd := cloneOpen(hs.open)
		fwd.HopIndex = uint32(hs.idx + 1)
		w, r := frame.NewWriter(ds, h.cfg.Limits), streamReader(ds, h.cfg.Limits)
		if err := w.WriteStream(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Open{Open: fwd}}); err != nil {
			_ = ds.Reset()
			return linkErr(fmt.Sprintf("send open to %s", np), err, np, h.host.ID())
		}
		if dl, ok := ctx.Deadline(); ok {
			_ = ds.SetReadDeadline(dl)
		}
		msg, _, err := r.ReadStream()
		_ = ds.SetReadDeadline(time.Time{})
		if err != nil {
			_ = ds.Reset()
			return linkErr(fmt.Sprintf("admission at %s", np), err, np, h.host.ID())
		}
		acc := msg.GetAccept()
		if acc == nil || !acc.GetOk() {
			_ = ds.Close()
			if acc != nil && acc.GetError() != nil {
				return hs.fromDownstream(acc.GetError(), np, false)
			}
			return codeErr(meshp2pb.ErrorCode_ERROR_CODE_UNEXPECTED_MESSAGE, "next hop did not accept", np)
		}
		hs.downCached = acc
		hs.down.Swap(ds)
		path := pathOf(h.host, ds)
		h.log.Info("seam to next hop open", "session", hs.key, "next", np, "path", path.String())
		go hs.watchDownstream(ds, r)
		if path == p2p.PathRelayed {
			go hs.migrateWhenDirect(np, false)
		}
		hs.startMirror()
	}
	if hs.tail && !hs.head {
		head := peer.ID(hops[0].GetPeerId())
		addAddrs(h.host, head, hops[0].GetAddrs())
		rs, err := h.host.NewStream(ctx, head, h.host.ProtocolID(ProtoRing, ProtoVersion))
		if err != nil {
			return linkErr(fmt.Sprintf("open ring to head %s", head), err, head, h.host.ID())
		}
		hello := cloneOpen(hs.open)
		hello.HopIndex = uint32(hs.idx)
		hs.ringOut.Swap(rs)
		if err := hs.ringOut.Send(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Open{Open: hello}}, 0); err != nil {
			_ = rs.Reset()
			return linkErr("ring hello to head", err, head, h.host.ID())
		}
		path := pathOf(h.host, rs)
		h.log.Info("ring to head open", "session", hs.key, "head", head, "path", path.String())
		if path == p2p.PathRelayed {
			go hs.migrateWhenDirect(head, true)
		}
	}
	return nil
}

// handleRing attaches the tail's ring stream to the head's session.
func (h *HopService) handleRing(s network.Stream) {
	_ = s.SetReadDeadline(time.Now().Add(h.cfg.OpenTimeout))
	// The hello is read with the header limit and no payload: a stranger
	// cannot make the head read a large frame before it is checked.
	msg, err := readFirst(s, h.cfg.Limits)
	if err != nil || msg.GetOpen() == nil {
		_ = s.Reset()
		return
	}
	_ = s.SetReadDeadline(time.Time{})
	open := msg.GetOpen()
	hs := h.lookup(keyOf(open))
	// Only the tail of the route this head admitted may close the ring.
	if hs == nil || !hs.head || hs.tail || int(open.GetHopIndex()) != len(hs.route)-1 || s.Conn().RemotePeer() != hs.route[len(hs.route)-1] {
		_ = s.Reset()
		return
	}
	if open.GetResume() {
		select {
		case hs.resumeRing <- s:
		default:
			_ = s.Reset()
		}
		return
	}
	select {
	case <-hs.done:
		_ = s.Reset() // released meanwhile
	case hs.ring <- s:
	default:
		_ = s.Reset() // a second ring for one session
	}
}

func cloneOpen(o *meshp2pb.SessionOpen) *meshp2pb.SessionOpen {
	return proto.Clone(o).(*meshp2pb.SessionOpen)
}
