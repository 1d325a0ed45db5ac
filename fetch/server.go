package fetch

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"golang.org/x/time/rate"

	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// Protocol names (scoped by the swarm: /meshp2p/<net>/<name>/<version>).
const (
	ProtoManifest = "manifest"
	ProtoTensor   = "tensor"
	ProtoVersion  = "1.0.0"
)

// Limits of the serving side.
const (
	// MaxTransfersPerPeer bounds the tensor streams one peer may have open
	// to a server at once (the fetcher uses the same number per source).
	MaxTransfersPerPeer = 2
	// MaxTransfers bounds a server's concurrent tensor streams (and the
	// fetcher's, over all its sources).
	MaxTransfers = 8
	// RequestTimeout bounds reading a request and writing a manifest.
	RequestTimeout = 30 * time.Second
	// IdleTimeout bounds each write (and, on the fetcher, each read) of
	// tensor data: a stream that makes no progress for this long is reset.
	IdleTimeout = 30 * time.Second
	// MinRate is the slowest a tensor transfer may run, in bytes per
	// second, after Grace: a fetcher gives up on a source slower than this
	// (and asks another; the bytes it has stay staged), and a server resets
	// a fetcher that reads slower (time spent in its own upload limits
	// does not count). Without it, a peer that sends (or reads) one byte
	// just inside IdleTimeout would hold a transfer slot for ever.
	MinRate = 16 << 10
	// Grace is the time a transfer has on top of its bytes at MinRate.
	Grace = RequestTimeout
	// headerLimit bounds request and response headers.
	headerLimit = 4 << 10
)

// Host is what the fetch protocols need from a libp2p host.
type Host interface {
	ProtocolID(name, version string) protocol.ID
	NewStream(ctx context.Context, p peer.ID, pids ...protocol.ID) (network.Stream, error)
	SetStreamHandler(pid protocol.ID, h network.StreamHandler)
	RemoveStreamHandler(pid protocol.ID)
}

// Server answers manifest and tensor requests for the models a node holds:
// the manifest when it has one, and the tensors of the shard it serves.
type Server struct {
	host    Host
	log     *slog.Logger
	limit   *rate.Limiter // over all transfers; nil: unlimited
	perPeer int64         // bytes/s per fetching peer; 0: unlimited

	mu      sync.Mutex
	models  map[string]*served
	active  map[peer.ID]int
	peerLim map[peer.ID]*rate.Limiter // while the peer has transfers
	total   int
	Served  func(n int64) // if set, counts tensor bytes sent (tests, metrics)
	chunkSz int
	// MinRate and Grace override the package's (0: those); set before
	// the first request.
	MinRate int64
	Grace   time.Duration
}

// transferBudget is how long a transfer of n bytes may take at minRate
// (bytes/s; 0: MinRate) after grace (0: Grace).
func transferBudget(n, minRate int64, grace time.Duration) time.Duration {
	if minRate <= 0 {
		minRate = MinRate
	}
	if grace <= 0 {
		grace = Grace
	}
	return grace + time.Duration(float64(n)/float64(minRate)*float64(time.Second))
}

type served struct {
	manifest []byte // nil: this node has none
	hdrHash  [32]byte
	shard    string
	index    map[string]span // parent tensor name → bytes in the shard file
}

type span struct{ off, size int64 }

// NewServer registers the two protocols on h. uploadLimit is bytes per
// second over all transfers (0: unlimited).
func NewServer(h Host, uploadLimit int64, log *slog.Logger) *Server {
	return NewServerLimits(h, uploadLimit, 0, log)
}

// NewServerLimits is NewServer with also a limit in bytes per second for
// each fetching peer (0: none).
func NewServerLimits(h Host, uploadLimit, perPeer int64, log *slog.Logger) *Server {
	if log == nil {
		log = slog.Default()
	}
	s := &Server{host: h, log: log, models: map[string]*served{}, active: map[peer.ID]int{}, peerLim: map[peer.ID]*rate.Limiter{},
		chunkSz: 64 << 10, perPeer: perPeer}
	if uploadLimit > 0 {
		s.limit = rate.NewLimiter(rate.Limit(uploadLimit), burstFor(uploadLimit))
		s.chunkSz = min(s.chunkSz, burstFor(uploadLimit))
	}
	if perPeer > 0 {
		s.chunkSz = min(s.chunkSz, burstFor(perPeer))
	}
	h.SetStreamHandler(h.ProtocolID(ProtoManifest, ProtoVersion), s.handleManifest)
	h.SetStreamHandler(h.ProtocolID(ProtoTensor, ProtoVersion), s.handleTensor)
	return s
}

// Close removes the protocol handlers.
func (s *Server) Close() {
	s.host.RemoveStreamHandler(s.host.ProtocolID(ProtoManifest, ProtoVersion))
	s.host.RemoveStreamHandler(s.host.ProtocolID(ProtoTensor, ProtoVersion))
}

// Add serves model fp: the tensors of the verified shard file at shardPath
// (may be "") and the manifest (may be nil; it must prove fp).
func (s *Server) Add(fp, shardPath string, manifest []byte) error {
	sv := &served{shard: shardPath, index: map[string]span{}}
	if manifest != nil {
		if _, err := gguf.CheckManifest(manifest, fp); err != nil {
			return err
		}
		sv.manifest = manifest
		m, _ := gguf.ParseManifest(manifest)
		sv.hdrHash = sha256.Sum256(m.Header)
	}
	if shardPath != "" {
		f, err := gguf.Open(shardPath)
		if err != nil {
			return err
		}
		names, si, err := gguf.ShardSourceNames(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("fetch: serve %s: %w", shardPath, err)
		}
		if si.ParentFingerprint != fp {
			return fmt.Errorf("fetch: serve %s: shard of model %.16s, not %.16s", shardPath, si.ParentFingerprint, fp)
		}
		for parent, name := range names {
			t, _ := f.Tensor(name)
			sv.index[parent] = span{f.DataOffset + int64(t.Offset), int64(t.Bytes)}
		}
	}
	s.mu.Lock()
	s.models[fp] = sv
	s.mu.Unlock()
	return nil
}

// Remove stops serving model fp (a model the node no longer serves):
// requests for it are answered as for any unknown model; transfers under
// way finish from the file they opened.
func (s *Server) Remove(fp string) {
	s.mu.Lock()
	delete(s.models, fp)
	s.mu.Unlock()
}

func burstFor(bps int64) int { return int(max(1, min(bps, 1<<20))) }

func errMsg(code meshp2pb.ErrorCode, format string, args ...any) *meshp2pb.Error {
	return &meshp2pb.Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

func (s *Server) handleManifest(st network.Stream) {
	defer st.Close()
	_ = st.SetDeadline(time.Now().Add(RequestTimeout))
	lim := frame.Limits{MaxHeader: headerLimit, MaxPayload: gguf.MaxManifestBytes}
	var req meshp2pb.ManifestRequest
	if err := frame.NewReader(st, lim).ReadMessage(&req); err != nil {
		_ = st.Reset()
		return
	}
	w := frame.NewWriter(st, lim)
	s.mu.Lock()
	var fp string
	var sv *served
	if req.GetModelFingerprint() != "" {
		fp, sv = req.GetModelFingerprint(), s.models[req.GetModelFingerprint()]
	} else if len(req.GetHeaderSha256()) == 32 {
		for f, m := range s.models {
			if m.manifest != nil && string(m.hdrHash[:]) == string(req.GetHeaderSha256()) {
				fp, sv = f, m
			}
		}
	}
	s.mu.Unlock()
	if sv == nil || sv.manifest == nil {
		_ = w.WriteMessage(&meshp2pb.ManifestResponse{Error: errMsg(meshp2pb.ErrorCode_ERROR_CODE_MODEL_MISMATCH, "no manifest for that model here")})
		return
	}
	_ = w.WriteBlob(&meshp2pb.ManifestResponse{Size: uint64(len(sv.manifest)), ModelFingerprint: fp}, sv.manifest)
}

// acquire takes a transfer slot for p and returns p's rate limiter (nil:
// none), or false when p or the server is at its limit.
func (s *Server) acquire(p peer.ID) (*rate.Limiter, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.active[p] >= MaxTransfersPerPeer || s.total >= MaxTransfers {
		return nil, false
	}
	s.active[p]++
	s.total++
	if s.perPeer > 0 && s.peerLim[p] == nil {
		s.peerLim[p] = rate.NewLimiter(rate.Limit(s.perPeer), burstFor(s.perPeer))
	}
	return s.peerLim[p], true
}

func (s *Server) release(p peer.ID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.total--
	if s.active[p]--; s.active[p] <= 0 {
		delete(s.active, p)
		delete(s.peerLim, p)
	}
}

func (s *Server) handleTensor(st network.Stream) {
	defer st.Close()
	p := st.Conn().RemotePeer()
	_ = st.SetDeadline(time.Now().Add(RequestTimeout))
	lim := frame.Limits{MaxHeader: headerLimit}
	var req meshp2pb.TensorRequest
	if err := frame.NewReader(st, lim).ReadMessage(&req); err != nil {
		_ = st.Reset()
		return
	}
	w := frame.NewWriter(st, lim)
	refuse := func(e *meshp2pb.Error) { _ = w.WriteMessage(&meshp2pb.TensorResponse{Error: e}) }
	plim, ok := s.acquire(p)
	if !ok {
		refuse(errMsg(meshp2pb.ErrorCode_ERROR_CODE_NO_CAPACITY, "busy: at most %d transfers per peer, %d in all", MaxTransfersPerPeer, MaxTransfers))
		return
	}
	defer s.release(p)
	shard, sp, refusal := s.locate(&req)
	if refusal != nil {
		refuse(refusal)
		return
	}
	f, err := os.Open(shard)
	if err != nil {
		refuse(errMsg(meshp2pb.ErrorCode_ERROR_CODE_INTERNAL, "open shard: %v", err))
		return
	}
	defer f.Close()
	if err := w.WriteMessage(&meshp2pb.TensorResponse{Length: uint64(sp.size)}); err != nil {
		return
	}
	if !s.send(st, io.NewSectionReader(f, sp.off, sp.size), plim, req.GetName()) {
		_ = st.Reset()
	}
}

// locate finds the bytes req asks for: the shard file and their span in
// it, or the refusal to answer with.
func (s *Server) locate(req *meshp2pb.TensorRequest) (string, span, *meshp2pb.Error) {
	s.mu.Lock()
	sv := s.models[req.GetModelFingerprint()]
	s.mu.Unlock()
	if sv == nil {
		return "", span{}, errMsg(meshp2pb.ErrorCode_ERROR_CODE_MODEL_MISMATCH, "model not served here")
	}
	sp, ok := sv.index[req.GetName()]
	if !ok {
		return "", span{}, errMsg(meshp2pb.ErrorCode_ERROR_CODE_RANGE_MISMATCH, "tensor %q not held here", req.GetName())
	}
	off, n := req.GetOffset(), req.GetLength()
	if off > uint64(sp.size) || n > uint64(sp.size)-off {
		return "", span{}, errMsg(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "bytes %d+%d outside tensor %q of %d bytes", off, n, req.GetName(), sp.size)
	}
	return sv.shard, span{sp.off + int64(off), int64(n)}, nil
}

// send copies src (the requested bytes of tensor name) to st within the
// rate limits (plim: the peer's, nil for none) and the reader's time
// budget, and reports whether all of it was sent.
func (s *Server) send(st network.Stream, src *io.SectionReader, plim *rate.Limiter, name string) bool {
	buf := make([]byte, s.chunkSz)
	// blocked is the time spent writing, that is waiting for the fetcher
	// to read; past its budget the fetcher is too slow and is reset.
	var blocked time.Duration
	budget := transferBudget(src.Size(), s.MinRate, s.Grace)
	for {
		k, rerr := src.Read(buf)
		if k > 0 {
			for _, l := range []*rate.Limiter{plim, s.limit} {
				if l != nil {
					if err := l.WaitN(context.Background(), k); err != nil {
						return false
					}
				}
			}
			t0 := time.Now()
			_ = st.SetWriteDeadline(t0.Add(min(IdleTimeout, budget-blocked)))
			_, err := st.Write(buf[:k])
			blocked += time.Since(t0)
			if err != nil {
				if blocked >= budget {
					s.log.Info("fetching peer reads too slowly; reset", "peer", st.Conn().RemotePeer(), "tensor", name, "bytes", src.Size(),
						"budget", budget.Round(time.Millisecond))
				}
				return false
			}
			if s.Served != nil {
				s.Served(int64(k))
			}
		}
		if rerr == io.EOF {
			return true
		}
		if rerr != nil {
			return false
		}
	}
}
