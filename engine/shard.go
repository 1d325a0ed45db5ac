package engine

/*
#include <stdlib.h>
#include <string.h>
#include "mp.h"
*/
import "C"

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/neuron-tai/meshp2p/engine/gguf"
)

// Errors returned by shards and sessions; callers branch on them.
var (
	ErrNoCapacity    = errors.New("engine: no capacity")
	ErrSessionExists = errors.New("engine: session already open")
	ErrClosed        = errors.New("engine: shard closed")
	ErrSessionClosed = errors.New("engine: session closed")
	ErrBadInput      = errors.New("engine: bad input")
	ErrSelfTest      = errors.New("engine: start-up self-test failed (llama.cpp internals changed? see patches/README.md)")
	ErrDecode        = errors.New("engine: llama_decode failed")
)

// SessionKey identifies a route session on a hop: the same session id gets
// a new epoch after a reroute, and both epochs may briefly coexist.
type SessionKey struct {
	ID    [16]byte
	Epoch uint64
}

func (k SessionKey) String() string { return fmt.Sprintf("%x/%d", k.ID[:4], k.Epoch) }

// Config sizes a shard's llama context.
type Config struct {
	// NCtx is the number of KV cells shared by all sessions (default 4096).
	NCtx int
	// NBatch is the most rows one llama_decode takes (default 512). Larger
	// requests are split across decode steps.
	NBatch int
	// MaxSessions is the number of concurrent sessions (default 8).
	MaxSessions int
	// Threads for compute (default: number of CPUs).
	Threads int
	Logger  *slog.Logger
	// Baseline runs the engine as it was before batch invariance (issue
	// 23): attention without flash attention, freed KV cells reused in
	// place, and builds with llamafile's sgemm accepted. A session's logits
	// then depend on what else is batched with it. For benchmark baselines
	// only (make bench); meshp2p never sets it.
	Baseline bool
	// DisposableThreads makes ggml create and join its worker threads on
	// every decode, as it does without a thread pool (A/B measurements
	// only; the default is one persistent pool per shard).
	DisposableThreads bool
	// Poll is ggml's spin level (0-100) for idle pool workers before they
	// sleep; 0 (default) sleeps at once, leaving idle CPU to other shards.
	Poll int
	// Gate, if set, sizes each decode's threads at the moment it starts
	// (at most Threads, the pool's size): the machine's co-located
	// processes claim CPUs decode by decode (node/cpushare.Gate). Results
	// do not depend on the thread count.
	Gate ThreadGate
	// PrefixCacheCells are KV cells on top of NCtx that keep finished
	// sessions' prefixes for later sessions that start the same way
	// (prefixcache.go); 0: no prefix cache. Ignored (no cache) where the
	// shard is not batch-invariant.
	PrefixCacheCells int
	// PrefixCacheEntries bounds the prefixes kept (each a llama.cpp
	// sequence; default DefaultPrefixCacheEntries, at most what 256
	// sequences leave after the sessions').
	PrefixCacheEntries int
	// PrefixCacheInputBytes bounds the input rows the prefix cache keeps
	// beside its entries' cells, all entries together (host memory, not
	// KV: sessions opened with SessionParams.KeepInputs keep the f32 rows
	// they were fed, so an audit can rebuild the cells; prefixcache.go).
	// Past it the least recently used entries lose their rows (they still
	// serve; their adopters' epochs cannot be audited). 0: the default,
	// DefaultPrefixCacheInputBytes; negative: none kept. A session keeps
	// at most this much of its own rows too (rows past it could never
	// be kept): the worst case is MaxSessions + 1 times it.
	PrefixCacheInputBytes int64
}

// WithDefaults is c with every zero field at its default (what NewShard
// runs with), or why c is invalid.
func (c Config) WithDefaults() (Config, error) { return c.withDefaults() }

func (c Config) withDefaults() (Config, error) {
	if c.NCtx == 0 {
		c.NCtx = 4096
	}
	if c.NBatch == 0 {
		c.NBatch = 512
	}
	if c.MaxSessions == 0 {
		c.MaxSessions = 8
	}
	if c.Threads == 0 {
		c.Threads = runtime.NumCPU()
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.PrefixCacheEntries == 0 {
		c.PrefixCacheEntries = DefaultPrefixCacheEntries
	}
	if c.PrefixCacheInputBytes == 0 {
		c.PrefixCacheInputBytes = DefaultPrefixCacheInputBytes
	}
	switch {
	case c.NCtx < 16 || c.NCtx > 1<<22:
		return c, fmt.Errorf("%w: NCtx %d outside [16, %d]", ErrBadInput, c.NCtx, 1<<22)
	case c.NBatch < 2 || c.NBatch > 8192:
		return c, fmt.Errorf("%w: NBatch %d outside [2, 8192]", ErrBadInput, c.NBatch)
	case c.MaxSessions < 1 || c.MaxSessions > 250:
		return c, fmt.Errorf("%w: MaxSessions %d outside [1, 250]", ErrBadInput, c.MaxSessions)
	case c.Poll < 0 || c.Poll > 100:
		return c, fmt.Errorf("%w: Poll %d outside [0, 100]", ErrBadInput, c.Poll)
	case c.PrefixCacheCells < 0 || c.PrefixCacheCells > 1<<22 || c.PrefixCacheEntries < 0:
		return c, fmt.Errorf("%w: PrefixCacheCells %d outside [0, %d]", ErrBadInput, c.PrefixCacheCells, 1<<22)
	case c.NBatch < 2*c.MaxSessions:
		// Decode rows go first; leave room so prefill always progresses.
		return c, fmt.Errorf("%w: NBatch %d must be at least 2×MaxSessions (%d)", ErrBadInput, c.NBatch, 2*c.MaxSessions)
	}
	c.PrefixCacheEntries = min(c.PrefixCacheEntries, maxSeqs-2-c.MaxSessions)
	return c, nil
}

// maxSeqs is llama.cpp's LLAMA_MAX_SEQ: sessions, the scratch and grave
// sequences and the prefix cache's entries share them.
const maxSeqs = 256

// Capacity is what a shard can still admit.
type Capacity struct {
	MaxSessions  int
	FreeSessions int
	NCtx         int // KV cells in total
	FreeKV       int // KV cells not reserved by open sessions
	// Compactions counts the KV cache compactions so far (kvState).
	Compactions int64
	// PrefixCells are the prefix cache's cells (0: no cache), PrefixHeld
	// those its entries hold and PrefixEntries how many prefixes it
	// keeps; PrefixEvicted counts the entries evicted so far.
	PrefixCells, PrefixHeld, PrefixEntries int
	PrefixEvicted                          int64
}

// Shard runs one model file's layers for many sessions. One goroutine owns
// the llama context and batches all sessions' rows (continuous batching).
type Shard struct {
	model *Model
	info  ModelInfo
	cfg   Config
	log   *slog.Logger

	lctx    *C.struct_llama_context
	pool    *C.struct_ggml_threadpool // nil with DisposableThreads
	threads int                       // the pool's threads (the loop's; SetThreads asks for others)
	// running is the thread count llama.cpp computes with now: threads,
	// or fewer where Config.Gate gave a decode fewer (the loop's).
	running int
	// retired are pools SetThreads replaced that llama.cpp's CPU backend
	// may still point at: it switches (and pauses the old pool) only at
	// its next graph compute, so they are freed after the next decode
	// that succeeds (freeing one before that is a use after free).
	retired []*C.struct_ggml_threadpool
	// wantThreads is the thread count SetThreads asked for (0: none
	// asked); the loop applies it before its next decode.
	wantThreads atomic.Int32
	capture     *C.mp_capture         // nil on the tail (it produces logits)
	batch       *C.struct_llama_batch // in C memory: cgo may not see Go pointers to it
	// mrope: the batch holds 4 positions per row (initBatch), spread
	// from the first at each decode.
	mrope   bool
	cands   []C.llama_token_data // sampling scratch, owned by the loop
	nCtx    int                  // KV cells sessions may reserve
	cells   int                  // KV cells in all: nCtx and the prefix cache's
	scratch int                  // sequence id reserved for the self-test
	grave   int                  // sequence id that holds freed cells until compaction
	kv      kvState

	reqs chan *request
	quit chan struct{}
	done chan struct{}

	// Tail samplers are built outside mu: each build holds buildMu's read
	// lock, which Close takes to wait for them (the model a build reads
	// stays loaded until Close returns); grammar compiles also take
	// compileMu, one at a time.
	buildMu   sync.RWMutex
	compileMu sync.Mutex

	mu       sync.Mutex
	closed   bool
	sessions map[SessionKey]*Session
	freeSeq  []int
	reserved int
}

// NewShard creates a llama context for model and starts its batching loop.
// It runs the start-up self-test and fails loudly if llama.cpp no longer
// behaves the way the engine relies on (patches/README.md).
func NewShard(ctx context.Context, model *Model, cfg Config) (*Shard, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	info := model.Info()
	if info.VocabOnly {
		return nil, fmt.Errorf("%w: %s was loaded vocab-only", ErrBadInput, info.Path)
	}
	s := &Shard{
		model: model, info: info, cfg: cfg, log: cfg.Logger.With("shard", fmt.Sprintf("%d-%d", info.Start, info.End)),
		reqs: make(chan *request, 4*cfg.MaxSessions), quit: make(chan struct{}), done: make(chan struct{}),
		sessions: map[SessionKey]*Session{}, scratch: cfg.MaxSessions, grave: cfg.MaxSessions + 1,
		kv: kvState{live: map[int]int{}, lost: map[int]error{}, graved: map[int]int{}, cache: prefixCache{entries: map[int]*cacheEntry{}}},
	}
	cacheSeqs := 0
	if !cfg.Baseline && model.device.IsCPU() && cfg.PrefixCacheCells > 0 {
		s.kv.cache.cells, cacheSeqs = cfg.PrefixCacheCells, cfg.PrefixCacheEntries
		s.kv.cache.rowBytes = max(0, cfg.PrefixCacheInputBytes)
	}
	for i := range cacheSeqs {
		s.kv.cache.free = append(s.kv.cache.free, cfg.MaxSessions+2+i)
	}
	p := s.contextParams(cacheSeqs)
	if !info.IsTail() {
		s.capture = (*C.mp_capture)(C.calloc(1, C.size_t(unsafe.Sizeof(C.mp_capture{}))))
		name := gguf.LayerOutputName(info.Arch, info.NLayer-1)
		cname := C.CString(name)
		C.strncpy(&s.capture.name[0], cname, 63)
		C.free(unsafe.Pointer(cname))
		s.capture.cap = C.size_t(cfg.NBatch * info.NEmbd)
		s.capture.buf = (*C.float)(C.malloc(s.capture.cap * 4))
		C.mp_set_capture(&p, s.capture)
	}
	s.lctx = C.llama_init_from_model(model.ptr, p)
	if s.lctx == nil {
		s.freeC()
		return nil, fmt.Errorf("engine: llama_init_from_model failed for %s (n_ctx %d)", info.Path, cfg.NCtx)
	}
	s.cells = int(C.llama_n_ctx(s.lctx))
	s.nCtx = s.cells - s.kv.cache.cells
	if !cfg.DisposableThreads {
		s.pool = C.mp_threadpool_new(C.int(cfg.Threads), C.int(cfg.Poll))
		if s.pool == nil {
			s.freeC()
			return nil, fmt.Errorf("engine: ggml_threadpool_new(%d threads) failed", cfg.Threads)
		}
		C.llama_attach_threadpool(s.lctx, s.pool, s.pool)
	}
	s.threads = cfg.Threads
	s.running = cfg.Threads
	if err := s.initBatch(); err != nil {
		s.freeC()
		return nil, err
	}
	if info.IsTail() {
		s.cands = make([]C.llama_token_data, 0, info.NVocab)
		s.cands = (*[1 << 30]C.llama_token_data)(C.malloc(C.size_t(info.NVocab) * C.size_t(unsafe.Sizeof(C.llama_token_data{}))))[:info.NVocab:info.NVocab]
	}
	for i := cfg.MaxSessions - 1; i >= 0; i-- {
		s.freeSeq = append(s.freeSeq, i)
	}
	if err := s.selfTest(); err != nil {
		s.freeC()
		return nil, err
	}
	go s.loop()
	return s, nil
}

// initBatch allocates the batch: tokens on the head, hidden states
// elsewhere, and 4 positions per row on a shard fed hidden states whose
// model ropes with M-RoPE (glm4moe's non-head shards:
// docs/architectures.md), which llama.cpp reads for a batch of
// embeddings.
func (s *Shard) initBatch() error {
	embd := 0
	if !s.info.IsHead() {
		embd = s.info.NEmbd
	}
	s.batch = (*C.struct_llama_batch)(C.malloc(C.size_t(unsafe.Sizeof(C.struct_llama_batch{}))))
	*s.batch = C.llama_batch_init(C.int32_t(s.cfg.NBatch), C.int32_t(embd), 1)
	rt := C.llama_model_rope_type(s.model.ptr)
	if embd == 0 || (rt != C.LLAMA_ROPE_TYPE_MROPE && rt != C.LLAMA_ROPE_TYPE_IMROPE) {
		return nil
	}
	if !C.mp_batch_pos4(s.batch, C.int(s.cfg.NBatch)) {
		return fmt.Errorf("%w: cannot allocate the batch's positions", ErrNoCapacity)
	}
	s.mrope = true
	return nil
}

// contextParams are the llama context's parameters for s's config with
// cacheSeqs sequences for the prefix cache.
func (s *Shard) contextParams(cacheSeqs int) C.struct_llama_context_params {
	cfg := s.cfg
	p := C.llama_context_default_params()
	p.n_ctx = C.uint32_t(cfg.NCtx + s.kv.cache.cells)
	p.n_batch = C.uint32_t(cfg.NBatch)
	p.n_ubatch = C.uint32_t(cfg.NBatch)                       // one ubatch per decode: captured rows stay in batch order
	p.n_seq_max = C.uint32_t(cfg.MaxSessions + 2 + cacheSeqs) // + scratch + grave + cached prefixes
	p.n_threads = C.int32_t(cfg.Threads)
	p.n_threads_batch = C.int32_t(cfg.Threads)
	p.kv_unified = true // split_simple: rows come back in batch order
	// Sliding-window layers (gpt-oss, gemma3) get a cache of n_ctx cells
	// like the others. A smaller one makes llama.cpp reuse cells whose
	// positions left the window (llama_kv_cache::find_slot), below cells
	// still in use, which breaks the cell order kvState keeps (the
	// invariance gate then fails for gpt-oss batched with 7 others). With
	// the full size the search always finds free cells above used first.
	p.swa_full = true
	p.no_perf = true
	// Flash attention visits a row's KV cells one by one in cell order and
	// skips masked ones, so a session's attention depends only on the order
	// of its own cells, which the loop keeps equal to position order
	// (kvState). Without it, softmax and KQV reduce over every cell in SIMD
	// lanes, and other sessions' cells shift which lanes a session's values
	// fall in.
	p.flash_attn_type = C.LLAMA_FLASH_ATTN_TYPE_ENABLED
	if cfg.Baseline {
		p.flash_attn_type = C.LLAMA_FLASH_ATTN_TYPE_DISABLED
	}
	return p
}

// Info describes the model this shard runs.
func (s *Shard) Info() ModelInfo { return s.info }

// BatchInvariant reports whether a row's result depends only on its own
// session's input and cells, not on what is batched beside it: true on
// the CPU (checked at NewShard), false on a GPU backend, whose kernels
// change with the batch's shape (docs/gpu.md says what still holds).
func (s *Shard) BatchInvariant() bool { return !s.cfg.Baseline && s.model.device.IsCPU() }

// Config returns the effective configuration.
func (s *Shard) Config() Config { return s.cfg }

// Capacity reports free session slots and unreserved KV cells.
func (s *Shard) Capacity() Capacity {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := &s.kv.cache
	return Capacity{MaxSessions: s.cfg.MaxSessions, FreeSessions: len(s.freeSeq), NCtx: s.nCtx, FreeKV: s.nCtx - s.reserved,
		Compactions: s.kv.compactions.Load(), PrefixCells: c.cells, PrefixHeld: int(c.heldN.Load()), PrefixEntries: int(c.entriesN.Load()),
		PrefixEvicted: c.evicted.Load()}
}

// Close stops the loop, fails pending requests and frees the context.
func (s *Shard) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.buildMu.Lock() // waits for the samplers being built (newSampler sees closed after)
	defer s.buildMu.Unlock()
	close(s.quit)
	<-s.done
	s.freeC()
	return nil
}

func (s *Shard) freeC() {
	if s.lctx != nil {
		if s.batch != nil {
			C.llama_batch_free(*s.batch)
			C.free(unsafe.Pointer(s.batch))
			s.batch = nil
		}
		C.llama_free(s.lctx)
		s.lctx = nil
	}
	if s.pool != nil {
		C.ggml_threadpool_free(s.pool)
		s.pool = nil
	}
	s.freeRetired()
	if s.capture != nil {
		C.free(unsafe.Pointer(s.capture.buf))
		C.free(unsafe.Pointer(s.capture))
		s.capture = nil
	}
	if s.cands != nil {
		C.free(unsafe.Pointer(&s.cands[0]))
		s.cands = nil
	}
}

// SessionParams are fixed when a session opens on a shard.
type SessionParams struct {
	// KVTokens reserves KV cells for the session: prompt + generated tokens
	// it may reach. 0 means an even share of the context.
	KVTokens int
	// Sampling is used on the tail only.
	Sampling Sampling
	// KeepInputs (shards after the head) keeps the hidden-state rows the
	// session is fed, per position, so that what it keeps in the prefix
	// cache holds them beside the cells and an adopter gets them back
	// (Session.AdoptedInputs): what an audit replays the adopted
	// positions from. A head shard always keeps its tokens.
	KeepInputs bool
}

// Session is one sequence in a shard's context.
type Session struct {
	shard *Shard
	key   SessionKey
	seq   int
	kv    int
	smp   *sampler // tail only

	mu      sync.Mutex // one Forward at a time
	nextPos int
	closed  bool
	broken  error
	// toks (head shards) are the tokens of positions [0, nextPos): kept
	// with the session's cells in the prefix cache. keep, when set, is
	// what Close keeps there (Keep).
	toks []int32
	keep *Prefix
	// rows (KeepInputs, shards after the head) are the input rows of
	// positions [0, nextPos) while rowsOK (false once a position's rows
	// are unknown: adopted from an entry that kept none); adoptedRows are
	// those of the positions Adopt gave.
	keepRows, rowsOK bool
	rows             rowSegs
	adoptedRows      [][]float32 // the entry's, shared
}

// OpenSession admits a session: it needs a free sequence slot and KV cells.
func (s *Shard) OpenSession(key SessionKey, p SessionParams) (*Session, error) {
	if p.KVTokens < 0 {
		return nil, fmt.Errorf("%w: negative KV reservation", ErrBadInput)
	}
	if err := p.Sampling.validate(); err != nil {
		return nil, err
	}
	// The tail's sampler (a grammar's compile and the replay of a
	// re-routed session's tokens: up to seconds for a hostile grammar
	// within the bounds) is built before the shard lock, which every
	// admission and step of every session takes (issue 37, row 3: a 32 KB
	// grammar compiled under it serialized admissions for 16 s). Compiles
	// run one at a time per shard, so a flood of them costs one core.
	var smp *sampler
	if s.info.IsTail() {
		var err error
		if smp, err = s.newSampler(p.Sampling); err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	fail := func(err error) (*Session, error) {
		if smp != nil {
			smp.free()
		}
		return nil, err
	}
	if s.closed {
		return fail(ErrClosed)
	}
	if _, ok := s.sessions[key]; ok {
		return fail(fmt.Errorf("%w: %s", ErrSessionExists, key))
	}
	kv := p.KVTokens
	if kv == 0 {
		kv = s.nCtx / s.cfg.MaxSessions
	}
	if len(s.freeSeq) == 0 {
		return fail(fmt.Errorf("%w: all %d session slots in use", ErrNoCapacity, s.cfg.MaxSessions))
	}
	if s.reserved+kv > s.nCtx {
		return fail(fmt.Errorf("%w: session needs %d KV cells, %d of %d free", ErrNoCapacity, kv, s.nCtx-s.reserved, s.nCtx))
	}
	seq := s.freeSeq[len(s.freeSeq)-1]
	s.freeSeq = s.freeSeq[:len(s.freeSeq)-1]
	s.reserved += kv
	sess := &Session{shard: s, key: key, seq: seq, kv: kv, smp: smp, keepRows: p.KeepInputs && !s.info.IsHead(), rowsOK: true}
	s.sessions[key] = sess
	return sess, nil
}

// newSampler builds a tail session's sampler outside s.mu; one with a
// grammar waits for the other compiles.
func (s *Shard) newSampler(p Sampling) (*sampler, error) {
	s.buildMu.RLock()
	defer s.buildMu.RUnlock()
	if p.Grammar != "" {
		s.compileMu.Lock()
		defer s.compileMu.Unlock()
	}
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	return newSampler(s.model, p, s.nCtx)
}

// Key returns the session's key.
func (x *Session) Key() SessionKey { return x.key }

// GrammarTime is the time the session's grammar has taken on this tail so
// far (0 without a grammar): what its origin's grammar budget is charged.
func (x *Session) GrammarTime() time.Duration {
	if x.smp == nil {
		return 0
	}
	return time.Duration(x.smp.spent.Load())
}

// NextPos is the position the next Forward must start at.
func (x *Session) NextPos() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.nextPos
}

// Input is one chunk of rows for a session: token ids on a head shard,
// hidden states (rows × n_embd, row-major) elsewhere.
type Input struct {
	Pos    int // must equal the session's NextPos
	Tokens []int32
	Hidden []float32
	// Sample asks the tail to sample a token after the last row.
	Sample bool
	// Logits asks the tail for a copy of the last row's logits.
	Logits bool
	// AllLogits asks the tail for every row's logits (rows × n_vocab in
	// Output.Logits, row-major); it implies Logits. Verification of several
	// proposed tokens at once needs them (and the invariance tests).
	AllLogits bool
	// Verify asks the tail to check proposed tokens (speculative
	// decoding): it samples a target after each row in order, exactly as
	// one-row steps would (the sampler advances once per target), and
	// stops after the first target that differs from Draft[row] or after
	// the last row Draft covers. Draft holds the token proposed to follow
	// each row: rows-1 entries (the last row's target is a bonus) or rows
	// (the last one proposes what follows the window). Rows after the stop
	// stay in the KV cache; the caller truncates them.
	Verify bool
	Draft  []int32
}

// Output is the result of a Forward.
type Output struct {
	Hidden []float32 // non-tail: rows × n_embd
	Token  int32     // tail with Sample
	Logits []float32 // tail with Logits: n_vocab; with AllLogits: rows × n_vocab
	// Tokens are the targets of a Verify: Draft's accepted prefix, then
	// the first target that differs (a correction) or the bonus after the
	// last row. Its last entry is also in Token.
	Tokens []int32
	// Logprob is Token's log-probability (tail with Sample, when the
	// session's Sampling asks for log-probabilities).
	Logprob *TokenLogprob
}

// Forward runs the shard's layers on in and blocks until done. Rows of all
// sessions are batched together by the shard's loop.
func (x *Session) Forward(ctx context.Context, in Input) (*Output, error) {
	outs, err := forwardMany(ctx, []*Session{x}, []Input{in})
	if err != nil {
		return nil, err
	}
	return outs[0], nil
}

// forwardMany is Forward for several sessions of one shard at once: the
// loop takes all their requests in the same iteration, so they share a
// batch when they fit in one (tests use it to choose what is batched with
// what). It fails with the first error; every session whose rows ran
// advances.
func forwardMany(ctx context.Context, xs []*Session, ins []Input) ([]*Output, error) {
	sh := xs[0].shard
	for i, x := range xs {
		if slices.Contains(xs[:i], x) {
			return nil, fmt.Errorf("%w: session %s twice in one batch", ErrBadInput, x.key)
		}
	}
	reqs := make([]*request, len(xs))
	for i, x := range xs {
		x.mu.Lock()
		defer x.mu.Unlock()
		switch {
		case x.shard != sh:
			return nil, fmt.Errorf("%w: sessions of different shards", ErrBadInput)
		case x.closed:
			return nil, ErrSessionClosed
		case x.broken != nil:
			return nil, x.broken
		}
		rows, err := x.validate(ins[i])
		if err != nil {
			return nil, err
		}
		reqs[i] = &request{sess: x, in: ins[i], rows: rows, done: make(chan error, 1)}
		if !sh.info.IsTail() {
			reqs[i].out.Hidden = make([]float32, rows*sh.info.NEmbd)
		}
	}
	first := reqs[0]
	if len(reqs) > 1 {
		first = &request{group: reqs}
	}
	if err := sh.send(ctx, first); err != nil {
		return nil, err
	}
	// Once queued, a request runs to completion (its rows enter the KV
	// cache); waiting for it keeps the session consistent.
	var firstErr error
	outs := make([]*Output, len(reqs))
	for i, r := range reqs {
		if err := sh.wait(r); err != nil {
			xs[i].broken = err
			firstErr = cmp.Or(firstErr, err)
			continue
		}
		if sh.info.IsHead() {
			xs[i].toks = append(xs[i].toks[:min(len(xs[i].toks), xs[i].nextPos)], ins[i].Tokens...)
		}
		xs[i].addRows(ins[i].Hidden)
		xs[i].nextPos += r.rows
		outs[i] = &r.out
	}
	if firstErr != nil {
		return nil, firstErr
	}
	return outs, nil
}

func (x *Session) validate(in Input) (int, error) {
	info := x.shard.info
	var rows int
	switch {
	case info.IsHead() && in.Hidden != nil:
		return 0, fmt.Errorf("%w: head shard takes token ids, got hidden states", ErrBadInput)
	case !info.IsHead() && in.Tokens != nil:
		return 0, fmt.Errorf("%w: shard [%d,%d) takes hidden states, got token ids", ErrBadInput, info.Start, info.End)
	case info.IsHead():
		rows = len(in.Tokens)
		for _, t := range in.Tokens {
			if t < 0 || int(t) >= info.NVocab {
				return 0, fmt.Errorf("%w: token %d outside vocabulary of %d", ErrBadInput, t, info.NVocab)
			}
		}
	default:
		if len(in.Hidden)%info.NEmbd != 0 {
			return 0, fmt.Errorf("%w: hidden states of %d floats are not a multiple of n_embd %d", ErrBadInput, len(in.Hidden), info.NEmbd)
		}
		rows = len(in.Hidden) / info.NEmbd
		for _, v := range in.Hidden {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return 0, fmt.Errorf("%w: non-finite hidden state", ErrBadInput)
			}
		}
	}
	if rows == 0 {
		return 0, fmt.Errorf("%w: no rows", ErrBadInput)
	}
	if in.Pos != x.nextPos {
		return 0, fmt.Errorf("%w: position %d, session is at %d", ErrBadInput, in.Pos, x.nextPos)
	}
	if x.nextPos+rows > x.kv {
		return 0, fmt.Errorf("%w: %d rows at position %d exceed the session's %d reserved KV cells", ErrNoCapacity, rows, x.nextPos, x.kv)
	}
	if (in.Sample || in.Logits || in.AllLogits || in.Verify) && !info.IsTail() {
		return 0, fmt.Errorf("%w: only the tail shard samples", ErrBadInput)
	}
	if in.Verify {
		if in.Sample || in.Logits || in.AllLogits {
			return 0, fmt.Errorf("%w: verify samples every row itself (no Sample or Logits with it)", ErrBadInput)
		}
		if len(in.Draft) != rows-1 && len(in.Draft) != rows {
			return 0, fmt.Errorf("%w: %d proposed tokens for %d rows (want %d or %d)", ErrBadInput, len(in.Draft), rows, rows-1, rows)
		}
	} else if in.Draft != nil {
		return 0, fmt.Errorf("%w: proposed tokens without verify", ErrBadInput)
	}
	return rows, nil
}

// Truncate drops the session's rows from position pos on (0 ≤ pos ≤
// NextPos), e.g. rejected speculative rows; the next Forward starts at
// pos. The dropped cells go to the shard's grave sequence, so the cache
// keeps no holes and rows decoded after the cut compute bitwise what they
// would have without the dropped ones. Only the KV cache is rolled back:
// a tail's sampler state (penalty history) is not.
func (x *Session) Truncate(ctx context.Context, pos int) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	switch {
	case x.closed:
		return ErrSessionClosed
	case x.broken != nil:
		return x.broken
	case pos < 0 || pos > x.nextPos:
		return fmt.Errorf("%w: truncate to position %d, session is at %d", ErrBadInput, pos, x.nextPos)
	case pos == x.nextPos:
		return nil
	}
	s := x.shard
	r := &request{sess: x, trim: pos, trimTo: true, done: make(chan error, 1)}
	if err := s.send(ctx, r); err != nil {
		return err
	}
	if err := s.wait(r); err != nil {
		x.broken = err
		return err
	}
	x.nextPos = pos
	x.toks = x.toks[:min(len(x.toks), pos)]
	if x.rowsOK {
		x.rows.cut(min(x.rows.n(), pos*s.info.NEmbd))
	} else if pos == 0 {
		x.rowsOK, x.rows = true, rowSegs{} // nothing unknown is left
	}
	return nil
}

// send queues r for the loop.
func (s *Shard) send(ctx context.Context, r *request) error {
	select {
	case s.reqs <- r:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-s.quit:
		return ErrClosed
	}
}

// wait is a queued request's answer (ErrClosed once the loop has ended).
func (s *Shard) wait(r *request) error {
	select {
	case err := <-r.done:
		return err
	case <-s.done:
		return ErrClosed
	}
}

// Close frees the session's KV cells and slot. It is safe to call twice.
func (x *Session) Close() {
	x.mu.Lock()
	if x.closed {
		x.mu.Unlock()
		return
	}
	x.closed = true
	var keep *keepReq
	if x.keep != nil && x.broken == nil {
		keep = &keepReq{p: *x.keep, pos: x.nextPos, toks: x.toks}
		if x.keepRows && x.rowsOK {
			keep.rows = x.rows.frozen()
		}
	}
	x.mu.Unlock()
	s := x.shard
	r := &request{sess: x, free: true, keep: keep, done: make(chan error, 1)}
	if s.send(context.Background(), r) == nil {
		_ = s.wait(r)
	}
	if x.smp != nil {
		x.smp.free()
	}
	s.mu.Lock()
	delete(s.sessions, x.key)
	s.freeSeq = append(s.freeSeq, x.seq)
	s.reserved -= x.kv
	s.mu.Unlock()
}

type request struct {
	group []*request // several sessions' requests taken together (forwardMany)
	sess  *Session
	in    Input
	rows  int
	off   int // rows already decoded
	free  bool
	keep  *keepReq // with free: what the prefix cache keeps of the session
	// adopt asks for the longest cached prefix (Session.Adopt); the loop
	// answers its positions in adopted and their tokens in out.Tokens.
	adopt     *Prefix
	adopted   int
	adoptRows [][]float32 // the adopted positions' input rows (shared)
	trim      int         // with trimTo: drop the session's rows from position trim on
	out       Output
	done      chan error // receives exactly one result
	// trimTo marks a Truncate request.
	trimTo bool
	// stopped is set once a Verify request's target differed from the
	// proposed token: later rows are decoded but not sampled.
	stopped bool
	// failed is set by the loop once it has sent an error on done, so a
	// request split across decodes is answered once.
	failed bool
	// serr is the request's own sampling error (ErrGrammar), answered
	// when its rows are done.
	serr error
}

// ThreadGate hands a decode its threads (Config.Gate).
type ThreadGate interface {
	// Acquire claims the threads of a decode starting now, 1 to limit.
	Acquire(limit int) int
	// Release gives back what Acquire claimed.
	Release(n int)
}

// SetThreads asks the shard to compute with n threads from its next
// decode on (the loop swaps its thread pool between decodes; n < 1 is
// ignored). Results do not depend on the thread count: every product and
// attention row is computed by one thread (docs/architecture.md, "Batch
// invariance"); TestSetThreadsKeepsOutput checks it.
func (s *Shard) SetThreads(n int) {
	if n >= 1 {
		s.wantThreads.Store(int32(n))
	}
}

// Threads is the number of threads the shard computes with now.
func (s *Shard) Threads() int {
	if n := s.wantThreads.Load(); n > 0 {
		return int(n)
	}
	return s.cfg.Threads
}

// freeRetired frees the pools SetThreads replaced. The loop calls it
// after a decode succeeded (the CPU backend then uses s.pool) and freeC
// after llama_free.
func (s *Shard) freeRetired() {
	for _, p := range s.retired {
		C.ggml_threadpool_free(p)
	}
	s.retired = nil
}

// applyThreads runs on the loop before a decode: a new pool of the
// threads SetThreads asked for replaces the old one.
func (s *Shard) applyThreads() {
	n := int(s.wantThreads.Load())
	if n <= 0 || n == s.threads {
		return
	}
	C.llama_set_n_threads(s.lctx, C.int32_t(n), C.int32_t(n))
	s.running = n
	if s.pool != nil {
		pool := C.mp_threadpool_new(C.int(n), C.int(s.cfg.Poll))
		if pool == nil {
			s.log.Warn("could not change the thread count; keeping the old pool", "threads", s.threads, "asked", n)
			C.llama_set_n_threads(s.lctx, C.int32_t(s.threads), C.int32_t(s.threads))
			s.running = s.threads
			s.wantThreads.Store(int32(s.threads))
			return
		}
		C.llama_attach_threadpool(s.lctx, pool, pool)
		s.retired = append(s.retired, s.pool)
		s.pool = pool
	}
	s.log.Info("compute threads changed", "from", s.threads, "to", n)
	s.threads = n
}
