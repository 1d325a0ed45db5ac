package session

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// Seam migration. A seam or ring that started on a relayed connection
// moves when a hole punch later succeeds: the writing hop opens a
// replacement stream (libp2p puts it on the direct connection) with
// SessionOpen.resume, the reader attaches it (and, for a seam, confirms),
// the writer swaps its Seam over and half-closes the old stream; the
// reader drains the old stream to its end, then continues on the new one,
// so no frame is lost or reordered.

// resume attaches a replacement seam stream from the previous hop to an
// open session.
func (h *HopService) resume(s network.Stream, w *frame.Writer, open *meshp2pb.SessionOpen) {
	hs := h.lookup(keyOf(open))
	if hs == nil || hs.head || int(open.GetHopIndex()) != hs.idx || s.Conn().RemotePeer() != hs.route[hs.idx-1] {
		_ = w.WriteStream(h.refusal(open, codeErr(meshp2pb.ErrorCode_ERROR_CODE_SESSION_UNKNOWN, "no such session to resume from that peer", "")))
		_ = s.Close()
		return
	}
	// The open's read deadline must not outlive the handshake: this stream
	// carries the rest of the session.
	_ = s.SetReadDeadline(time.Time{})
	select {
	case hs.resumeUp <- s:
	default:
		_ = w.WriteStream(h.refusal(open, codeErr(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "a seam move is already pending", "")))
		_ = s.Close()
		return
	}
	_ = w.WriteStream(acceptance(open))
}

// migrateWhenDirect moves a stream this hop writes (the seam to the next
// hop, or on the tail the ring to the head) to the direct connection once
// a hole punch to that peer succeeds.
func (hs *hopSession) migrateWhenDirect(p peer.ID, ring bool) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-hs.done
		cancel()
	}()
	events := hs.h.host.SubscribeConn(ctx)
	// The path may have turned direct between opening the stream and
	// subscribing (the event is then gone): look once after subscribing.
	if hs.h.host.PathTo(p) == p2p.PathDirect {
		err := hs.migrate(ctx, p, ring)
		if err == nil {
			return
		}
		hs.h.log.Info("could not move stream to the direct connection; staying relayed", "session", hs.key, "peer", p, "err", err)
	}
	for ev := range events {
		if ev.Peer != p || ev.Kind != p2p.PathChanged || ev.Status.Path != p2p.PathDirect {
			continue
		}
		if err := hs.migrate(ctx, p, ring); err != nil {
			hs.h.log.Info("could not move stream to the direct connection; staying relayed", "session", hs.key, "peer", p, "err", err)
			continue
		}
		return
	}
}

func (hs *hopSession) migrate(ctx context.Context, p peer.ID, ring bool) error {
	h := hs.h
	name, seam, what := ProtoSession, hs.down, "seam to next hop"
	if ring {
		name, seam, what = ProtoRing, hs.ringOut, "ring to head"
	}
	octx, cancel := context.WithTimeout(ctx, h.cfg.OpenTimeout)
	defer cancel()
	ns, err := h.host.NewStream(octx, p, h.host.ProtocolID(name, ProtoVersion))
	if err != nil {
		return err
	}
	if pathOf(h.host, ns) != p2p.PathDirect {
		_ = ns.Reset()
		return errors.New("new stream is not direct")
	}
	msg := cloneOpen(hs.open)
	msg.Resume = true
	msg.HopIndex = uint32(hs.idx + 1)
	if ring {
		msg.HopIndex = uint32(hs.idx)
	}
	w, r := frame.NewWriter(ns, h.cfg.Limits), streamReader(ns, h.cfg.Limits)
	if err := w.WriteStream(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Open{Open: msg}}); err != nil {
		_ = ns.Reset()
		return err
	}
	if !ring { // the next hop confirms it attached the stream
		if dl, ok := octx.Deadline(); ok {
			_ = ns.SetReadDeadline(dl)
		}
		reply, _, err := r.ReadStream()
		_ = ns.SetReadDeadline(time.Time{})
		if err != nil || !reply.GetAccept().GetOk() {
			_ = ns.Reset()
			return fmt.Errorf("next hop refused the move: %v %v", err, reply.GetAccept().GetError())
		}
	}
	old := seam.Swap(ns)
	if !ring {
		go hs.watchDownstream(ns, r)
	}
	if old != nil {
		_ = old.CloseWrite()
	}
	h.log.Info(what+" moved to the direct connection", "session", hs.key, "peer", p)
	return nil
}
