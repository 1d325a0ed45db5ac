package session

import (
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// Seam owns one long-lived stream of a session together with the frame
// writer on it. Every write goes through Send or SendActivation, which hold
// the seam's write lock for the whole frame, so frames from different
// goroutines (the head writes tokens and errors to its upstream; a failing
// hop reports while a sender may be blocked) never interleave. Swap moves
// the seam to a replacement stream (a hole punch made a direct connection)
// between two frames.
//
// Two locks, always taken in this order and never with any other lock
// of the session held inside them:
//
//	wmu  serialises writers and is held during the write (I/O);
//	ref  guards the stream pointer and is never held during I/O.
//
// Interrupt, Reset, Close, Is and RemotePeer take only ref, so they work while a
// writer is blocked on a peer that stopped reading: a write deadline or a
// reset is what frees that writer.
type Seam struct {
	lim frame.Limits

	wmu sync.Mutex
	w   *frame.Writer // guarded by wmu

	ref sync.Mutex
	s   network.Stream // guarded by ref; written only with wmu held too
}

// NewSeam wraps s (nil: a seam whose stream is attached later with Swap).
func NewSeam(s network.Stream, lim frame.Limits) *Seam {
	m := &Seam{lim: lim, s: s}
	if s != nil {
		m.w = frame.NewWriter(s, lim)
	}
	return m
}

// stream is the seam's current stream (nil before one is attached). It
// stays unexported: writes go through Send, so nobody writes without the
// lock.
func (m *Seam) stream() network.Stream {
	m.ref.Lock()
	defer m.ref.Unlock()
	return m.s
}

// Is reports whether s is the seam's current stream.
func (m *Seam) Is(s network.Stream) bool { return m.stream() == s }

// RemotePeer is the peer at the other end ("" before a stream is attached).
func (m *Seam) RemotePeer() peer.ID {
	if s := m.stream(); s != nil {
		return s.Conn().RemotePeer()
	}
	return ""
}

// Send writes one stream message, bounding the write by timeout (0: no
// deadline). It returns an error without writing when no stream is
// attached.
func (m *Seam) Send(msg *meshp2pb.StreamMessage, timeout time.Duration) error {
	return m.write(timeout, func(w *frame.Writer) error { return w.WriteStream(msg) })
}

// SendActivation writes one activation frame with its payload.
func (m *Seam) SendActivation(hdr *meshp2pb.ActivationHeader, payload []byte, timeout time.Duration) error {
	return m.write(timeout, func(w *frame.Writer) error { return w.WriteActivation(hdr, payload) })
}

// write runs one frame write under the write lock, with the deadline set.
func (m *Seam) write(timeout time.Duration, frameWrite func(*frame.Writer) error) error {
	m.wmu.Lock()
	defer m.wmu.Unlock()
	s := m.stream()
	if s == nil {
		return errNoStream
	}
	if timeout > 0 {
		_ = s.SetWriteDeadline(time.Now().Add(timeout))
	}
	return frameWrite(m.w)
}

// Swap makes ns the seam's stream, waiting for a frame in progress to end,
// and returns the previous stream (nil if none) for the caller to end.
func (m *Seam) Swap(ns network.Stream) network.Stream {
	m.wmu.Lock()
	defer m.wmu.Unlock()
	m.ref.Lock()
	defer m.ref.Unlock()
	old := m.s
	m.s, m.w = ns, frame.NewWriter(ns, m.lim)
	return old
}

// Interrupt sets a write deadline on the current stream without waiting
// for the write lock: a writer blocked on a peer that stopped reading
// fails at the deadline and lets the next one in.
func (m *Seam) Interrupt(d time.Duration) {
	if s := m.stream(); s != nil {
		_ = s.SetWriteDeadline(time.Now().Add(d))
	}
}

// Reset resets the current stream (blocked reads and writes on it fail).
func (m *Seam) Reset() {
	if s := m.stream(); s != nil {
		_ = s.Reset()
	}
}

// Close closes the current stream.
func (m *Seam) Close() {
	if s := m.stream(); s != nil {
		_ = s.Close()
	}
}

// streamReader is the frame reader of a session, seam or ring stream: its
// payload buffer is charged to the stream's resource scope (the stream,
// protocol-peer, peer and system limits), so a frame the resource manager
// cannot hold is refused before any of its payload is read.
func streamReader(s network.Stream, lim frame.Limits) *frame.Reader {
	return frame.NewReader(s, lim).ChargeTo(s.Scope())
}
