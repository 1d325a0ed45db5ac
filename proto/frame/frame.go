package frame

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"google.golang.org/protobuf/proto"
)

// growStep is the most a payload buffer grows ahead of the bytes received.
const growStep = 64 << 10

// headerRecursionLimit bounds protobuf nesting in headers (ours nest < 8 deep).
const headerRecursionLimit = 32

// Writer writes frames to a stream. Not safe for concurrent use.
type Writer struct {
	w   io.Writer
	lim Limits
	buf []byte // prefix + header, reused
}

// NewWriter returns a Writer that refuses to send frames over lim (zero
// fields take defaults), so a sender fails before its peer would.
func NewWriter(w io.Writer, lim Limits) *Writer {
	return &Writer{w: w, lim: lim.norm()}
}

// WriteMessage writes msg as a frame without payload.
func (w *Writer) WriteMessage(msg proto.Message) error {
	return w.writeFrame(msg, 0, nil)
}

// WriteStream writes a session-stream message. Activation messages are
// written as by WriteActivation; any other kind takes no tensors.
func (w *Writer) WriteStream(m *meshp2pb.StreamMessage, tensors ...[]byte) error {
	if hdr := m.GetActivation(); hdr != nil {
		n, err := prepareActivation(hdr, tensors, w.lim)
		if err != nil {
			return err
		}
		return w.writeFrame(m, n, tensors)
	}
	if len(tensors) != 0 {
		return fmt.Errorf("%w: %d tensors given for a %s message", ErrMalformed, len(tensors), kindName(m))
	}
	return w.writeFrame(m, 0, nil)
}

// WriteActivation writes one activation frame: a StreamMessage holding hdr,
// then tensors (tensors[i] belongs to hdr.Tensors[i]). It sets each
// TensorInfo's byte_length and crc32c from the bytes (hdr is modified) and
// checks the bundle against the Writer's limits and the rules ReadActivation
// enforces (shape x dtype size == length, leading dim == n_rows, ...).
func (w *Writer) WriteActivation(hdr *meshp2pb.ActivationHeader, tensors ...[]byte) error {
	return w.WriteStream(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Activation{Activation: hdr}}, tensors...)
}

func (w *Writer) writeFrame(hdr proto.Message, payloadLen int, payload [][]byte) error {
	if payloadLen > w.lim.MaxPayload {
		return fmt.Errorf("%w: payload %d bytes > %d", ErrFrameTooLarge, payloadLen, w.lim.MaxPayload)
	}
	buf := append(w.buf[:0], 0, 0, 0, 0, 0, 0, 0, 0) // prefix, filled below
	buf, err := proto.MarshalOptions{}.MarshalAppend(buf, hdr)
	if err != nil {
		return fmt.Errorf("frame: marshal header: %w", err)
	}
	w.buf = buf
	h := len(buf) - PrefixSize
	if h > w.lim.MaxHeader {
		return fmt.Errorf("%w: header %d bytes > %d", ErrFrameTooLarge, h, w.lim.MaxHeader)
	}
	binary.BigEndian.PutUint32(buf[0:4], uint32(h))
	binary.BigEndian.PutUint32(buf[4:8], uint32(payloadLen))
	if _, err := w.w.Write(buf); err != nil {
		return fmt.Errorf("frame: write header: %w", err)
	}
	for _, p := range payload {
		if len(p) == 0 {
			continue
		}
		if _, err := w.w.Write(p); err != nil {
			return fmt.Errorf("frame: write payload: %w", err)
		}
	}
	// Do not pin a huge header buffer forever.
	if cap(w.buf) > 4*DefaultMaxHeader {
		w.buf = nil
	}
	return nil
}

// Reader reads frames from a stream. Not safe for concurrent use. It reads
// exactly the bytes of each frame, so it does no read-ahead; wrap syscall-
// backed readers in a bufio.Reader.
type Reader struct {
	r       io.Reader
	lim     Limits
	prefix  [PrefixSize]byte
	hdr     []byte
	payload []byte // reused; returned tensors alias it until the next call
	scope   MemoryScope
	charged int // bytes reserved from scope for payload
}

// NewReader returns a Reader enforcing lim (zero fields take defaults).
func NewReader(r io.Reader, lim Limits) *Reader {
	return &Reader{r: r, lim: lim.norm()}
}

// MemoryScope is the part of a libp2p resource scope (network.StreamScope)
// a Reader charges its payload buffer to.
type MemoryScope interface {
	ReserveMemory(size int, prio uint8) error
	ReleaseMemory(size int)
}

// reservePriority is network.ReservationPriorityAlways: a payload buffer
// may use the scope's whole limit (it is what the stream is for).
const reservePriority = 255

// ChargeTo makes r reserve the payload buffer of every activation frame
// from s before it reads any payload byte, so frames count against the
// resource manager's stream, protocol, peer and system memory limits. The
// buffer is reused, and so is its reservation, which grows with the largest
// frame and is given back with the scope (a libp2p stream's scope ends with
// the stream). A refused reservation is ErrFrameTooLarge ("memory limit")
// and the payload stays unread. It returns r.
func (r *Reader) ChargeTo(s MemoryScope) *Reader {
	r.scope = s
	return r
}

// charge makes the reservation cover a payload buffer of n bytes. A
// buffer over four times what the frame needs (a prefill chunk's, now that
// single-row decode steps follow) is dropped and its reservation given
// back first, so a long session does not hold its largest frame forever.
func (r *Reader) charge(n int) error {
	if r.scope == nil {
		return nil
	}
	if r.charged > growStep && r.charged > 4*n {
		r.scope.ReleaseMemory(r.charged)
		r.payload, r.charged = nil, 0
	}
	if n <= r.charged {
		return nil
	}
	if err := r.scope.ReserveMemory(n-r.charged, reservePriority); err != nil {
		return fmt.Errorf("%w: memory limit: a %d-byte payload buffer is refused: %w", ErrFrameTooLarge, n, err)
	}
	r.charged = n
	return nil
}

// ReadMessage reads one frame without payload into msg. A frame with a
// payload is ErrMalformed (its payload is not consumed).
func (r *Reader) ReadMessage(msg proto.Message) error {
	payloadLen, err := r.readHeader(msg)
	if err != nil {
		return err
	}
	if payloadLen != 0 {
		return fmt.Errorf("%w: %d payload bytes on a message frame", ErrMalformed, payloadLen)
	}
	return nil
}

// ReadStream reads one session-stream frame. For activation frames it
// returns the validated tensors (aliasing the Reader's buffer until the next
// call). For a StreamMessage with no known kind (a newer peer's message) it
// skips the payload and returns the message with a nil Kind. Known
// non-activation kinds must have no payload.
func (r *Reader) ReadStream() (*meshp2pb.StreamMessage, [][]byte, error) {
	m := new(meshp2pb.StreamMessage)
	payloadLen, err := r.readHeader(m)
	if err != nil {
		return nil, nil, err
	}
	switch {
	case m.GetActivation() != nil:
		tensors, err := r.readTensors(m.GetActivation(), payloadLen)
		if err != nil {
			return nil, nil, err
		}
		return m, tensors, nil
	case m.Kind == nil:
		if _, err := io.CopyN(io.Discard, r.r, int64(payloadLen)); err != nil {
			return nil, nil, truncated("payload", err)
		}
		return m, nil, nil
	case payloadLen != 0:
		return nil, nil, fmt.Errorf("%w: %d payload bytes on a %s message", ErrMalformed, payloadLen, kindName(m))
	}
	return m, nil, nil
}

// ReadActivation reads one frame that must be an activation. Another kind
// of message is returned as *UnexpectedMessageError (stream still in sync).
// Tensors alias the Reader's buffer until the next call.
func (r *Reader) ReadActivation() (*meshp2pb.ActivationHeader, [][]byte, error) {
	m, tensors, err := r.ReadStream()
	if err != nil {
		return nil, nil, err
	}
	if m.GetActivation() == nil {
		return nil, nil, &UnexpectedMessageError{Msg: m}
	}
	return m.GetActivation(), tensors, nil
}

// readHeader reads the prefix and the header into msg and returns the
// declared payload length, checked against the limits.
func (r *Reader) readHeader(msg proto.Message) (int, error) {
	if n, err := io.ReadFull(r.r, r.prefix[:]); err != nil {
		if n == 0 && errors.Is(err, io.EOF) {
			return 0, io.EOF // clean end of stream between frames
		}
		return 0, truncated("prefix", err)
	}
	h := uint64(binary.BigEndian.Uint32(r.prefix[0:4]))
	p := uint64(binary.BigEndian.Uint32(r.prefix[4:8]))
	if h > uint64(r.lim.MaxHeader) {
		return 0, fmt.Errorf("%w: header %d bytes > %d", ErrFrameTooLarge, h, r.lim.MaxHeader)
	}
	if p > uint64(r.lim.MaxPayload) {
		return 0, fmt.Errorf("%w: payload %d bytes > %d", ErrFrameTooLarge, p, r.lim.MaxPayload)
	}
	var err error
	r.hdr, err = readN(r.r, r.hdr[:0], int(h))
	if err != nil {
		return 0, truncated("header", err)
	}
	uo := proto.UnmarshalOptions{RecursionLimit: headerRecursionLimit}
	if err := uo.Unmarshal(r.hdr, msg); err != nil {
		return 0, fmt.Errorf("%w: header: %w", ErrMalformed, err)
	}
	if cap(r.hdr) > DefaultMaxHeader {
		r.hdr = nil // keep the common case allocation-free without pinning outliers
	}
	return int(p), nil
}

// readTensors validates hdr against payloadLen, reads the payload with each
// tensor 8-byte aligned in r.payload, and verifies checksums.
func (r *Reader) readTensors(hdr *meshp2pb.ActivationHeader, payloadLen int) ([][]byte, error) {
	total, err := ValidateActivation(hdr, r.lim)
	if err != nil {
		return nil, err
	}
	if total != payloadLen {
		return nil, fmt.Errorf("%w: tensors declare %d bytes, frame carries %d", ErrMalformed, total, payloadLen)
	}
	// Every tensor starts 8-byte aligned in the buffer.
	offs := make([]int, len(hdr.Tensors))
	need := 0
	for i, t := range hdr.Tensors {
		offs[i] = (need + 7) &^ 7
		need = offs[i] + int(t.ByteLength)
	}
	if err := r.charge(need); err != nil {
		return nil, err
	}
	buf := r.payload[:0]
	for i, t := range hdr.Tensors {
		for len(buf) < offs[i] {
			buf = append(room(buf, need-len(buf)), 0)
		}
		if buf, err = readN(r.r, buf, int(t.ByteLength)); err != nil {
			r.payload = buf
			return nil, truncated("payload", err)
		}
	}
	r.payload = buf
	tensors := make([][]byte, len(hdr.Tensors))
	for i, t := range hdr.Tensors {
		b := buf[offs[i] : offs[i]+int(t.ByteLength) : offs[i]+int(t.ByteLength)]
		if got := Checksum(b); got != t.Crc32C {
			return nil, fmt.Errorf("%w: tensor %q: crc32c %08x, header says %08x", ErrChecksum, t.Name, got, t.Crc32C)
		}
		tensors[i] = b
	}
	return tensors, nil
}

// readN appends exactly n bytes from r to buf, growing it with room.
func readN(r io.Reader, buf []byte, n int) ([]byte, error) {
	for n > 0 {
		buf = room(buf, n)
		chunk := min(n, cap(buf)-len(buf))
		got, err := io.ReadFull(r, buf[len(buf):len(buf)+chunk])
		buf = buf[:len(buf)+got]
		n -= got
		if err != nil {
			return buf, err
		}
	}
	return buf, nil
}

// room returns buf with spare capacity when it is full, grown by at most
// growStep (or its current size) and never past upTo more bytes, so a
// declared length alone never causes a large allocation. The new capacity
// is exact (append would round it up): a charged Reader's buffer stays
// within what it reserved.
func room(buf []byte, upTo int) []byte {
	if len(buf) < cap(buf) {
		return buf
	}
	nb := make([]byte, len(buf), len(buf)+min(upTo, max(growStep, len(buf))))
	copy(nb, buf)
	return nb
}

func truncated(what string, err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: truncated %s: %w", ErrMalformed, what, io.ErrUnexpectedEOF)
	}
	return fmt.Errorf("frame: read %s: %w", what, err)
}

// WriteMessage writes msg as one frame without payload, with default limits.
func WriteMessage(w io.Writer, msg proto.Message) error {
	return NewWriter(w, Limits{}).WriteMessage(msg)
}

// ReadMessage reads one frame without payload into msg.
func ReadMessage(r io.Reader, msg proto.Message, lim Limits) error {
	return NewReader(r, lim).ReadMessage(msg)
}

// WriteActivation writes one activation frame with default limits; see
// Writer.WriteActivation.
func WriteActivation(w io.Writer, hdr *meshp2pb.ActivationHeader, tensors ...[]byte) error {
	return NewWriter(w, Limits{}).WriteActivation(hdr, tensors...)
}

// ReadActivation reads one activation frame into fresh memory (the tensors
// are the caller's); see Reader.ReadActivation.
func ReadActivation(r io.Reader, lim Limits) (*meshp2pb.ActivationHeader, [][]byte, error) {
	return NewReader(r, lim).ReadActivation()
}

// WriteBlob writes msg as the header and data as an opaque payload, for
// request/response protocols that ship a file (e.g. a vocabulary). The
// payload is bounded by the Limits like any other.
func (w *Writer) WriteBlob(msg proto.Message, data []byte) error {
	if len(data) > w.lim.MaxPayload {
		return fmt.Errorf("%w: blob %d bytes > %d", ErrFrameTooLarge, len(data), w.lim.MaxPayload)
	}
	return w.writeFrame(msg, len(data), [][]byte{data})
}

// ReadBlob reads a frame written by WriteBlob: the header into msg and the
// payload as fresh memory (at most Limits.MaxPayload bytes). A Reader with
// a scope (ChargeTo) reserves the declared size before it reads a payload
// byte; the reservation lasts until the scope ends.
func (r *Reader) ReadBlob(msg proto.Message) ([]byte, error) {
	n, err := r.readHeader(msg)
	if err != nil {
		return nil, err
	}
	if err := r.charge(n); err != nil {
		return nil, err
	}
	data, err := readN(r.r, nil, n)
	if err != nil {
		return nil, truncated("payload", err)
	}
	return data, nil
}
