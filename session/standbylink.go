package session

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/network"

	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// standbyLink is what both feeders of a hot standby keep: a hop's mirror
// of the frames its next hop gets (standby.go) and the origin's feed of
// the head's standby (headstandby.go). A link is dropped once: the
// session goes on without its standby, which must not take over.
type standbyLink struct {
	dropped atomic.Bool
	gone    chan struct{} // closed when dropped
	once    sync.Once
	// closed: the clean close went to the standby, which then ends its
	// stream; that end is no drop, even before the session here ends.
	closed atomic.Bool
}

func newStandbyLink() standbyLink { return standbyLink{gone: make(chan struct{})} }

// markDropped marks the link dropped, once, and then runs report (count, log).
func (l *standbyLink) markDropped(report func()) {
	l.once.Do(func() {
		l.dropped.Store(true)
		close(l.gone)
		report()
	})
}

// admitStandby sends open on the standby's new stream s (seam) and reads
// its accept, both by deadline: the reader of the stream (watch goes on
// reading it) and the positions of open's chain the standby holds, where
// its prefill starts (its hop_cached where open's prefix owns them, as any
// hop answers; 0 otherwise).
func admitStandby(s network.Stream, seam *Seam, lim frame.Limits, open *meshp2pb.SessionOpen, deadline time.Time) (*frame.Reader, int, error) {
	if err := seam.Send(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Open{Open: open}}, time.Until(deadline)); err != nil {
		return nil, 0, fmt.Errorf("send open: %w", err)
	}
	r := streamReader(s, lim)
	_ = s.SetReadDeadline(deadline)
	msg, _, err := r.ReadStream()
	_ = s.SetReadDeadline(time.Time{})
	if err == nil && !msg.GetAccept().GetOk() {
		err = fmt.Errorf("refused: %v", frame.FromProto(msg.GetAccept().GetError()))
	}
	if err != nil {
		return nil, 0, err
	}
	if hc := msg.GetAccept().GetHopCached(); len(hc) > 0 && ownCount(open.GetPrefix(), hc[0]) {
		return r, int(hc[0]), nil
	}
	return r, 0, nil
}

// watch reads the standby's stream: a standby only speaks to say it
// failed. Unless ended (the session or epoch here) comes first, its end
// drops the link, all but the clean end that answers our close.
func (l *standbyLink) watch(r *frame.Reader, ended <-chan struct{}, drop func(why string, err error)) {
	msg, _, err := r.ReadStream()
	switch {
	case err != nil:
	case msg.GetError() != nil:
		err = frame.FromProto(msg.GetError())
	default:
		err = fmt.Errorf("it sent %T", msg.GetKind())
	}
	select {
	case <-ended:
	default:
		if !l.closed.Load() || !errors.Is(err, io.EOF) {
			drop("it ended", err)
		}
	}
}
