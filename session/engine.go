package session

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// Engine is what a hop needs from the model runtime: the layer range it
// serves, sessions to run rows through, and which tokens end a generation.
// node wires the real llama.cpp shard (engine.Shard) in; tests use a
// deterministic fake, so this package builds and tests without cgo.
type Engine interface {
	Info() ShardInfo
	// OpenSession admits a session: a free sequence slot and KVTokens KV
	// cells. Errors wrap ErrNoCapacity or ErrBadInput where they apply.
	OpenSession(key Key, p EngineParams) (EngineSession, error)
	// IsEOG reports whether tok ends a generation (tail only).
	IsEOG(tok int32) bool
}

// EngineSession is one session's sequence in the engine.
type EngineSession interface {
	// Forward runs the shard's layers on in and blocks until done. Errors
	// wrap ErrNoCapacity (context full) or ErrBadInput where they apply.
	Forward(ctx context.Context, in Input) (Output, error)
	// Truncate drops the session's rows from position pos on (rejected
	// speculative rows); the next Forward starts at pos.
	Truncate(ctx context.Context, pos int) error
	// Close frees the session's slot and KV cells.
	Close()
}

// GrammarTimer is implemented by engine sessions that report the time
// their grammar took on the tail (the origin's grammar budget is charged
// it when the session ends).
type GrammarTimer interface {
	GrammarTime() time.Duration
}

// ShardInfo is the part of the model geometry admission and framing need.
type ShardInfo struct {
	Start, End   int // global layer range [Start, End)
	ParentNLayer int // layers of the whole model
	NEmbd        int // hidden-state width
	// NCtx is the shard's KV cells in total and MaxSessions its session
	// slots (0: unknown); admission derives its per-session cap and
	// per-peer quotas from them.
	NCtx, MaxSessions int
}

// IsHead reports whether the shard takes token ids.
func (i ShardInfo) IsHead() bool { return i.Start == 0 }

// IsTail reports whether the shard samples tokens.
func (i ShardInfo) IsTail() bool { return i.End == i.ParentNLayer }

// Key identifies a route session on a hop: the origin that signed it, the
// session id it chose, and the epoch (the same session id gets a new epoch
// after a re-route, and both epochs may briefly coexist). Two origins that
// pick the same id are two sessions: a stranger who learnt an id cannot
// collide with it.
type Key struct {
	Origin peer.ID
	ID     [16]byte
	Epoch  uint64
}

func (k Key) String() string { return fmt.Sprintf("%x/%d", k.ID[:4], k.Epoch) }

// Local is a 16-byte id unique to (origin, session id): what an engine that
// knows nothing of origins keys the session by.
func (k Key) Local() [16]byte {
	h := sha256.New()
	h.Write([]byte(k.Origin))
	h.Write(k.ID[:])
	var id [16]byte
	copy(id[:], h.Sum(nil))
	return id
}

// keyOf is the key of open (its origin as the open claims it: admission
// checks the signature; lookups check the sender against the admitted
// session's route).
func keyOf(open *meshp2pb.SessionOpen) Key {
	k := Key{Origin: peer.ID(open.GetOriginPeerId()), Epoch: open.GetEpoch()}
	copy(k.ID[:], open.GetSessionId())
	return k
}

// EngineParams are fixed when a session opens.
type EngineParams struct {
	// KVTokens reserves KV cells: prompt + generated tokens it may reach.
	KVTokens int
	// Sampling is the session's sampling (tail only; nil: greedy).
	Sampling *meshp2pb.SamplingParams
	// Generated are tokens already produced before a re-route: they feed
	// the repetition penalty and offset the seeded draws.
	Generated []int32
	// KeepInputs asks a shard after the head to keep its input rows with
	// what it keeps in the prefix cache (InputKeeper): sessions that
	// record transcripts, whose later adopters can then be audited.
	KeepInputs bool
}

// Input is one chunk of rows: token ids on the head, hidden states (rows ×
// n_embd, row-major) elsewhere.
type Input struct {
	Pos    int
	Tokens []int32
	Hidden []float32
	Sample bool // the tail samples a token after the last row
	// Verify (tail, speculative windows): sample a target after each row
	// in order, as one-row steps would, and stop after the first that
	// differs from Draft[row] or after the last row Draft covers. Draft
	// has rows-1 entries (the last row's target is a bonus) or rows.
	Verify bool
	Draft  []int32
}

// Output is the result of a Forward.
type Output struct {
	Hidden []float32 // non-tail: rows × n_embd
	Token  int32     // tail with Sample
	Tokens []int32   // tail with Verify: the targets, in order (see Input.Verify)
	// Logprobs of Token (tail with Sample, when the session's sampling
	// asks for them).
	Logprobs *meshp2pb.TokenLogprobs
}

// Errors an Engine wraps so that the hop can map them to wire codes.
var (
	ErrNoCapacity = errors.New("session: engine has no capacity")
	ErrBadInput   = errors.New("session: bad input for the engine")
)
