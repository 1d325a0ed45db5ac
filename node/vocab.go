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
)

// ProtoVocab serves vocabulary-only GGUF files to origins without weights.
const ProtoVocab = "vocab"

// MaxVocabBytes bounds a vocabulary file on the wire (a 152k-token Qwen
// vocabulary with merges is about 10 MiB).
const MaxVocabBytes = 64 << 20

type vocabService struct {
	host Host
	lim  frame.Limits
	log  *slog.Logger
	mu   sync.Mutex
	byFP map[string]string
}

func newVocabService(h Host, lim frame.Limits, log *slog.Logger) *vocabService {
	lim.MaxPayload = MaxVocabBytes
	v := &vocabService{host: h, lim: lim, log: log, byFP: map[string]string{}}
	h.SetStreamHandler(h.ProtocolID(ProtoVocab, ProtoVersion), v.handle)
	return v
}

func (v *vocabService) add(fp, path string) {
	v.mu.Lock()
	v.byFP[fp] = path
	v.mu.Unlock()
}

func (v *vocabService) close() {
	v.host.RemoveStreamHandler(v.host.ProtocolID(ProtoVocab, ProtoVersion))
}

func (v *vocabService) handle(s network.Stream) {
	defer s.Close()
	_ = s.SetDeadline(time.Now().Add(60 * time.Second))
	var req meshp2pb.VocabRequest
	if err := frame.NewReader(s, v.lim).ReadMessage(&req); err != nil {
		_ = s.Reset()
		return
	}
	w := frame.NewWriter(s, v.lim)
	v.mu.Lock()
	path := v.byFP[req.GetModelFingerprint()]
	v.mu.Unlock()
	var data []byte
	var err error
	if path != "" {
		data, err = os.ReadFile(path)
	}
	if path == "" || err != nil || len(data) > MaxVocabBytes {
		_ = w.WriteMessage(&meshp2pb.VocabResponse{Error: &meshp2pb.Error{
			Code: meshp2pb.ErrorCode_ERROR_CODE_MODEL_MISMATCH, Message: "no vocabulary for that model here"}})
		return
	}
	_ = w.WriteBlob(&meshp2pb.VocabResponse{Size: uint64(len(data))}, data)
}

// FetchVocab downloads the vocabulary of model fp from peer p into dir and
// verifies it against the fingerprint. It returns the file's path.
func FetchVocab(ctx context.Context, h Host, p peer.ID, fp, dir string) (string, error) {
	lim := frame.Limits{MaxPayload: MaxVocabBytes}
	s, err := h.NewStream(ctx, p, h.ProtocolID(ProtoVocab, ProtoVersion))
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
