package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/multiformats/go-multiaddr"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// Protocol names (scoped by the swarm: /meshp2p/<network>/<name>/<version>).
const (
	ProtoSession = "session" // upstream → downstream seam of one route session
	ProtoRing    = "ring"    // tail → head: sampled tokens close the ring
	ProtoVersion = "1.0.0"
)

// Host is what the data plane needs from the p2p layer.
type Host interface {
	ID() peer.ID
	ProtocolID(name, version string) protocol.ID
	NewStream(ctx context.Context, p peer.ID, pids ...protocol.ID) (network.Stream, error)
	Peerstore() peerstore.Peerstore
	SetStreamHandler(pid protocol.ID, h network.StreamHandler)
	RemoveStreamHandler(pid protocol.ID)
	Protect(p peer.ID, tag string)
	Unprotect(p peer.ID, tag string) bool
	// SubscribeConn reports connectivity changes (a hole punch turning a
	// relayed path direct) until ctx ends.
	SubscribeConn(ctx context.Context) <-chan p2p.ConnEvent
}

// HopConfig configures a HopService.
type HopConfig struct {
	Fingerprint string
	// Idle frees a session after this long without frames (default 60s).
	Idle time.Duration
	// OpenTimeout bounds admission along the rest of the route (default 15s).
	OpenTimeout time.Duration
	Limits      frame.Limits
	Logger      *slog.Logger
	// Admit, if set, runs after the built-in checks (model, range, route
	// shape, sender) and may refuse the session with an error to send back
	// (e.g. a missing or invalid route ticket). idx is this hop's route
	// index; from is the peer that opened the stream (the origin for the
	// head, else the previous hop).
	Admit func(open *meshp2pb.SessionOpen, idx int, from peer.ID) *meshp2pb.Error
}

// HopService serves one engine shard to route sessions.
type HopService struct {
	host  Host
	shard *engine.Shard
	model *engine.Model
	info  engine.ModelInfo
	cfg   HopConfig
	log   *slog.Logger

	mu     sync.Mutex
	closed bool
	active map[engine.SessionKey]*hopSession
	wg     sync.WaitGroup
	// moves counts streams moved from a relayed to a direct connection.
	moves atomic.Int64
	// decodeUs holds the last decodeWindow single-row compute times (µs);
	// the hop's speed is their minimum (what the shard can do; load is
	// advertised separately as capacity), advertised per layer for the
	// tracker's cost model.
	decodeUs [decodeWindow]float64
	nDecode  int
}

// decodeWindow is how many recent decode steps the measured speed covers.
const decodeWindow = 32

// ObserveDecode records one single-row compute time.
func (h *HopService) ObserveDecode(d time.Duration) {
	h.mu.Lock()
	h.decodeUs[h.nDecode%decodeWindow] = float64(d.Microseconds())
	h.nDecode++
	h.mu.Unlock()
}

// DecodeSteps counts the single-row steps this hop has computed.
func (h *HopService) DecodeSteps() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.nDecode
}

// DecodeMsPerLayer is the measured single-row compute time per layer (0
// before any live step).
func (h *HopService) DecodeMsPerLayer() float32 {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.nDecode == 0 {
		return 0
	}
	best := math.Inf(1)
	for _, us := range h.decodeUs[:min(h.nDecode, decodeWindow)] {
		best = math.Min(best, us)
	}
	return float32(best / 1000 / float64(max(1, h.info.End-h.info.Start)))
}

// NewHopService registers the session and ring protocols on host.
func NewHopService(host Host, model *engine.Model, shard *engine.Shard, cfg HopConfig) *HopService {
	if cfg.Idle == 0 {
		cfg.Idle = 60 * time.Second
	}
	if cfg.OpenTimeout == 0 {
		cfg.OpenTimeout = 15 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	h := &HopService{host: host, shard: shard, model: model, info: shard.Info(), cfg: cfg,
		log: cfg.Logger.With("range", fmt.Sprintf("%d-%d", shard.Info().Start, shard.Info().End)), active: map[engine.SessionKey]*hopSession{}}
	host.SetStreamHandler(host.ProtocolID(ProtoSession, ProtoVersion), h.handleSession)
	host.SetStreamHandler(host.ProtocolID(ProtoRing, ProtoVersion), h.handleRing)
	return h
}

// Moves reports how many seams or rings this hop moved from a relayed to a
// direct connection after a hole punch.
func (h *HopService) Moves() int64 { return h.moves.Load() }

// Sessions reports how many sessions are open on this hop.
func (h *HopService) Sessions() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.active)
}

// Close stops accepting sessions, ends the open ones and waits for them.
func (h *HopService) Close() {
	h.host.RemoveStreamHandler(h.host.ProtocolID(ProtoSession, ProtoVersion))
	h.host.RemoveStreamHandler(h.host.ProtocolID(ProtoRing, ProtoVersion))
	h.mu.Lock()
	h.closed = true
	var all []*hopSession
	for _, s := range h.active {
		all = append(all, s)
	}
	h.mu.Unlock()
	for _, s := range all {
		s.fail(codeErr(meshp2pb.ErrorCode_ERROR_CODE_SHUTTING_DOWN, "hop shutting down", h.host.ID()))
	}
	h.wg.Wait()
}

// hopSession is one (session, epoch) on this hop.
type hopSession struct {
	h     *HopService
	key   engine.SessionKey
	open  *meshp2pb.SessionOpen
	idx   int
	head  bool
	tail  bool
	eng   *engine.Session
	wire  meshp2pb.DType
	route []peer.ID

	upRef sync.Mutex // guards the up field itself (it changes when the seam moves)
	up    network.Stream
	upW   *frame.Writer
	upMu  sync.Mutex // guards upW: the head writes tokens and errors from two goroutines
	// resumeUp / resumeRing receive the replacement stream when the
	// upstream hop (or the tail) moves the seam to a direct connection.
	resumeUp   chan network.Stream
	resumeRing chan network.Stream

	downRef sync.Mutex // guards the down and ringS fields (they change when a stream moves); never held during I/O
	down    network.Stream
	downMu  sync.Mutex // guards downW: prefill and ring tokens may race on a bad origin
	downW   *frame.Writer
	ring    chan network.Stream // head: the tail's ring stream arrives here
	ringS   network.Stream
	// self carries sampled tokens back to the decode loop when this hop is
	// head and tail at once (a one-hop route): no recursion, and the
	// upstream reader stays free to see SessionClose.
	self chan *meshp2pb.TokenFrame

	maxTokens int
	produced  int
	activity  chan struct{}

	once     sync.Once
	done     chan struct{}
	released chan struct{} // closed once everything is freed
	err      error
}

type hopError struct{ e *meshp2pb.Error }

func (e *hopError) Error() string {
	return fmt.Sprintf("%s: %s", e.e.GetCode(), e.e.GetMessage())
}

func codeErr(code meshp2pb.ErrorCode, msg string, failed peer.ID) *hopError {
	e := &meshp2pb.Error{Code: code, Message: msg, Retryable: frame.Retryable(code)}
	if failed != "" {
		e.FailedPeerId = []byte(failed)
	}
	return &hopError{e}
}

func (h *HopService) reject(w *frame.Writer, open *meshp2pb.SessionOpen, he *hopError) {
	he.e.PeerId = []byte(h.host.ID())
	he.e.SessionId, he.e.Epoch = open.GetSessionId(), open.GetEpoch()
	_ = w.WriteStream(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Accept{Accept: &meshp2pb.SessionAccept{
		SessionId: open.GetSessionId(), Epoch: open.GetEpoch(), Ok: false, Error: he.e}}})
}

// admit checks that the open names this hop with exactly this model and range.
func (h *HopService) admit(open *meshp2pb.SessionOpen, from peer.ID) (int, *hopError) {
	me := h.host.ID()
	rt := open.GetRoute()
	idx := int(open.GetHopIndex())
	switch {
	case len(open.GetSessionId()) != frame.SessionIDLen:
		return 0, codeErr(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "session id must be 16 bytes", "")
	case rt == nil || idx >= len(rt.GetHops()):
		return 0, codeErr(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "hop index outside the route", "")
	case open.GetModelFingerprint() != h.cfg.Fingerprint || rt.GetModelFingerprint() != h.cfg.Fingerprint:
		return 0, codeErr(meshp2pb.ErrorCode_ERROR_CODE_MODEL_MISMATCH, fmt.Sprintf("this hop serves model %.16s, not %.16s", h.cfg.Fingerprint, open.GetModelFingerprint()), me)
	case int(rt.GetNLayer()) != h.info.ParentNLayer:
		return 0, codeErr(meshp2pb.ErrorCode_ERROR_CODE_MODEL_MISMATCH, fmt.Sprintf("model has %d layers, route says %d", h.info.ParentNLayer, rt.GetNLayer()), me)
	case open.GetEpoch() != rt.GetEpoch():
		return 0, codeErr(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "session epoch differs from route epoch", "")
	case open.GetWireDtype() != meshp2pb.DType_DTYPE_F32 && open.GetWireDtype() != meshp2pb.DType_DTYPE_F16:
		return 0, codeErr(meshp2pb.ErrorCode_ERROR_CODE_UNSUPPORTED_DTYPE, "wire dtype must be f32 or f16", me)
	}
	hop := rt.GetHops()[idx]
	if peer.ID(hop.GetPeerId()) != me {
		return 0, codeErr(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "route hop names another peer", "")
	}
	// Only the previous hop of the route may extend a session to us: a
	// stranger cannot splice itself into someone's route.
	if idx > 0 && peer.ID(rt.GetHops()[idx-1].GetPeerId()) != from {
		return 0, codeErr(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "session open must come from the previous hop of the route", "")
	}
	if int(hop.GetStart()) != h.info.Start || int(hop.GetEnd()) != h.info.End {
		return 0, codeErr(meshp2pb.ErrorCode_ERROR_CODE_RANGE_MISMATCH, fmt.Sprintf("this hop serves layers %d-%d, route asks %d-%d", h.info.Start, h.info.End, hop.GetStart(), hop.GetEnd()), me)
	}
	// The route must be a contiguous cover, or some hop would run the
	// wrong layers on the hidden states it receives.
	at := uint32(0)
	for _, x := range rt.GetHops() {
		if x.GetStart() != at || x.GetEnd() <= x.GetStart() {
			return 0, codeErr(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "route hops do not join end to start", "")
		}
		at = x.GetEnd()
	}
	if at != rt.GetNLayer() {
		return 0, codeErr(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "route does not cover all layers", "")
	}
	if h.cfg.Admit != nil {
		if e := h.cfg.Admit(open, idx, from); e != nil {
			if len(e.GetFailedPeerId()) == 0 && frame.Retryable(e.GetCode()) {
				e.FailedPeerId = []byte(me)
			}
			return 0, &hopError{e}
		}
	}
	return idx, nil
}

func (h *HopService) handleSession(s network.Stream) {
	lim := h.cfg.Limits
	r, w := frame.NewReader(s, lim), frame.NewWriter(s, lim)
	_ = s.SetReadDeadline(time.Now().Add(h.cfg.OpenTimeout))
	msg, _, err := r.ReadStream()
	if err != nil {
		h.log.Debug("session stream: bad open", "peer", s.Conn().RemotePeer(), "err", err)
		// Say why, then close (a reset could drop the error in flight).
		_ = w.WriteStream(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Error{Error: frame.ToProto(err)}})
		_ = s.Close()
		return
	}
	open := msg.GetOpen()
	if open == nil {
		h.reject(w, &meshp2pb.SessionOpen{}, codeErr(meshp2pb.ErrorCode_ERROR_CODE_UNEXPECTED_MESSAGE, "first message must be SessionOpen", ""))
		_ = s.Close()
		return
	}
	if open.GetResume() {
		h.resume(s, w, open)
		return
	}
	idx, he := h.admit(open, s.Conn().RemotePeer())
	if he != nil {
		h.reject(w, open, he)
		_ = s.Close()
		return
	}
	var key engine.SessionKey
	copy(key.ID[:], open.GetSessionId())
	key.Epoch = open.GetEpoch()
	n := len(open.GetRoute().GetHops())
	hs := &hopSession{h: h, key: key, open: open, idx: idx, head: idx == 0, tail: idx == n-1, wire: open.GetWireDtype(),
		up: s, upW: w, ring: make(chan network.Stream, 1), self: make(chan *meshp2pb.TokenFrame, 1), activity: make(chan struct{}, 1), done: make(chan struct{}), released: make(chan struct{}),
		resumeUp: make(chan network.Stream, 1), resumeRing: make(chan network.Stream, 1),
		maxTokens: int(open.GetMaxTokens())}
	for _, x := range open.GetRoute().GetHops() {
		hs.route = append(hs.route, peer.ID(x.GetPeerId()))
	}
	var smp engine.Sampling
	if sp := open.GetSampling(); sp != nil {
		smp = engine.Sampling{Temperature: sp.GetTemperature(), TopK: sp.GetTopK(), TopP: sp.GetTopP(), MinP: sp.GetMinP(),
			RepeatPenalty: sp.GetRepeatPenalty(), RepeatLastN: max(sp.GetRepeatLastN(), 0), Seed: uint64(sp.GetSeed())}
	}
	smp.Generated = open.GetGenerated()
	h.supersede(key)
	eng, err := h.shard.OpenSession(key, engine.SessionParams{KVTokens: int(open.GetNCtxNeeded()), Sampling: smp})
	if err != nil {
		code := meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST
		if errors.Is(err, engine.ErrNoCapacity) {
			code = meshp2pb.ErrorCode_ERROR_CODE_NO_CAPACITY
		}
		h.reject(w, open, codeErr(code, err.Error(), h.host.ID()))
		_ = s.Close()
		return
	}
	hs.eng = eng
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		eng.Close()
		h.reject(w, open, codeErr(meshp2pb.ErrorCode_ERROR_CODE_SHUTTING_DOWN, "hop shutting down", h.host.ID()))
		_ = s.Close()
		return
	}
	if old := h.active[key]; old != nil {
		h.mu.Unlock()
		eng.Close()
		h.reject(w, open, codeErr(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "session already open", ""))
		_ = s.Close()
		return
	}
	h.active[key] = hs
	h.wg.Add(1)
	h.mu.Unlock()
	defer h.wg.Done()
	defer hs.release()

	// Deeper hops give up first, so a hang further down is reported by
	// the hop next to it, not blamed on an innocent hop by an impatient
	// head.
	budget := h.cfg.OpenTimeout - time.Duration(idx)*h.cfg.OpenTimeout/time.Duration(2*n)
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	if he := hs.connect(ctx); he != nil {
		cancel()
		hs.upMu.Lock() // a concurrent HopService.Close may be reporting on w too
		h.reject(w, open, he)
		hs.upMu.Unlock()
		_ = s.Close()
		return
	}
	cancel()
	_ = s.SetReadDeadline(time.Time{})
	hs.upMu.Lock()
	err = w.WriteStream(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Accept{Accept: &meshp2pb.SessionAccept{SessionId: open.GetSessionId(), Epoch: open.GetEpoch(), Ok: true}}})
	hs.upMu.Unlock()
	if err != nil {
		return
	}
	h.log.Debug("session open", "session", key, "hop", idx, "of", n)
	hs.run(r)
}

// connect opens the stream to the next hop (and, on the tail, the ring to
// the head) and waits for the rest of the route to admit the session.
func (hs *hopSession) connect(ctx context.Context) *hopError {
	h := hs.h
	hops := hs.open.GetRoute().GetHops()
	if !hs.tail {
		next := hops[hs.idx+1]
		np := peer.ID(next.GetPeerId())
		addAddrs(h.host, np, next.GetAddrs())
		ds, err := h.host.NewStream(ctx, np, h.host.ProtocolID(ProtoSession, ProtoVersion))
		if err != nil {
			return codeErr(meshp2pb.ErrorCode_ERROR_CODE_NEXT_HOP_UNREACHABLE, fmt.Sprintf("open stream to next hop %s: %v", np, err), np)
		}
		h.host.Protect(np, "route")
		fwd := protoClone(hs.open)
		fwd.HopIndex = uint32(hs.idx + 1)
		w, r := frame.NewWriter(ds, h.cfg.Limits), frame.NewReader(ds, h.cfg.Limits)
		if err := w.WriteStream(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Open{Open: fwd}}); err != nil {
			_ = ds.Reset()
			return codeErr(meshp2pb.ErrorCode_ERROR_CODE_NEXT_HOP_UNREACHABLE, fmt.Sprintf("send open to %s: %v", np, err), np)
		}
		if dl, ok := ctx.Deadline(); ok {
			_ = ds.SetReadDeadline(dl)
		}
		msg, _, err := r.ReadStream()
		_ = ds.SetReadDeadline(time.Time{})
		if err != nil {
			_ = ds.Reset()
			return codeErr(meshp2pb.ErrorCode_ERROR_CODE_NEXT_HOP_UNREACHABLE, fmt.Sprintf("admission at %s: %v", np, err), np)
		}
		acc := msg.GetAccept()
		if acc == nil || !acc.GetOk() {
			_ = ds.Close()
			if acc != nil && acc.GetError() != nil {
				return hs.fromDownstream(acc.GetError(), np)
			}
			return codeErr(meshp2pb.ErrorCode_ERROR_CODE_UNEXPECTED_MESSAGE, "next hop did not accept", np)
		}
		hs.downMu.Lock()
		hs.downRef.Lock()
		hs.down, hs.downW = ds, w
		hs.downRef.Unlock()
		hs.downMu.Unlock()
		h.log.Info("seam to next hop open", "session", hs.key, "next", np, "path", pathOf(ds))
		go hs.watchDownstream(ds, r)
		if pathOf(ds) == "relayed" {
			go hs.migrateWhenDirect(np, false)
		}
	}
	if hs.tail && !hs.head {
		head := peer.ID(hops[0].GetPeerId())
		addAddrs(h.host, head, hops[0].GetAddrs())
		rs, err := h.host.NewStream(ctx, head, h.host.ProtocolID(ProtoRing, ProtoVersion))
		if err != nil {
			return codeErr(meshp2pb.ErrorCode_ERROR_CODE_NEXT_HOP_UNREACHABLE, fmt.Sprintf("open ring to head %s: %v", head, err), head)
		}
		hello := protoClone(hs.open)
		hello.HopIndex = uint32(hs.idx)
		if err := frame.NewWriter(rs, h.cfg.Limits).WriteStream(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Open{Open: hello}}); err != nil {
			_ = rs.Reset()
			return codeErr(meshp2pb.ErrorCode_ERROR_CODE_NEXT_HOP_UNREACHABLE, fmt.Sprintf("ring hello to head: %v", err), head)
		}
		hs.downMu.Lock()
		hs.downRef.Lock()
		hs.ringS = rs
		hs.downRef.Unlock()
		hs.downW = frame.NewWriter(rs, h.cfg.Limits)
		hs.downMu.Unlock()
		h.log.Info("ring to head open", "session", hs.key, "head", head, "path", pathOf(rs))
		if pathOf(rs) == "relayed" {
			go hs.migrateWhenDirect(head, true)
		}
	}
	return nil
}

// handleRing attaches the tail's ring stream to the head's session.
func (h *HopService) handleRing(s network.Stream) {
	_ = s.SetReadDeadline(time.Now().Add(h.cfg.OpenTimeout))
	msg, _, err := frame.NewReader(s, h.cfg.Limits).ReadStream()
	if err != nil || msg.GetOpen() == nil {
		_ = s.Reset()
		return
	}
	_ = s.SetReadDeadline(time.Time{})
	open := msg.GetOpen()
	var key engine.SessionKey
	copy(key.ID[:], open.GetSessionId())
	key.Epoch = open.GetEpoch()
	h.mu.Lock()
	hs := h.active[key]
	h.mu.Unlock()
	// Only the tail of the route this head admitted may close the ring.
	if hs == nil || !hs.head || hs.tail || int(open.GetHopIndex()) != len(hs.route)-1 || s.Conn().RemotePeer() != hs.route[len(hs.route)-1] {
		_ = s.Reset()
		return
	}
	if open.GetResume() {
		select {
		case hs.resumeRing <- s:
		default:
			_ = s.Reset()
		}
		return
	}
	select {
	case <-hs.done:
		_ = s.Reset() // released meanwhile
	case hs.ring <- s:
	default:
		_ = s.Reset() // a second ring for one session
	}
}

func addAddrs(h Host, p peer.ID, addrs []string) {
	for _, a := range addrs {
		if m, err := multiaddr.NewMultiaddr(a); err == nil {
			h.Peerstore().AddAddr(p, m, 10*time.Minute)
		}
	}
}

// fail ends the session once, telling upstream why.
func (hs *hopSession) fail(he *hopError) {
	hs.once.Do(func() {
		if he != nil {
			hs.err = he
			if len(he.e.GetPeerId()) == 0 {
				he.e.PeerId = []byte(hs.h.host.ID())
			}
			he.e.SessionId, he.e.Epoch = hs.open.GetSessionId(), hs.open.GetEpoch()
			msg := &meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Error{Error: he.e}}
			// A writer blocked on a peer that stopped reading holds the
			// lock; the deadline frees it (and bounds our own write).
			_ = hs.upStream().SetWriteDeadline(time.Now().Add(failWriteTimeout))
			hs.upMu.Lock()
			if hs.upW != nil {
				_ = hs.upW.WriteStream(msg)
			}
			hs.upMu.Unlock()
			// The tail also tells the head over the ring, so the head blames
			// the right peer (its ring closing alone would point at us).
			hs.downMu.Lock()
			if hs.tail && !hs.head && hs.ringS != nil {
				_ = hs.ringS.SetWriteDeadline(time.Now().Add(failWriteTimeout))
				_ = hs.downW.WriteStream(msg)
			}
			hs.downMu.Unlock()
		}
		close(hs.done)
	})
}

// release frees everything the session holds on this hop.
func (hs *hopSession) release() {
	defer close(hs.released)
	hs.fail(nil)
	h := hs.h
	h.mu.Lock()
	delete(h.active, hs.key)
	h.mu.Unlock()
	hs.downRef.Lock()
	down, ring := hs.down, hs.ringS
	hs.downRef.Unlock()
	if down != nil {
		_ = down.Close()
		h.host.Unprotect(down.Conn().RemotePeer(), "route")
	}
	if ring != nil {
		_ = ring.Close()
	}
	select {
	case rs := <-hs.ring:
		_ = rs.Reset()
	default:
	}
	_ = hs.upStream().Close()
	hs.eng.Close()
	h.log.Debug("session released", "session", hs.key, "err", hs.err)
}

// watchDownstream reads the reverse direction of the downstream seam: only
// errors travel there. Any error, or the stream dying, fails the session
// naming the peer to blame.
func (hs *hopSession) watchDownstream(s network.Stream, r *frame.Reader) {
	next := hs.route[hs.idx+1]
	msg, _, err := r.ReadStream()
	select {
	case <-hs.done:
		return // we are closing it ourselves
	default:
	}
	hs.downRef.Lock()
	superseded := hs.down != s
	hs.downRef.Unlock()
	if superseded && err != nil {
		return // the seam moved to another stream; this one just ended
	}
	switch {
	case err == nil && msg.GetError() != nil:
		hs.fail(hs.fromDownstream(msg.GetError(), next))
	case err == nil:
		hs.fail(codeErr(meshp2pb.ErrorCode_ERROR_CODE_UNEXPECTED_MESSAGE, "unexpected message from next hop", next))
	default:
		hs.fail(codeErr(meshp2pb.ErrorCode_ERROR_CODE_NEXT_HOP_UNREACHABLE, fmt.Sprintf("lost next hop %s: %v", next, err), next))
	}
}

// run processes the session until it ends.
func (hs *hopSession) run(r *frame.Reader) {
	if hs.head && !hs.tail {
		select {
		case rs := <-hs.ring:
			hs.downRef.Lock()
			hs.ringS = rs
			hs.downRef.Unlock()
			go hs.readRing(rs)
		case <-hs.done:
			return
		case <-time.After(hs.h.cfg.OpenTimeout):
			hs.fail(codeErr(meshp2pb.ErrorCode_ERROR_CODE_NEXT_HOP_UNREACHABLE, "tail never opened the ring", hs.route[len(hs.route)-1]))
			return
		}
	}
	if hs.head && hs.tail {
		go hs.selfRing()
	}
	upstream := make(chan error, 1)
	go func() { upstream <- hs.readUpstream(r) }()
	idle := time.NewTimer(hs.h.cfg.Idle)
	defer idle.Stop()
	for {
		select {
		case err := <-upstream:
			if err != nil {
				hs.fail(asHopError(err, hs.upstreamPeer()))
			} else {
				hs.fail(nil)
			}
			return
		case <-hs.done:
			hs.unblock()
			_ = hs.upStream().Close()
			<-upstream
			return
		case <-hs.activity:
			if !idle.Stop() {
				select {
				case <-idle.C:
				default:
				}
			}
			idle.Reset(hs.h.cfg.Idle)
		case <-idle.C:
			// Nothing arrived for too long: blame the hop that should have
			// sent it (the origin for the head: nothing to re-route).
			hs.fail(codeErr(meshp2pb.ErrorCode_ERROR_CODE_TIMEOUT, fmt.Sprintf("session idle for %s", hs.h.cfg.Idle), hs.upstreamPeer()))
			hs.unblock()
			_ = hs.upStream().Close()
			<-upstream
			return
		}
	}
}

func (hs *hopSession) upstreamPeer() peer.ID {
	if hs.idx == 0 {
		return "" // the origin: nothing to re-route around
	}
	return hs.route[hs.idx-1]
}

func (hs *hopSession) touch() {
	select {
	case hs.activity <- struct{}{}:
	default:
	}
}

// readUpstream handles frames from upstream until close (nil) or failure.
func (hs *hopSession) readUpstream(r *frame.Reader) error {
	for {
		msg, tensors, err := r.ReadStream()
		if err != nil {
			if errors.Is(err, io.EOF) {
				// The upstream hop may have moved the seam: it attached
				// the new stream before ending this one.
				select {
				case ns := <-hs.resumeUp:
					old := hs.swapUp(ns)
					_ = old.Close()
					r = frame.NewReader(ns, hs.h.cfg.Limits)
					hs.h.log.Info("seam from previous hop moved", "session", hs.key, "path", pathOf(ns))
					continue
				default:
				}
				return nil
			}
			select {
			case <-hs.done:
				return nil
			default:
			}
			return err
		}
		hs.touch()
		switch k := msg.GetKind().(type) {
		case *meshp2pb.StreamMessage_Activation:
			if err := hs.activation(k.Activation, tensors); err != nil {
				return err
			}
		case *meshp2pb.StreamMessage_Close, *meshp2pb.StreamMessage_Cancel:
			return nil
		case *meshp2pb.StreamMessage_Error:
			return &hopError{k.Error}
		default:
			return codeErr(meshp2pb.ErrorCode_ERROR_CODE_UNEXPECTED_MESSAGE, "unexpected message on session stream", "")
		}
	}
}

// activation runs one frame through the shard and passes the result on.
func (hs *hopSession) activation(a *meshp2pb.ActivationHeader, tensors [][]byte) error {
	if !bytes.Equal(a.GetSessionId(), hs.open.GetSessionId()) || a.GetEpoch() != hs.key.Epoch {
		return codeErr(meshp2pb.ErrorCode_ERROR_CODE_SESSION_UNKNOWN, "activation for another session or epoch", "")
	}
	in := engine.Input{Pos: int(a.GetPosStart())}
	if hs.head {
		if len(a.GetTokens()) != int(a.GetNRows()) || len(tensors) != 0 {
			return codeErr(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "head expects token ids only", "")
		}
		in.Tokens = a.GetTokens()
	} else {
		if len(tensors) != 1 || a.GetTensors()[0].GetName() != bundleTensor {
			return codeErr(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "expected one l_out tensor", "")
		}
		ti := a.GetTensors()[0]
		if len(ti.GetShape()) != 2 || ti.GetShape()[0] != int64(a.GetNRows()) || ti.GetShape()[1] != int64(hs.h.info.NEmbd) {
			return codeErr(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, fmt.Sprintf("tensor shape %v, want [%d %d]", ti.GetShape(), a.GetNRows(), hs.h.info.NEmbd), "")
		}
		hidden, err := frame.ToF32(ti.GetDtype(), tensors[0], nil)
		if err != nil {
			return err
		}
		in.Hidden = hidden
	}
	last := a.GetLastChunk() || !a.GetIsPrefill()
	if hs.tail {
		in.Sample = last
	}
	t0 := time.Now()
	out, err := hs.eng.Forward(context.Background(), in)
	if err != nil {
		return engineErr(err)
	}
	took := time.Since(t0)
	us := uint32(took.Microseconds())
	if a.GetNRows() == 1 {
		hs.h.ObserveDecode(took)
	}
	if hs.tail {
		if !in.Sample {
			return nil
		}
		tf := &meshp2pb.TokenFrame{SessionId: a.GetSessionId(), Epoch: a.GetEpoch(), Step: a.GetStep(), Token: out.Token,
			Position: a.GetPosStart() + a.GetNRows(), Eos: hs.h.model.IsEOG(out.Token), HopUs: append(a.GetHopUs(), us)}
		if hs.head {
			select { // to selfRing, which is waiting (it sent the previous token)
			case hs.self <- tf:
			case <-hs.done:
			}
			return nil
		}
		hs.downMu.Lock()
		_ = hs.ringS.SetWriteDeadline(time.Now().Add(hs.h.cfg.Idle / 2))
		err := hs.downW.WriteStream(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Token{Token: tf}})
		hs.downMu.Unlock()
		if err != nil {
			return codeErr(meshp2pb.ErrorCode_ERROR_CODE_NEXT_HOP_UNREACHABLE, fmt.Sprintf("ring to head: %v", err), hs.route[0])
		}
		return nil
	}
	return hs.sendDown(a, out.Hidden, us)
}

const bundleTensor = "l_out"

// sendDown writes hidden states to the next hop in the session's wire dtype.
func (hs *hopSession) sendDown(a *meshp2pb.ActivationHeader, hidden []float32, us uint32) error {
	dt := hs.wire
	var payload []byte
	if dt == meshp2pb.DType_DTYPE_F16 {
		b, err := frame.EncodeF16(nil, hidden)
		if err != nil { // an outlier beyond f16's range: send this frame exactly
			dt = meshp2pb.DType_DTYPE_F32
		} else {
			payload = b
		}
	}
	if dt == meshp2pb.DType_DTYPE_F32 {
		payload = frame.F32Bytes(hidden)
	}
	rows := len(hidden) / hs.h.info.NEmbd
	hdr := &meshp2pb.ActivationHeader{SessionId: a.GetSessionId(), Epoch: a.GetEpoch(), Step: a.GetStep(), PosStart: a.GetPosStart(),
		NRows: uint32(rows), IsPrefill: a.GetIsPrefill(), LastChunk: a.GetLastChunk(), HopUs: append(a.GetHopUs(), us),
		Tensors: []*meshp2pb.TensorInfo{{Name: bundleTensor, Dtype: dt, Shape: []int64{int64(rows), int64(hs.h.info.NEmbd)}}}}
	hs.downMu.Lock()
	// A next hop that stops reading must not wedge us. Half the idle time
	// (30 s by default, far more than any chunk's compute) makes this
	// specific error, which names the next hop, win over our own idle
	// timeout, which could not.
	_ = hs.down.SetWriteDeadline(time.Now().Add(hs.h.cfg.Idle / 2))
	err := hs.downW.WriteActivation(hdr, payload)
	hs.downMu.Unlock()
	if err != nil {
		return codeErr(meshp2pb.ErrorCode_ERROR_CODE_NEXT_HOP_UNREACHABLE, fmt.Sprintf("send to next hop: %v", err), hs.route[hs.idx+1])
	}
	return nil
}

// readRing (head) takes sampled tokens from the tail.
func (hs *hopSession) readRing(rs network.Stream) {
	r := frame.NewReader(rs, hs.h.cfg.Limits)
	tail := hs.route[len(hs.route)-1]
	for {
		msg, _, err := r.ReadStream()
		if err != nil {
			if errors.Is(err, io.EOF) {
				// Either the tail moved the ring to a direct connection
				// (the new stream arrives here), or it closed the ring
				// without saying why: the cause is then usually upstream of
				// it, and our downstream watcher will name it. Blame the
				// tail only if nothing else happens.
				select {
				case <-hs.done:
					return
				case ns := <-hs.resumeRing:
					_ = rs.Close()
					rs = ns
					r = frame.NewReader(rs, hs.h.cfg.Limits)
					hs.downRef.Lock()
					hs.ringS = rs
					hs.downRef.Unlock()
					hs.h.log.Info("ring from tail moved", "session", hs.key, "path", pathOf(rs))
					continue
				case <-time.After(time.Second):
				}
			}
			select {
			case <-hs.done:
			default:
				hs.fail(codeErr(meshp2pb.ErrorCode_ERROR_CODE_NEXT_HOP_UNREACHABLE, fmt.Sprintf("lost ring from tail %s: %v", tail, err), tail))
			}
			return
		}
		hs.touch()
		switch k := msg.GetKind().(type) {
		case *meshp2pb.StreamMessage_Token:
			if err := hs.token(k.Token); err != nil {
				hs.fail(asHopError(err, ""))
				return
			}
		case *meshp2pb.StreamMessage_Error:
			hs.fail(hs.fromDownstream(k.Error, tail))
			return
		default:
			hs.fail(codeErr(meshp2pb.ErrorCode_ERROR_CODE_UNEXPECTED_MESSAGE, "unexpected message on ring", tail))
			return
		}
	}
}

// token (head) passes a sampled token to the origin and, unless the
// session is done, feeds it back into the route as the next decode step.
func (hs *hopSession) token(tf *meshp2pb.TokenFrame) error {
	hs.touch()
	hs.upMu.Lock()
	_ = hs.upStream().SetWriteDeadline(time.Now().Add(hs.h.cfg.Idle))
	err := hs.upW.WriteStream(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Token{Token: tf}})
	hs.upMu.Unlock()
	if err != nil {
		return codeErr(meshp2pb.ErrorCode_ERROR_CODE_CANCELLED, "origin gone", "")
	}
	hs.produced++
	if tf.GetEos() || (hs.maxTokens > 0 && hs.produced >= hs.maxTokens) {
		return nil // the origin closes the session
	}
	a := &meshp2pb.ActivationHeader{SessionId: tf.GetSessionId(), Epoch: tf.GetEpoch(), Step: tf.GetStep() + 1,
		PosStart: tf.GetPosition(), NRows: 1, LastChunk: true, Tokens: []int32{tf.GetToken()}}
	return hs.activation(a, nil)
}

func engineErr(err error) *hopError {
	switch {
	case errors.Is(err, engine.ErrNoCapacity):
		return codeErr(meshp2pb.ErrorCode_ERROR_CODE_CONTEXT_FULL, err.Error(), "")
	case errors.Is(err, engine.ErrBadInput):
		return codeErr(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, err.Error(), "")
	}
	return codeErr(meshp2pb.ErrorCode_ERROR_CODE_INTERNAL, err.Error(), "")
}

func asHopError(err error, blame peer.ID) *hopError {
	var he *hopError
	if errors.As(err, &he) {
		return he
	}
	var re *frame.RemoteError
	if errors.As(err, &re) && re.E != nil {
		return &hopError{re.E}
	}
	code := frame.Code(err)
	if code == meshp2pb.ErrorCode_ERROR_CODE_UNSPECIFIED || code == meshp2pb.ErrorCode_ERROR_CODE_INTERNAL {
		code = meshp2pb.ErrorCode_ERROR_CODE_NEXT_HOP_UNREACHABLE
	}
	return codeErr(code, err.Error(), blame)
}

func protoClone(o *meshp2pb.SessionOpen) *meshp2pb.SessionOpen {
	return proto.Clone(o).(*meshp2pb.SessionOpen)
}

// pathOf says whether a stream runs over a relay (its connection's remote
// address has /p2p-circuit) or directly.
func pathOf(s network.Stream) string {
	if _, err := s.Conn().RemoteMultiaddr().ValueForProtocol(multiaddr.P_CIRCUIT); err == nil {
		return "relayed"
	}
	return "direct"
}

// failWriteTimeout bounds the error report a failing hop sends.
const failWriteTimeout = 2 * time.Second

// selfRing is the ring of a one-hop route: it feeds each sampled token
// back in, like readRing does with the tail's tokens.
func (hs *hopSession) selfRing() {
	for {
		select {
		case <-hs.done:
			return
		case tf := <-hs.self:
			if err := hs.token(tf); err != nil {
				hs.fail(asHopError(err, ""))
				return
			}
		}
	}
}

// unblock resets the streams after the session failed, so no goroutine
// stays blocked writing to a peer that stopped reading.
func (hs *hopSession) unblock() {
	hs.downRef.Lock()
	down, ring := hs.down, hs.ringS
	hs.downRef.Unlock()
	if down != nil {
		_ = down.Reset()
	}
	if ring != nil && hs.tail {
		_ = ring.Reset()
	}
}

// fromDownstream accepts an error report from a later hop, but only lets
// it blame a peer that comes after us on the route: a hop must not be
// able to get an earlier, honest hop excluded. Otherwise the blame goes
// to the neighbour that sent the report.
func (hs *hopSession) fromDownstream(e *meshp2pb.Error, neighbour peer.ID) *hopError {
	e = proto.Clone(e).(*meshp2pb.Error)
	if len(e.GetFailedPeerId()) > 0 {
		fp := peer.ID(e.GetFailedPeerId())
		ok := false
		for j := hs.idx + 1; j < len(hs.route); j++ {
			ok = ok || hs.route[j] == fp
		}
		if !ok {
			e.FailedPeerId = []byte(neighbour)
		}
	}
	return &hopError{e}
}

// upStream returns the current upstream stream.
func (hs *hopSession) upStream() network.Stream {
	hs.upRef.Lock()
	defer hs.upRef.Unlock()
	return hs.up
}

// swapUp makes ns the upstream stream (errors and, on the head, tokens go
// there from now on) and returns the old one.
func (hs *hopSession) swapUp(ns network.Stream) network.Stream {
	hs.upMu.Lock()
	defer hs.upMu.Unlock()
	hs.upRef.Lock()
	defer hs.upRef.Unlock()
	old := hs.up
	hs.up, hs.upW = ns, frame.NewWriter(ns, hs.h.cfg.Limits)
	return old
}

// resume attaches a replacement seam stream from the previous hop to an
// open session (the seam moves from a relayed to a direct connection).
func (h *HopService) resume(s network.Stream, w *frame.Writer, open *meshp2pb.SessionOpen) {
	var key engine.SessionKey
	copy(key.ID[:], open.GetSessionId())
	key.Epoch = open.GetEpoch()
	h.mu.Lock()
	hs := h.active[key]
	h.mu.Unlock()
	if hs == nil || hs.head || int(open.GetHopIndex()) != hs.idx || s.Conn().RemotePeer() != hs.route[hs.idx-1] {
		h.reject(w, open, codeErr(meshp2pb.ErrorCode_ERROR_CODE_SESSION_UNKNOWN, "no such session to resume from that peer", ""))
		_ = s.Close()
		return
	}
	select {
	case hs.resumeUp <- s:
	default:
		h.reject(w, open, codeErr(meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST, "a seam move is already pending", ""))
		_ = s.Close()
		return
	}
	_ = w.WriteStream(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Accept{Accept: &meshp2pb.SessionAccept{SessionId: open.GetSessionId(), Epoch: open.GetEpoch(), Ok: true}}})
}

// migrateWhenDirect moves a long-lived stream this hop writes (the seam to
// the next hop, or on the tail the ring to the head) from a relayed to the
// direct connection once a hole punch to that peer succeeds: it opens a
// replacement stream (libp2p puts new streams on the direct connection),
// has the peer attach it, switches its writes over, then ends the old
// stream after everything already written on it.
func (hs *hopSession) migrateWhenDirect(p peer.ID, ring bool) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-hs.done
		cancel()
	}()
	for ev := range hs.h.host.SubscribeConn(ctx) {
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
	name := ProtoSession
	if ring {
		name = ProtoRing
	}
	octx, cancel := context.WithTimeout(ctx, h.cfg.OpenTimeout)
	defer cancel()
	ns, err := h.host.NewStream(octx, p, h.host.ProtocolID(name, ProtoVersion))
	if err != nil {
		return err
	}
	if pathOf(ns) != "direct" {
		_ = ns.Reset()
		return errors.New("new stream is not direct")
	}
	msg := protoClone(hs.open)
	msg.Resume = true
	msg.HopIndex = uint32(hs.idx + 1)
	if ring {
		msg.HopIndex = uint32(hs.idx)
	}
	w, r := frame.NewWriter(ns, h.cfg.Limits), frame.NewReader(ns, h.cfg.Limits)
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
	hs.downMu.Lock()
	hs.downRef.Lock()
	var old network.Stream
	if ring {
		old, hs.ringS = hs.ringS, ns
	} else {
		old, hs.down = hs.down, ns
	}
	hs.downRef.Unlock()
	hs.downW = w
	hs.downMu.Unlock()
	if !ring {
		go hs.watchDownstream(ns, r)
	}
	_ = old.CloseWrite()
	what := "seam to next hop"
	if ring {
		what = "ring to head"
	}
	h.moves.Add(1)
	h.log.Info(what+" moved to the direct connection", "session", hs.key, "peer", p)
	return nil
}

// supersede ends older epochs of a session that is being re-opened (the
// origin re-routed) and waits, bounded, until their KV cells are free: the
// old epoch is dead either way, and its reservation must not make the new
// one fail for lack of capacity.
func (h *HopService) supersede(key engine.SessionKey) {
	h.mu.Lock()
	var old []*hopSession
	for k, hs := range h.active {
		if k.ID == key.ID && k.Epoch < key.Epoch {
			old = append(old, hs)
		}
	}
	h.mu.Unlock()
	deadline := time.After(h.cfg.OpenTimeout / 2)
	for _, hs := range old {
		hs.fail(codeErr(meshp2pb.ErrorCode_ERROR_CODE_STALE_EPOCH, fmt.Sprintf("superseded by epoch %d", key.Epoch), ""))
		hs.unblock()
		select {
		case <-hs.released:
		case <-deadline:
			return
		}
	}
}
