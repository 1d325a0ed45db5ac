package node

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

// ProtoVocab serves vocabulary-only GGUF files to origins without weights.
const (
	ProtoVocab        = "vocab"
	ProtoVocabVersion = "1.0.0"
)

// MaxVocabBytes bounds a vocabulary file on the wire (a 152k-token Qwen
// vocabulary with merges is about 10 MiB).
const MaxVocabBytes = 64 << 20

type vocabService struct {
	host   session.Host
	lim    frame.Limits
	log    *slog.Logger
	sem    chan struct{} // bounds concurrent transfers
	mu     sync.Mutex
	byFP   map[string][]byte // the files, read once
	active map[peer.ID]bool  // peers with a transfer in progress (one each)
}

// maxVocabTransfers bounds concurrent vocabulary downloads from one node.
const maxVocabTransfers = 4

func newVocabService(h session.Host, lim frame.Limits, log *slog.Logger) *vocabService {
	lim.MaxPayload = MaxVocabBytes
	v := &vocabService{host: h, lim: lim, log: log, sem: make(chan struct{}, maxVocabTransfers), byFP: map[string][]byte{},
		active: map[peer.ID]bool{}}
	h.SetStreamHandler(h.ProtocolID(ProtoVocab, ProtoVocabVersion), v.handle)
	return v
}

func (v *vocabService) add(fp, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if len(data) > MaxVocabBytes {
		return fmt.Errorf("vocabulary %s is %d bytes, over the %d limit", path, len(data), MaxVocabBytes)
	}
	v.mu.Lock()
	v.byFP[fp] = data
	v.mu.Unlock()
	return nil
}

func (v *vocabService) close() {
	v.host.RemoveStreamHandler(v.host.ProtocolID(ProtoVocab, ProtoVocabVersion))
}

func (v *vocabService) handle(s network.Stream) {
	defer s.Close()
	// One peer may hold one transfer slot at a time, so a single peer
	// cannot occupy all of them for VocabTransferTimeout.
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
	_ = s.SetDeadline(time.Now().Add(VocabTransferTimeout))
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

// FetchVocab downloads the vocabulary of model fp from peer p into dir and
// verifies it against the fingerprint. It returns the file's path.
func FetchVocab(ctx context.Context, h session.Host, p peer.ID, fp, dir string) (string, error) {
	if !route.ValidFingerprint(fp) {
		return "", fmt.Errorf("vocab: %q is not a model fingerprint", fp)
	}
	lim := frame.Limits{MaxPayload: MaxVocabBytes}
	s, err := h.NewStream(ctx, p, h.ProtocolID(ProtoVocab, ProtoVocabVersion))
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
	out := filepath.Join(dir, fp[:16]+".vocab.gguf")
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
