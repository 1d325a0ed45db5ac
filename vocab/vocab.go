// Package vocab is the vocabulary protocol: a node serves its model's
// vocabulary-only GGUF file (Service) so that origins without weights can
// tokenize, and an origin fetches one from a peer and verifies it against
// the model fingerprint (Fetch, FetchFirst). No cgo: the file is checked
// with engine/gguf, loaded by the caller.
package vocab

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
	"github.com/neuron-tai/meshp2p/session"
)

// The protocol (/meshp2p/<net>/vocab/1.0.0) and its bounds.
const (
	Proto        = "vocab"
	ProtoVersion = "1.0.0"
	// MaxBytes bounds a vocabulary file on the wire (a 152k-token Qwen
	// vocabulary with merges is about 10 MiB).
	MaxBytes = 64 << 20
	// TransferTimeout bounds one vocabulary transfer (a 10 MiB file over
	// a relayed home connection), on both ends, whatever its rate.
	TransferTimeout = 60 * time.Second
	// RequestTimeout bounds reading a request: one frame of about 80
	// bytes, a few round trips even over a relay. The server takes no
	// transfer slot before a complete, valid request has arrived within
	// it, so a peer that opens streams and sends nothing (or half a
	// request) holds no slot, only its stream, for at most this long.
	RequestTimeout = 5 * time.Second
	// MinRate is the slowest a transfer may run, in bytes per second,
	// after Grace; both ends enforce it byte by byte (byte k is due
	// Grace + k/MinRate after the request), so a reader (or sender) that
	// falls behind loses the transfer where it falls behind, not only at
	// TransferTimeout: one at half the rate is cut off after about
	// 2×Grace whatever the file size, one that reads nothing after Grace
	// plus the stream's window at MinRate (yamux: 256 KiB, 2 s). 128
	// KiB/s (1 Mbit/s) is below the ~170 KiB/s that TransferTimeout
	// already asks of a 10 MiB vocabulary, so it cuts off no transfer
	// that TransferTimeout would let finish, except one that stalls on the
	// way. Four identities holding every slot must read 4×MinRate from
	// each node, and still give the slots back within TransferTimeout.
	MinRate = 128 << 10
	// Grace is the time a transfer has on top of its bytes at MinRate
	// (connection warm-up, a relay's first round trips).
	Grace = 10 * time.Second
	// HedgeDelay is how long FetchFirst waits on the peers it asked
	// before it asks the next one as well: one that stalls costs this,
	// not TransferTimeout. A vocabulary of a few MiB arrives within it
	// over a direct link; over a slow one the next peer's copy races the
	// first (at most one copy per peer asked, once per model).
	HedgeDelay = 5 * time.Second
	// MaxTransfers bounds concurrent vocabulary downloads from one node.
	MaxTransfers = 4
	// maxRequest bounds the request frame's header (a fingerprint).
	maxRequest = 1 << 10
	// sendChunk is how much the server writes under one deadline.
	sendChunk = 64 << 10
)

// Service serves the vocabularies of the models a node holds; one
// transfer per peer at a time, MaxTransfers in all, each slot taken only
// once a valid request has arrived and given back when the reader falls
// below MinRate.
type Service struct {
	host   session.Host
	lim    frame.Limits
	log    *slog.Logger
	sem    chan struct{} // bounds concurrent transfers
	mu     sync.Mutex
	byFP   map[string][]byte // the files, read once
	active map[peer.ID]bool  // peers with a transfer in progress (one each)
	// MinRate and Grace override the package's (0: those); set before
	// the first request.
	MinRate int64
	Grace   time.Duration
}

// NewService registers the protocol handler on h. lim is the node's frame
// limits (its payload bound is raised to MaxBytes).
func NewService(h session.Host, lim frame.Limits, log *slog.Logger) *Service {
	lim.MaxPayload = MaxBytes
	v := &Service{host: h, lim: lim, log: log, sem: make(chan struct{}, MaxTransfers), byFP: map[string][]byte{},
		active: map[peer.ID]bool{}}
	h.SetStreamHandler(h.ProtocolID(Proto, ProtoVersion), v.handle)
	return v
}

// Add serves the vocabulary file at path for model fp.
func (v *Service) Add(fp, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if len(data) > MaxBytes {
		return fmt.Errorf("vocabulary %s is %d bytes, over the %d limit", path, len(data), MaxBytes)
	}
	v.mu.Lock()
	v.byFP[fp] = data
	v.mu.Unlock()
	return nil
}

// Remove stops serving model fp's vocabulary (a model the node no longer
// serves); requests for it are answered as for any unknown model.
func (v *Service) Remove(fp string) {
	v.mu.Lock()
	delete(v.byFP, fp)
	v.mu.Unlock()
}

// Close removes the protocol handler.
func (v *Service) Close() {
	v.host.RemoveStreamHandler(v.host.ProtocolID(Proto, ProtoVersion))
}

func (v *Service) handle(s network.Stream) {
	defer s.Close()
	p := s.Conn().RemotePeer()
	// The request first, under a short deadline and without a slot.
	t0 := time.Now()
	_ = s.SetDeadline(t0.Add(RequestTimeout))
	var req meshp2pb.VocabRequest
	if err := frame.NewReader(s, frame.Limits{MaxHeader: maxRequest}).ReadMessage(&req); err != nil {
		_ = s.Reset()
		return
	}
	w := frame.NewWriter(s, v.lim)
	fp := req.GetModelFingerprint()
	if !route.ValidFingerprint(fp) {
		_ = w.WriteMessage(&meshp2pb.VocabResponse{Error: &meshp2pb.Error{
			Code: meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, Message: "not a model fingerprint"}})
		return
	}
	v.mu.Lock()
	data := v.byFP[fp]
	v.mu.Unlock()
	if data == nil {
		_ = w.WriteMessage(&meshp2pb.VocabResponse{Error: &meshp2pb.Error{
			Code: meshp2pb.ErrorCode_ERROR_CODE_MODEL_MISMATCH, Message: "no vocabulary for that model here"}})
		return
	}
	// One peer may hold one transfer slot at a time, so a single peer
	// cannot occupy all of them.
	v.mu.Lock()
	busy := v.active[p]
	if !busy {
		v.active[p] = true
	}
	v.mu.Unlock()
	if busy {
		_ = s.Reset()
		return
	}
	defer func() {
		v.mu.Lock()
		delete(v.active, p)
		v.mu.Unlock()
	}()
	select {
	case v.sem <- struct{}{}:
		defer func() { <-v.sem }()
	default:
		_ = s.Reset() // busy: the client tries another peer
		return
	}
	_ = s.CloseRead()
	pw := newPaced(s, t0, v.MinRate, v.Grace)
	if err := frame.NewWriter(pw, v.lim).WriteBlob(&meshp2pb.VocabResponse{Size: uint64(len(data))}, data); err != nil {
		_ = s.Reset()
		if pw.late() {
			v.log.Info("peer reads its vocabulary too slowly; reset", "peer", p, "bytes", len(data), "sent", pw.n)
		}
	}
}

// paced bounds a transfer's stream by time: byte k (counted from the
// request) is due Grace + k/MinRate after t0, and all of it within
// TransferTimeout (or the earlier end).
type paced struct {
	s       network.Stream
	t0, end time.Time
	rate    float64
	grace   time.Duration
	n       int64 // bytes moved so far
	dl      time.Time
}

func newPaced(s network.Stream, t0 time.Time, minRate int64, grace time.Duration) *paced {
	if minRate <= 0 {
		minRate = MinRate
	}
	if grace <= 0 {
		grace = Grace
	}
	return &paced{s: s, t0: t0, end: t0.Add(TransferTimeout), rate: float64(minRate), grace: grace}
}

// due is when the transfer must have moved n bytes.
func (p *paced) due(n int64) time.Time {
	d := p.t0.Add(p.grace + time.Duration(float64(n)/p.rate*float64(time.Second)))
	if d.After(p.end) {
		d = p.end
	}
	return d
}

// late reports whether the last deadline set has passed.
func (p *paced) late() bool { return !p.dl.IsZero() && !time.Now().Before(p.dl) }

// Write writes b in chunks, each under the deadline of its last byte.
func (p *paced) Write(b []byte) (int, error) {
	done := 0
	for done < len(b) {
		k := min(len(b)-done, sendChunk)
		p.dl = p.due(p.n + int64(k))
		_ = p.s.SetWriteDeadline(p.dl)
		m, err := p.s.Write(b[done : done+k])
		done += m
		p.n += int64(m)
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

// Read reads under the deadline of the next byte.
func (p *paced) Read(b []byte) (int, error) {
	p.dl = p.due(p.n + 1)
	_ = p.s.SetReadDeadline(p.dl)
	m, err := p.s.Read(b)
	p.n += int64(m)
	return m, err
}

// FileName is the name Fetch gives model fp's vocabulary in its dir.
func FileName(fp string) string { return fp[:16] + ".vocab.gguf" }

// Fetch downloads the vocabulary of model fp from peer p into dir and
// verifies it against the fingerprint (gguf.CheckVocab). It returns the
// file's path. The transfer ends with ctx, at TransferTimeout, or when the
// peer sends slower than MinRate (after Grace).
func Fetch(ctx context.Context, h session.Host, p peer.ID, fp, dir string) (string, error) {
	tmp, _, err := download(ctx, h, p, fp, dir)
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, FileName(fp))
	if err := os.Rename(tmp, out); err != nil {
		_ = os.Remove(tmp)
		return "", err
	}
	return out, nil
}

// download fetches and verifies model fp's vocabulary from p into a new
// temporary file in dir and returns its path and the layer count its
// verified digests prove (gguf.CheckVocabLayers).
func download(ctx context.Context, h session.Host, p peer.ID, fp, dir string) (string, int, error) {
	tmp, err := transfer(ctx, h, p, fp, dir)
	if err != nil {
		return "", 0, err
	}
	nl, err := gguf.CheckVocabLayers(ctx, tmp, fp)
	if err != nil {
		_ = os.Remove(tmp)
		return "", 0, fmt.Errorf("vocab from %s does not belong to model %.16s: %w", p, fp, err)
	}
	return tmp, nl, nil
}

// transfer reads model fp's vocabulary from p into a new temporary file in
// dir (not yet verified) and returns its path.
func transfer(ctx context.Context, h session.Host, p peer.ID, fp, dir string) (string, error) {
	if !route.ValidFingerprint(fp) {
		return "", fmt.Errorf("vocab: %q is not a model fingerprint", fp)
	}
	ctx, cancel := context.WithTimeout(ctx, TransferTimeout)
	defer cancel()
	lim := frame.Limits{MaxPayload: MaxBytes}
	s, err := h.NewStream(ctx, p, h.ProtocolID(Proto, ProtoVersion))
	if err != nil {
		return "", fmt.Errorf("vocab from %s: %w", p, err)
	}
	defer s.Close()
	// A cancelled fetch (another peer's copy won) ends at once.
	stop := context.AfterFunc(ctx, func() { _ = s.Reset() })
	defer stop()
	t0 := time.Now()
	_ = s.SetWriteDeadline(t0.Add(RequestTimeout))
	if err := frame.NewWriter(s, lim).WriteMessage(&meshp2pb.VocabRequest{ModelFingerprint: fp}); err != nil {
		return "", fmt.Errorf("vocab from %s: %w", p, err)
	}
	_ = s.CloseWrite()
	pr := newPaced(s, t0, 0, 0)
	var resp meshp2pb.VocabResponse
	data, err := frame.NewReader(pr, lim).ReadBlob(&resp)
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", ctx.Err(), err)
		} else if pr.late() {
			err = fmt.Errorf("slower than %d B/s after %s: %w", MinRate, Grace, err)
		}
		return "", fmt.Errorf("vocab from %s: %w", p, err)
	}
	if resp.GetError() != nil {
		return "", fmt.Errorf("vocab from %s: %w", p, frame.FromProto(resp.GetError()))
	}
	if uint64(len(data)) != resp.GetSize() {
		return "", fmt.Errorf("vocab from %s: %d bytes, announced %d", p, len(data), resp.GetSize())
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	f, err := os.CreateTemp(dir, FileName(fp)+".*.tmp")
	if err != nil {
		return "", err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(tmp)
		return "", err
	}
	return tmp, nil
}

// FetchFirst fetches model fp's vocabulary into dir from the first of
// peers to deliver a verified file, and returns its path (the one Fetch
// gives it). It asks peers[0], then the next peer whenever a transfer has
// failed or HedgeDelay has passed since the last one started, so a peer that stalls costs HedgeDelay,
// not TransferTimeout. A verified file is installed and handed to accept
// with the layer count it proves (if not nil: the caller loads it; one
// call at a time); the first one
// accept takes wins and the other transfers are cancelled. Each transfer
// is bounded as in Fetch; the error joins every peer's. failed, if set,
// hears of each peer whose own transfer failed (refused, reset, stalled
// past its deadlines, or a file that does not verify), not of those
// cancelled because another won: a caller remembers them (failure memory).
func FetchFirst(ctx context.Context, h session.Host, peers []peer.ID, fp, dir string, accept func(path string, nLayer int) error, failed func(peer.ID, error)) (string, error) {
	if len(peers) == 0 {
		return "", errors.New("vocab: no peer to ask")
	}
	ctx, cancel := context.WithCancel(ctx)
	f := &firstFetch{h: h, fp: fp, dir: dir, out: filepath.Join(dir, FileName(fp)), accept: accept, failed: failed,
		results: make(chan error, len(peers))}
	defer func() {
		cancel()
		f.wg.Wait() // every other transfer has ended and removed its file
	}()
	hedge := time.NewTimer(HedgeDelay)
	defer hedge.Stop()
	next, running := 1, 1
	f.start(ctx, peers[0])
	var errs []error
	for {
		select {
		case err := <-f.results:
			running--
			if err == nil {
				return f.out, nil
			}
			errs = append(errs, err)
			if next < len(peers) {
				f.start(ctx, peers[next])
				next++
				running++
				hedge.Reset(HedgeDelay)
			} else if running == 0 {
				return "", errors.Join(errs...)
			}
		case <-hedge.C:
			if next < len(peers) {
				f.start(ctx, peers[next])
				next++
				running++
				hedge.Reset(HedgeDelay)
			}
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
}

// firstFetch is FetchFirst's transfers, racing to install the file.
type firstFetch struct {
	h            session.Host
	fp, dir, out string
	accept       func(path string, nLayer int) error
	failed       func(peer.ID, error)
	results      chan error // each transfer's end: nil for the one accepted
	mu           sync.Mutex // installs and accepts one file at a time
	won          bool
	wg           sync.WaitGroup
}

// start starts a transfer from p, which sends its end to f.results.
func (f *firstFetch) start(ctx context.Context, p peer.ID) {
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		tmp, nl, err := download(ctx, f.h, p, f.fp, f.dir)
		if err != nil {
			if f.failed != nil && ctx.Err() == nil {
				f.failed(p, err)
			}
			f.results <- err
			return
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		// Sent under mu: the winner's nil comes before the ends of the
		// transfers it cancelled.
		f.results <- f.install(ctx, p, tmp, nl)
	}()
}

// install moves the verified file tmp from p into place and hands it to
// f.accept, unless another transfer won first (tmp is removed). f.mu is
// held.
func (f *firstFetch) install(ctx context.Context, p peer.ID, tmp string, nl int) error {
	if f.won || ctx.Err() != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("vocab from %s: %w", p, context.Canceled)
	}
	if err := os.Rename(tmp, f.out); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	if f.accept != nil {
		if err := f.accept(f.out, nl); err != nil {
			return fmt.Errorf("vocab from %s: %w", p, err)
		}
	}
	f.won = true
	return nil
}
