// Package vocab is the vocabulary protocol: a node serves its model's
// vocabulary-only GGUF file (Service) so that origins without weights can
// tokenize, and an origin fetches one from a peer and verifies it against
// the model fingerprint (Fetch). No cgo: the file is checked with
// engine/gguf, loaded by the caller.
package vocab

import (
	"context"
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
	// a relayed home connection), on both ends.
	TransferTimeout = 60 * time.Second
	// MaxTransfers bounds concurrent vocabulary downloads from one node.
	MaxTransfers = 4
)

// Service serves the vocabularies of the models a node holds; one
// transfer per peer at a time, MaxTransfers in all.
type Service struct {
	host   session.Host
	lim    frame.Limits
	log    *slog.Logger
	sem    chan struct{} // bounds concurrent transfers
	mu     sync.Mutex
	byFP   map[string][]byte // the files, read once
	active map[peer.ID]bool  // peers with a transfer in progress (one each)
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

// Close removes the protocol handler.
func (v *Service) Close() {
	v.host.RemoveStreamHandler(v.host.ProtocolID(Proto, ProtoVersion))
}

func (v *Service) handle(s network.Stream) {
	defer s.Close()
	// One peer may hold one transfer slot at a time, so a single peer
	// cannot occupy all of them for TransferTimeout.
	p := s.Conn().RemotePeer()
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
	_ = s.SetDeadline(time.Now().Add(TransferTimeout))
	var req meshp2pb.VocabRequest
	if err := frame.NewReader(s, v.lim).ReadMessage(&req); err != nil {
		_ = s.Reset()
		return
	}
	w := frame.NewWriter(s, v.lim)
	v.mu.Lock()
	data := v.byFP[req.GetModelFingerprint()]
	v.mu.Unlock()
	if data == nil {
		_ = w.WriteMessage(&meshp2pb.VocabResponse{Error: &meshp2pb.Error{
			Code: meshp2pb.ErrorCode_ERROR_CODE_MODEL_MISMATCH, Message: "no vocabulary for that model here"}})
		return
	}
	_ = w.WriteBlob(&meshp2pb.VocabResponse{Size: uint64(len(data))}, data)
}

// FileName is the name Fetch gives model fp's vocabulary in its dir.
func FileName(fp string) string { return fp[:16] + ".vocab.gguf" }

// Fetch downloads the vocabulary of model fp from peer p into dir and
// verifies it against the fingerprint (gguf.CheckVocab). It returns the
// file's path. The transfer ends with ctx; callers bound it with
// TransferTimeout.
func Fetch(ctx context.Context, h session.Host, p peer.ID, fp, dir string) (string, error) {
	if !route.ValidFingerprint(fp) {
		return "", fmt.Errorf("vocab: %q is not a model fingerprint", fp)
	}
	lim := frame.Limits{MaxPayload: MaxBytes}
	s, err := h.NewStream(ctx, p, h.ProtocolID(Proto, ProtoVersion))
	if err != nil {
		return "", fmt.Errorf("vocab from %s: %w", p, err)
	}
	defer s.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = s.SetDeadline(dl)
	}
	if err := frame.NewWriter(s, lim).WriteMessage(&meshp2pb.VocabRequest{ModelFingerprint: fp}); err != nil {
		return "", fmt.Errorf("vocab from %s: %w", p, err)
	}
	var resp meshp2pb.VocabResponse
	data, err := frame.NewReader(s, lim).ReadBlob(&resp)
	if err != nil {
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
	out := filepath.Join(dir, FileName(fp))
	tmp := out + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return "", err
	}
	if err := gguf.CheckVocab(ctx, tmp, fp); err != nil {
		_ = os.Remove(tmp)
		return "", fmt.Errorf("vocab from %s does not belong to model %.16s: %w", p, fp, err)
	}
	return out, os.Rename(tmp, out)
}
