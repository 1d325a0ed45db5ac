package session

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"math"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// Signed transcripts (docs/trust.md). Every hop of a session that asks for
// them (SessionOpen.transcripts) digests each frame it receives and each
// it sends; every TranscriptWindow input frames, and at a clean close, it
// signs a Transcript of the window and sends it where its output went (the
// next hop; the tail: the head over the ring). The receiver checks the
// signature and that the output digest and sketch match the bytes it got,
// and keeps the statement for an audit: no hop can later deny what it sent.

const (
	// TranscriptWindow is the input frames one statement covers (the last
	// window of a session may hold fewer).
	TranscriptWindow = 32
	// SketchK is the entries per sketch row (the top-k of a row by
	// magnitude: the cross-kernel-class comparison, audit.go).
	SketchK = 8
	// MaxTranscriptBytes bounds one signed statement on the wire.
	MaxTranscriptBytes = 16 << 10
	// maxSketchRows bounds the rows of one statement's sketch: one per
	// activation sent, one per input frame.
	maxSketchRows = TranscriptWindow
)

// transcriptDomain separates transcript signatures from other uses of a key.
const transcriptDomain = "meshp2p/transcript/v1\x00"

// ErrTranscript: a statement that is malformed, not signed by the hop it
// names, or that does not match the frames its receiver got.
var ErrTranscript = errors.New("bad transcript")

// digestActivation feeds one activation frame's digest to h: the fields
// that change its result and its payload, never its timings.
func digestActivation(h hash.Hash, a *meshp2pb.ActivationHeader, payload []byte) {
	var b []byte
	b = append(b, 'A')
	b = binary.AppendUvarint(b, a.GetStep())
	b = binary.AppendUvarint(b, uint64(a.GetPosStart()))
	b = binary.AppendUvarint(b, uint64(a.GetNRows()))
	b = append(b, flag(a.GetIsPrefill()), flag(a.GetLastChunk()), flag(a.GetVerify()))
	b = binary.AppendUvarint(b, a.GetSpecGen())
	b = appendTokens(b, a.GetTokens())
	b = appendTokens(b, a.GetLookahead())
	b = binary.AppendUvarint(b, uint64(len(a.GetTensors())))
	for _, t := range a.GetTensors() {
		b = binary.AppendUvarint(b, uint64(t.GetDtype()))
		b = binary.AppendUvarint(b, uint64(len(t.GetShape())))
		for _, d := range t.GetShape() {
			b = binary.AppendVarint(b, d)
		}
	}
	b = binary.AppendUvarint(b, uint64(len(payload)))
	h.Write(b)
	h.Write(payload)
}

// digestRing feeds what the tail sends the head for one input frame: a
// token or a window's result (tokens, positions, end of generation).
func digestRing(h hash.Hash, msg *meshp2pb.StreamMessage) {
	var b []byte
	switch {
	case msg.GetToken() != nil:
		t := msg.GetToken()
		b = append(b, 'T')
		b = binary.AppendUvarint(b, t.GetStep())
		b = binary.AppendUvarint(b, uint64(t.GetPosition()))
		b = appendTokens(b, []int32{t.GetToken()})
		b = append(b, flag(t.GetEos()))
	case msg.GetWindowResult() != nil:
		w := msg.GetWindowResult()
		b = append(b, 'W')
		b = binary.AppendUvarint(b, w.GetStep())
		b = binary.AppendUvarint(b, w.GetSpecGen())
		b = binary.AppendUvarint(b, uint64(w.GetPosition()))
		b = appendTokens(b, w.GetTokens())
		b = append(b, flag(w.GetEos()))
	}
	h.Write(b)
}

func appendTokens(b []byte, toks []int32) []byte {
	b = binary.AppendUvarint(b, uint64(len(toks)))
	for _, t := range toks {
		b = binary.AppendVarint(b, int64(t))
	}
	return b
}

func flag(v bool) byte {
	if v {
		return 1
	}
	return 0
}

// sketchOf is the top-k of the last row of an activation's payload, as
// the receiver decodes it (wire dtype to f32).
func sketchOf(dt meshp2pb.DType, payload []byte, rows, nEmbd int) (*meshp2pb.SketchRow, error) {
	if rows <= 0 || nEmbd <= 0 {
		return nil, fmt.Errorf("%w: sketch of %d rows of %d", ErrTranscript, rows, nEmbd)
	}
	size := len(payload) / (rows * nEmbd)
	if size == 0 || len(payload) != size*rows*nEmbd {
		return nil, fmt.Errorf("%w: payload of %d bytes is not %d rows of %d", ErrTranscript, len(payload), rows, nEmbd)
	}
	row, err := frame.ToF32(dt, payload[(rows-1)*nEmbd*size:], nil)
	if err != nil {
		return nil, err
	}
	return SketchRow(row, SketchK), nil
}

// SketchRow is the k entries of row with the largest magnitude, by
// decreasing magnitude (ties: lower index first); NaN counts as largest.
func SketchRow(row []float32, k int) *meshp2pb.SketchRow {
	k = max(0, min(k, len(row)))
	idx := make([]uint32, 0, k)
	mags := make([]float32, 0, k)
	for i, v := range row {
		m := math.Float32frombits(math.Float32bits(v) &^ (1 << 31)) // |v|
		if m != m {                                                 // NaN
			m = float32(math.Inf(1))
		}
		if len(idx) == k && (k == 0 || m <= mags[k-1]) {
			continue // not larger than the smallest kept (ties: the lower index stays)
		}
		at := len(idx)
		for at > 0 && m > mags[at-1] {
			at--
		}
		if len(idx) < k {
			idx, mags = append(idx, 0), append(mags, 0)
		}
		copy(idx[at+1:], idx[at:len(idx)-1])
		copy(mags[at+1:], mags[at:len(mags)-1])
		idx[at], mags[at] = uint32(i), m
	}
	s := &meshp2pb.SketchRow{Index: idx, Value: make([]float32, len(idx))}
	for i, j := range idx {
		s.Value[i] = row[j]
	}
	return s
}

// window accumulates one direction's digest of the current window.
type window struct {
	h hash.Hash
}

func (w *window) add() hash.Hash {
	if w.h == nil {
		w.h = sha256.New()
	}
	return w.h
}

// sum is the window's digest; the next window starts empty.
func (w *window) sum() []byte {
	d := w.add().Sum(nil)
	w.h = nil
	return d
}

// transcriber is one hop's side of a session's transcripts: the input and
// output digests of the current window and the statements signed so far.
type transcriber struct {
	base      *meshp2pb.Transcript // the fixed fields
	key       crypto.PrivKey
	in, out   window
	frames    uint32 // input frames in the current window
	first     uint32 // the current window's first input frame
	n         uint32 // windows signed
	sketch    []*meshp2pb.SketchRow
	finalSent bool
	// adoptedDigest is the digest of the adopted positions' inputs once
	// adoptedReady is closed (hopTranscripts.adopted computes it off the
	// first frame's path; the first statement waits for it).
	adoptedReady  chan struct{}
	adoptedDigest []byte
}

func newTranscriber(hs *hopSession, key crypto.PrivKey, kernelClass string) *transcriber {
	return &transcriber{key: key, base: &meshp2pb.Transcript{SessionId: hs.open.GetSessionId(), OriginPeerId: []byte(hs.origin),
		Epoch: hs.key.Epoch, HopIndex: uint32(hs.idx), PeerId: []byte(hs.h.host.ID()), ModelFingerprint: hs.open.GetModelFingerprint(),
		Start: uint32(hs.se.info.Start), End: uint32(hs.se.info.End), KernelClass: kernelClass, OpenDigest: OpenDigest(hs.open)}}
}

// input digests one input frame.
func (t *transcriber) input(a *meshp2pb.ActivationHeader, payload []byte) {
	digestActivation(t.in.add(), a, payload)
}

// sent digests an activation sent for the current input frame.
func (t *transcriber) sent(a *meshp2pb.ActivationHeader, payload []byte, nEmbd int) error {
	digestActivation(t.out.add(), a, payload)
	s, err := sketchOf(a.GetTensors()[0].GetDtype(), payload, int(a.GetNRows()), nEmbd)
	if err != nil {
		return err
	}
	t.sketch = append(t.sketch, s)
	return nil
}

// ring digests what the tail sent the head for the current input frame.
func (t *transcriber) ring(msg *meshp2pb.StreamMessage) { digestRing(t.out.add(), msg) }

// done ends one input frame; it returns the window's statement when the
// window is full (nil otherwise).
func (t *transcriber) done() (*meshp2pb.SignedTranscript, error) {
	t.frames++
	if t.frames < TranscriptWindow {
		return nil, nil
	}
	return t.statement(false)
}

// statement signs the current window (final: the last one, possibly
// empty) and starts the next.
func (t *transcriber) statement(final bool) (*meshp2pb.SignedTranscript, error) {
	if t.adoptedReady != nil {
		<-t.adoptedReady
		t.base.AdoptedDigest, t.adoptedReady = t.adoptedDigest, nil
	}
	st := proto.Clone(t.base).(*meshp2pb.Transcript)
	st.Window, st.FirstFrame, st.Frames, st.Final = t.n, t.first, t.frames, final
	st.InDigest, st.OutDigest, st.Sketch = t.in.sum(), t.out.sum(), t.sketch
	t.n++
	t.first += t.frames
	t.frames, t.sketch = 0, nil
	t.finalSent = final
	return SignTranscript(st, t.key)
}

// SignTranscript signs st with key (the key of st.peer_id).
func SignTranscript(st *meshp2pb.Transcript, key crypto.PrivKey) (*meshp2pb.SignedTranscript, error) {
	b, err := proto.Marshal(st)
	if err != nil {
		return nil, err
	}
	sig, err := key.Sign(append([]byte(transcriptDomain), b...))
	if err != nil {
		return nil, fmt.Errorf("sign transcript: %w", err)
	}
	out := &meshp2pb.SignedTranscript{Transcript: b, Signature: sig}
	if _, err := peer.ID(st.GetPeerId()).ExtractPublicKey(); err != nil {
		if out.PublicKey, err = crypto.MarshalPublicKey(key.GetPublic()); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// OpenTranscript checks a signed statement's size, signature and shape
// and returns it. It does not check what the statement says against any
// frames (checker does).
func OpenTranscript(s *meshp2pb.SignedTranscript) (*meshp2pb.Transcript, error) {
	if proto.Size(s) > MaxTranscriptBytes {
		return nil, fmt.Errorf("%w: %d bytes, over %d", ErrTranscript, proto.Size(s), MaxTranscriptBytes)
	}
	st := &meshp2pb.Transcript{}
	if err := proto.Unmarshal(s.GetTranscript(), st); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrTranscript, err)
	}
	id, err := peer.IDFromBytes(st.GetPeerId())
	if err != nil {
		return nil, fmt.Errorf("%w: signer: %v", ErrTranscript, err)
	}
	pub, err := id.ExtractPublicKey()
	if err != nil {
		if pub, err = crypto.UnmarshalPublicKey(s.GetPublicKey()); err != nil || !id.MatchesPublicKey(pub) {
			return nil, fmt.Errorf("%w: no public key for %s", ErrTranscript, id)
		}
	}
	if ok, err := pub.Verify(append([]byte(transcriptDomain), s.GetTranscript()...), s.GetSignature()); err != nil || !ok {
		return nil, fmt.Errorf("%w: bad signature by %s", ErrTranscript, id)
	}
	switch {
	case len(st.GetSessionId()) != 16:
		return nil, fmt.Errorf("%w: session id of %d bytes", ErrTranscript, len(st.GetSessionId()))
	case len(st.GetInDigest()) != sha256.Size || len(st.GetOutDigest()) != sha256.Size:
		return nil, fmt.Errorf("%w: digests must be %d bytes", ErrTranscript, sha256.Size)
	case st.GetFrames() > TranscriptWindow || (st.GetFrames() == 0 && !st.GetFinal()) || (st.GetFrames() < TranscriptWindow && !st.GetFinal()):
		return nil, fmt.Errorf("%w: window of %d frames (final %v), want %d (fewer only when final)", ErrTranscript, st.GetFrames(), st.GetFinal(), TranscriptWindow)
	case len(st.GetSketch()) > maxSketchRows:
		return nil, fmt.Errorf("%w: %d sketch rows, over %d", ErrTranscript, len(st.GetSketch()), maxSketchRows)
	case st.GetStart() >= st.GetEnd():
		return nil, fmt.Errorf("%w: layer range %d-%d", ErrTranscript, st.GetStart(), st.GetEnd())
	}
	for _, r := range st.GetSketch() {
		if len(r.GetIndex()) != len(r.GetValue()) || len(r.GetIndex()) > SketchK {
			return nil, fmt.Errorf("%w: sketch row of %d indices and %d values (at most %d)", ErrTranscript, len(r.GetIndex()), len(r.GetValue()), SketchK)
		}
	}
	return st, nil
}

// checker is the receiving side of a neighbour's statements: the digest
// and sketch of what arrived since its last statement.
type checker struct {
	got    window
	sketch []*meshp2pb.SketchRow
	next   uint32 // the window the next statement must be
	frames uint32 // input frames its statements covered so far
	final  bool
	held   []*meshp2pb.SignedTranscript
}

func (c *checker) activation(a *meshp2pb.ActivationHeader, payload []byte, nEmbd int) error {
	digestActivation(c.got.add(), a, payload)
	if len(a.GetTensors()) == 0 {
		return nil
	}
	s, err := sketchOf(a.GetTensors()[0].GetDtype(), payload, int(a.GetNRows()), nEmbd)
	if err != nil {
		return err
	}
	if len(c.sketch) >= maxSketchRows {
		return fmt.Errorf("%w: more than %d frames without a statement", ErrTranscript, maxSketchRows)
	}
	c.sketch = append(c.sketch, s)
	return nil
}

func (c *checker) ring(msg *meshp2pb.StreamMessage) { digestRing(c.got.add(), msg) }

// check accepts a statement from want (hop idx of the session) if it is
// the next window and says what arrived; it keeps it (bounded by the
// session's frames: one per TranscriptWindow).
func (c *checker) check(s *meshp2pb.SignedTranscript, hs *hopSession, want peer.ID, idx int) error {
	st, err := OpenTranscript(s)
	if err != nil {
		return err
	}
	switch {
	case c.final:
		return fmt.Errorf("%w: statement after the final one", ErrTranscript)
	case peer.ID(st.GetPeerId()) != want || int(st.GetHopIndex()) != idx:
		return fmt.Errorf("%w: signed by %s as hop %d, want %s as hop %d", ErrTranscript, peer.ID(st.GetPeerId()), st.GetHopIndex(), want, idx)
	case !bytes.Equal(st.GetSessionId(), hs.open.GetSessionId()) || st.GetEpoch() != hs.key.Epoch || peer.ID(st.GetOriginPeerId()) != hs.origin:
		return fmt.Errorf("%w: for another session", ErrTranscript)
	case st.GetWindow() != c.next || st.GetFirstFrame() != c.frames:
		return fmt.Errorf("%w: window %d from frame %d, want %d from %d", ErrTranscript, st.GetWindow(), st.GetFirstFrame(), c.next, c.frames)
	case st.GetModelFingerprint() != hs.open.GetModelFingerprint():
		return fmt.Errorf("%w: model %s", ErrTranscript, st.GetModelFingerprint())
	case !bytes.Equal(st.GetOpenDigest(), OpenDigest(hs.open)):
		return fmt.Errorf("%w: signed under another open of the session", ErrTranscript)
	}
	if h := hs.open.GetRoute().GetHops()[idx]; st.GetStart() != h.GetStart() || st.GetEnd() != h.GetEnd() {
		return fmt.Errorf("%w: layers %d-%d, the route has %d-%d", ErrTranscript, st.GetStart(), st.GetEnd(), h.GetStart(), h.GetEnd())
	}
	if got := c.got.sum(); !bytes.Equal(got, st.GetOutDigest()) {
		return fmt.Errorf("%w: window %d: the output digest is not what arrived", ErrTranscript, st.GetWindow())
	}
	if len(st.GetSketch()) != len(c.sketch) {
		return fmt.Errorf("%w: window %d: %d sketch rows for %d activations", ErrTranscript, st.GetWindow(), len(st.GetSketch()), len(c.sketch))
	}
	for i, r := range c.sketch {
		if !proto.Equal(r, st.GetSketch()[i]) {
			return fmt.Errorf("%w: window %d: sketch row %d is not what arrived", ErrTranscript, st.GetWindow(), i)
		}
	}
	c.sketch = c.sketch[:0]
	c.next++
	c.frames += st.GetFrames()
	c.final = st.GetFinal()
	c.held = append(c.held, s)
	return nil
}
