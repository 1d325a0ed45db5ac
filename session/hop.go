package session

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
)

// HopConfig configures a HopService.
type HopConfig struct {
	Fingerprint string
	// Idle frees a session after this long without frames (DefaultIdle).
	Idle time.Duration
	// OpenTimeout bounds admission along the rest of the route
	// (DefaultOpenTimeout).
	OpenTimeout time.Duration
	Limits      frame.Limits
	Logger      *slog.Logger
	// FirstFrame bounds the wait for the first frame after this hop
	// accepted a session (DefaultFirstFrame; never more than Idle).
	FirstFrame time.Duration
	// MaxSessionKV caps the KV cells one session may reserve on this hop
	// (0: the shard's KV cells / DefaultSessionKVDivisor; negative: no cap
	// but the engine's own).
	MaxSessionKV int
	// MaxSessionsPerPeer and MaxKVPerPeer are the quota per origin, at
	// any position of the route: sessions and KV cells one origin may hold
	// here at once (0: a DefaultPeerShareDivisor-th of the shard's slots
	// and cells; negative: no quota).
	MaxSessionsPerPeer, MaxKVPerPeer int
	// SilenceBackoff is how long an origin's new sessions are refused
	// after one of them held a slot here and sent nothing, doubling per
	// such session (DefaultSilenceBackoff, up to DefaultSilenceBackoffMax).
	SilenceBackoff time.Duration
	// GrammarBudget and GrammarRefill (per minute) are each origin's
	// grammar time on this tail (DefaultGrammarBudget,
	// DefaultGrammarRefill; grammarbudget.go).
	GrammarBudget, GrammarRefill time.Duration
	// TrustedOrigins are origins the per-origin quota and the silence
	// backoff do not apply to (an API gateway that carries many users'
	// sessions); they are still bounded by the shard's slots, its KV cells
	// and MaxSessionKV. Read-only after NewHopService.
	TrustedOrigins map[peer.ID]bool
	// Admit, if set, runs after the built-in checks (model, range, route
	// shape, sender) and may refuse the session with an error to send back
	// (e.g. a missing or invalid route ticket: TicketAdmission). idx is
	// this hop's route index; from is the peer that opened the stream (the
	// origin for the head, else the previous hop).
	Admit func(open *meshp2pb.SessionOpen, idx int, from peer.ID) *meshp2pb.Error
	// Observer sees admissions, refusals, compute and seam writes
	// (metrics, the status page); nil: none.
	Observer HopObserver
	// Proposer, if set, makes the proposer of each speculative session
	// this hop heads (nil, or when it gives none: n-gram lookup,
	// spec.NGram): a node's draft model (--draft), or a benchmark's
	// script of known acceptance.
	Proposer ProposerFactory
	// KernelClass is the engine's kernel class (engine.KernelClass), named
	// in this hop's signed transcripts so an auditor knows whether its
	// replay must match exactly.
	KernelClass string
	// AuditKeepBytes bounds what this hop keeps for audits, all sessions
	// together (DefaultAuditKeepBytes); AuditHold is how long it keeps a
	// session's records after it ended (DefaultAuditHold).
	AuditKeepBytes int64
	AuditHold      time.Duration
}

// HopService serves one engine shard to route sessions: it registers the
// session and ring protocols and runs every (session, epoch) admitted on
// this hop.
type HopService struct {
	host Host
	// info is the model-wide geometry (ParentNLayer, NEmbd) all engines
	// share; each served range has its own servedEngine.
	info  ShardInfo // guarded by mu (Retarget)
	fp    string    // the model's fingerprint; guarded by mu (Retarget)
	cfg   HopConfig
	log   *slog.Logger
	speed speedMeter

	mu      sync.Mutex // guards info, fp, engines (admitting, pinned), moved, closed, active, perPeer, unheard; never held during I/O or with a seam lock
	engines []*servedEngine
	moved   map[rangeKey]time.Time // ranges drained away, when (MovedGrace)
	closed  bool
	active  map[Key]*hopSession
	perPeer map[peer.ID]peerUse // what each origin holds here (quota)
	unheard map[peer.ID]int     // sessions per upstream peer that have sent no frame yet
	wg      sync.WaitGroup

	guard   *originGuard   // origin signatures, freshness, replays
	silence *silenceMemory // origins whose sessions sent nothing
	grammar *grammarBudget // origins' grammar time on this tail
	audits  *auditStore    // what sessions asking for transcripts kept here
	standby standbyCounters

	// relayTamper, nil but in tests, changes a token the head passes to
	// the origin: a hostile head (relaycheck_test.go).
	relayTamper func(*meshp2pb.TokenFrame)
}

// NewHopService registers the session and ring protocols on host.
func NewHopService(host Host, eng Engine, cfg HopConfig) *HopService {
	if cfg.Idle == 0 {
		cfg.Idle = DefaultIdle
	}
	if cfg.OpenTimeout == 0 {
		cfg.OpenTimeout = DefaultOpenTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Observer == nil {
		cfg.Observer = NopHop{}
	}
	if cfg.SilenceBackoff <= 0 {
		cfg.SilenceBackoff = DefaultSilenceBackoff
	}
	if cfg.GrammarBudget <= 0 {
		cfg.GrammarBudget = DefaultGrammarBudget
	}
	if cfg.GrammarRefill <= 0 {
		cfg.GrammarRefill = DefaultGrammarRefill
	}
	if cfg.AuditKeepBytes <= 0 {
		cfg.AuditKeepBytes = DefaultAuditKeepBytes
	}
	if cfg.AuditHold <= 0 {
		cfg.AuditHold = DefaultAuditHold
	}
	info := eng.Info()
	h := &HopService{host: host, info: info, fp: cfg.Fingerprint, cfg: cfg, engines: []*servedEngine{{fp: cfg.Fingerprint, own: true, eng: eng, info: info, admitting: true}},
		log: cfg.Logger.With("range", fmt.Sprintf("%d-%d", info.Start, info.End)), active: map[Key]*hopSession{}, perPeer: map[peer.ID]peerUse{}, unheard: map[peer.ID]int{},
		guard:   newOriginGuard(OpenMaxAge, route.DefaultClockSkew, DefaultMaxOpenMemory, DefaultMaxOpensPerOrigin, nil),
		silence: newSilenceMemory(cfg.SilenceBackoff, max(cfg.SilenceBackoff, DefaultSilenceBackoffMax), DefaultFailurePeers, nil),
		grammar: newGrammarBudget(cfg.GrammarBudget, cfg.GrammarRefill, DefaultFailurePeers, nil),
		audits:  newAuditStore(cfg.AuditKeepBytes, cfg.AuditHold)}
	h.speed.layers = max(1, info.End-info.Start)
	host.SetStreamHandler(host.ProtocolID(ProtoSession, ProtoVersion), h.handleSession)
	host.SetStreamHandler(host.ProtocolID(ProtoRing, ProtoVersion), h.handleRing)
	host.SetStreamHandler(host.ProtocolID(ProtoAudit, ProtoVersion), h.handleAudit)
	return h
}

// Sessions reports how many sessions are open on this hop.
func (h *HopService) Sessions() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.active)
}

// lookup returns the open session with key (nil if none).
func (h *HopService) lookup(key Key) *hopSession {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.active[key]
}

// Close stops accepting sessions, ends the open ones and waits for them.
func (h *HopService) Close() {
	h.host.RemoveStreamHandler(h.host.ProtocolID(ProtoSession, ProtoVersion))
	h.host.RemoveStreamHandler(h.host.ProtocolID(ProtoRing, ProtoVersion))
	h.host.RemoveStreamHandler(h.host.ProtocolID(ProtoAudit, ProtoVersion))
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

// hopSession is one (session, epoch) on this hop. Its streams are seams
// (see Seam); the fields without a comment are fixed at admission.
type hopSession struct {
	h     *HopService
	se    *servedEngine // the range this session runs on
	key   Key
	open  *meshp2pb.SessionOpen
	idx   int
	head  bool
	tail  bool
	eng   EngineSession
	wire  meshp2pb.DType
	route []peer.ID
	from  peer.ID // the peer that opened this epoch here (the origin on the head)
	// origin signed the open (checked at admission): quotas, the silence
	// backoff and supersede key on it.
	origin peer.ID
	// quota is what this epoch counts against its origin's quota, given
	// back by closeEngine; unheard: it counts in h.unheard[from] (h.mu).
	quota   peerUse
	unheard bool
	// heard is set by the first frame from upstream; admittedAt is when
	// the route accepted the session (silence strikes).
	heard      atomic.Bool
	admittedAt time.Time
	// openedAt is when the open was read, localAt when this hop's own
	// admission was done (supersede, adoption, reservation): the debug
	// log's split of an admission's time, the rest of it the route after.
	openedAt, localAt time.Time
	// superseded and reserved are when the supersede of older epochs and
	// the engine reservation (slot, adoption, replay lookup) were done.
	superseded, reserved time.Time
	closingWaited        time.Duration // waitClosing's share (between them)
	firstRows            atomic.Bool   // a re-routed epoch's first rows were logged
	// rows is what this epoch has computed here (rowBudget bounds it).
	rows atomic.Int64
	// engOnce closes the engine session once (supersede frees a dead
	// epoch's cells before the new epoch's admission; release too);
	// engFreed is closed when its cells are free.
	engOnce  sync.Once
	engFreed chan struct{}

	up      *Seam // from the previous hop (the origin on the head); errors, and tokens on the head, go back on it
	down    *Seam // to the next hop (no stream on the tail)
	ringOut *Seam // tail (not head): the ring to the head
	ringIn  *Seam // head (not tail): the ring from the tail, read by readRing

	// resumeUp / resumeRing receive the replacement stream when the
	// upstream hop (or the tail) moves the seam to a direct connection.
	resumeUp   chan network.Stream
	resumeRing chan network.Stream
	ring       chan network.Stream // head: the tail's ring stream arrives here
	// self carries sampled tokens back to the decode loop when this hop is
	// head and tail at once (a one-hop route): no recursion, and the
	// upstream reader stays free to see SessionClose.
	self chan *meshp2pb.StreamMessage

	// sp is the head's proposer of a speculative session (nil: none);
	// spec what every hop keeps of its windows.
	sp   *specHead
	spec specHop

	// tx is everything of the audits the data path calls (auditseam.go):
	// this hop's signed transcripts, the check of the statements of the
	// hop before it (the head: the tail's) and what it keeps for an audit;
	// noAudit when the session asks for no transcripts.
	// trMu orders the head's input frames (prefill from the origin, steps
	// from the ring) against the final statement at a clean close, after
	// which closing drops what the ring still brings. It is held across
	// the engine step but not across network writes: what an input writes
	// on the down seam goes in a turn taken under trMu and is written
	// after it is released, in turn order (turn.go, docs/locks.md).
	// lastTurn, guarded by trMu, is the latest turn taken.
	tx        hopAudit
	trMu      sync.Mutex
	lastTurn  chan struct{}
	closing   atomic.Bool
	tailFinal chan struct{} // head: closed when the tail's final statement arrived

	// prompted (head): the origin's last prompt chunk arrived; only
	// readUpstream touches it.
	prompted bool

	// The prefix cache (prefix.go): cached positions this hop adopted at
	// admission (cachedToks: their tokens, on the head), the next hop's
	// acceptance (what the hops after this one hold), whether the first
	// frame came (startAt), and a clean close's continuation of the chain.
	cached     int
	cachedToks []int32
	cachedRows func() []float32 // the adopted positions' input rows (InputKeeper; shards after the head), read off the first frame's path
	downCached *meshp2pb.SessionAccept
	started    atomic.Bool
	prefixMore atomic.Pointer[[]byte]
	// progressOut (head) is the origin's latest SessionProgress not yet
	// passed on: the head's down seam has two writers (the origin's
	// reader and the ring's), so the progress goes with the next frame
	// the ring's writer sends (writeDown), never from the origin's reader
	// at once, which would wait on the seam behind the ring's writes.
	progressOut atomic.Pointer[meshp2pb.StreamMessage]
	// Failover (failover.go): the prefill frames this hop sent in the
	// session's previous epoch (replay, covering [0, replayTo)), the next
	// hop's start from the epoch's hop_starts (it forwards only rows from
	// there), and the rows it still has to re-send before its first.
	replay    []*meshp2pb.RecordedFrame
	replayTo  int
	nextStart atomic.Int32
	resend    [2]int

	// Hot standby (standby.go): this session is a standby (it computes
	// what the covered hop does and sends nothing on), or, on the hop
	// before the covered one, mirror sends the standby the frames.
	standby bool
	mirror  *mirror

	maxTokens int
	produced  int      // head: tokens passed to the origin; only the ring reader touches it
	admitted  bool     // the route accepted it (set before run; read by release)
	clock     hopClock // the previous frame's write times (HopTiming)
	activity  chan struct{}
	busy      atomic.Int32 // frames being computed and sent: the idle timer waits for them
	waits     waitPlan     // the waits that follow the work (waits.go)
	clk       waitClock    // when this hop last heard from upstream, and since when it computes

	once     sync.Once
	done     chan struct{} // closed when the session fails or ends
	released chan struct{} // closed once everything is freed
	err      error         // why it ended; written once, inside once
}

// firstFrame is how long hop idx waits for a session's first frame
// after accepting it (see DefaultFirstFrame), never more than Idle.
func (h *HopService) firstFrame(idx int) time.Duration {
	d := h.cfg.FirstFrame
	if d <= 0 {
		d = DefaultFirstFrame
	}
	return min(d*time.Duration(idx+1), h.cfg.Idle)
}

// peerUse is what one origin holds on a hop: sessions and KV cells.
type peerUse struct{ sessions, kv int }

func (hs *hopSession) upstreamPeer() peer.ID {
	if hs.idx == 0 {
		return "" // the origin: nothing to re-route around
	}
	return hs.route[hs.idx-1]
}

func (hs *hopSession) touch() {
	hs.clk.heard.Store(time.Now().UnixNano())
	if !hs.heard.Swap(true) {
		hs.h.heardFrom(hs)
	}
	select {
	case hs.activity <- struct{}{}:
	default:
	}
}
