package session

import (
	"fmt"
	"time"
)

// Every default and timeout of the route-session protocol, with its reason.
// The timeouts form a ladder (checked by CheckTimeoutLadder and its test):
// the most specific report must win, so a writer gives up before its hop's
// idle timer, and a hop's idle timer before the origin's token timeout.
//
//	FailWriteTimeout < write deadline (Idle/2) < Idle < TokenTimeout
//	DefaultFirstFrame < Idle (the first frame's tighter idle timer)
//
// Through the prefill every wait also follows the work (waits.go): a hop
// waits, on top of these, for the work the hops before it (and, once its
// own prompt rows are in, the hops after it) still have to do, estimated
// from the prompt's rows and the hops' advertised speed × PrefillWaitSlack;
// the origin's first-token wait covers the longest of them.
const (
	// DefaultIdle frees a hop's session after this long without frames and
	// reports TIMEOUT blaming the upstream neighbour.
	DefaultIdle = 60 * time.Second
	// DefaultOpenTimeout bounds admission along the rest of the route from
	// one hop; deeper hops get less (see admissionBudget), so a hang is
	// reported by the hop next to it.
	DefaultOpenTimeout = 15 * time.Second
	// WriteDeadlineDivisor: every data write on a seam has a deadline of
	// Idle/WriteDeadlineDivisor (30 s by default, far more than any
	// chunk's compute), so a next hop that stops reading is named by this
	// specific error before our own idle timeout fires.
	WriteDeadlineDivisor = 2
	// MaxBusyIdles is how many idle periods in a row a hop's idle timer
	// waits while the hop itself is still computing or sending a frame,
	// before it gives the session up (an engine that never returns).
	MaxBusyIdles = 8
	// DefaultFirstFrame is how long an admitted session may wait for its
	// first frame: the origin sends its prefill right after the accept, so
	// an open that reserves a route's KV cells and sends nothing is freed
	// in seconds, not after Idle. Hop idx of a route waits (idx+1) times
	// this (the first chunk is computed by every hop before it), at most
	// Idle.
	DefaultFirstFrame = 10 * time.Second
	// PrefillWaitSlack: a wait for other hops' prefill work allows this
	// many times their estimate (rows × layers × advertised decode time
	// per layer). Generous, because the estimate is rough: a loaded
	// machine runs several times slower than the best it advertises
	// (measured at a quiet moment), and while a big model's prefill row
	// costs a fraction of a decode row, a small model whose weights stay
	// in cache can spend twice a decode row on one (measured: 1.26 against
	// 0.58 ms per layer, f16 768-wide, one thread). Waiting too long only
	// delays the report of a hop that hangs in the prefill; too short
	// excludes an honest one.
	PrefillWaitSlack = 10
	// MaxPrefillWait caps the work a wait allows for (the estimate × the
	// slack, over the whole route): hop_ms_per_layer is the origin's word,
	// unsigned, and a relaying hop must not hold later hops for ever.
	MaxPrefillWait = 10 * time.Minute
	// DefaultSessionKVDivisor: one session may reserve at most this
	// fraction (1/2) of a shard's KV cells, so a single open cannot take a
	// whole hop (HopConfig.MaxSessionKV overrides it).
	DefaultSessionKVDivisor = 2
	// DefaultPeerShareDivisor: at every position of a route, one origin
	// (authenticated by its signature on the open) may hold at most this
	// fraction (1/2, at least one session) of the shard's session slots and
	// of its KV cells at once, so one client cannot starve the others
	// (HopConfig.MaxSessionsPerPeer / MaxKVPerPeer).
	DefaultPeerShareDivisor = 2
	// DefaultSilenceBackoff is how long a hop refuses an origin's new
	// sessions after one of them reserved a slot and sent nothing (its
	// first-frame timeout fired, or it was closed unstarted after half of
	// it); each further silent session doubles it, up to
	// DefaultSilenceBackoffMax, and each session that sent frames takes one
	// doubling back. Squatting a hop with sessions that never start then
	// holds it for one first-frame timeout per identity and a shrinking
	// share of the time after (docs/limits.md).
	DefaultSilenceBackoff    = 10 * time.Second
	DefaultSilenceBackoffMax = 10 * time.Minute
	// OpenMaxAge is how old a signed SessionOpen may be (plus
	// route.DefaultClockSkew) when a hop admits it: far more than a
	// route's admission takes, short enough that the hop can remember
	// every open it admitted until then and refuse a replay.
	OpenMaxAge = 2 * time.Minute
	// DefaultMaxOpenMemory bounds the fresh opens one hop remembers against
	// replay (as DefaultMaxTicketNonces: full means a flood, and new opens
	// are refused with NO_CAPACITY rather than old ones forgotten).
	DefaultMaxOpenMemory = 1 << 16
	// DefaultMaxOpensPerOrigin bounds the fresh opens one origin (not a
	// trusted one) may have admitted on a hop: about 27 a second over
	// OpenMaxAge plus skew, far above one client's sessions, so filling
	// DefaultMaxOpenMemory takes 16 identities that each complete that many
	// admissions.
	DefaultMaxOpensPerOrigin = 1 << 12
	// FirstFrameMaxPayload is the payload limit of the first frame of a
	// session or ring stream (SessionOpen, ring hello): none is allowed;
	// 1 is the smallest limit frame.Limits expresses (0 means the
	// default). Activation-sized frames are read only after the open's
	// kind and sender were checked.
	FirstFrameMaxPayload = 1
	// FailWriteTimeout bounds the error report a failing hop sends.
	FailWriteTimeout = 2 * time.Second
	// RingGrace is how long a head whose ring ended without a word waits
	// for a more specific report (its downstream watcher) before blaming
	// the tail.
	RingGrace = time.Second
	// DecodeWindow is how many recent single-row steps the advertised
	// speed covers (their minimum: what the shard can do; load is
	// advertised separately as capacity).
	DecodeWindow = 32
	// PeerAddrTTL is how long addresses learnt from a route stay in the
	// peerstore (longer than a session's admission, shorter than forever).
	PeerAddrTTL = 2 * time.Minute
	// MaxRouteAddrs and MaxRouteAddrLen bound the addresses a route may
	// hand a hop for one peer (an advert carries at most 32 of 256 bytes;
	// a route names the few that matter), so a hostile origin cannot fill
	// the peerstore or make hops dial long lists of chosen addresses.
	MaxRouteAddrs   = 8
	MaxRouteAddrLen = 256
	// RouteProtectTag protects connections to route neighbours from the
	// connection manager while a seam is open.
	RouteProtectTag = "route"

	// DefaultTokenTimeout is how long the origin waits for each token: more
	// than a hop's idle time, so a stalled hop is reported by its
	// neighbour, which can name it, before the origin can only blame the
	// head.
	DefaultTokenTimeout = 90 * time.Second
	// PrefillRowsPerTokenTimeout: the first token of an epoch waits one
	// more TokenTimeout per this many prompt rows (the prefill), and at
	// least TokenTimeout plus three times the route's prefill work (the
	// longest a hop waits, waits.go).
	PrefillRowsPerTokenTimeout = 1024
	// DialTimeout bounds opening the session stream to the head.
	DialTimeout = 30 * time.Second
	// DefaultMaxReroutes bounds recovery attempts per generation.
	DefaultMaxReroutes = 4
	// DefaultChunk is the prefill chunk size in rows: hops overlap chunks.
	DefaultChunk = 128
	// FirstChunkRows is the size of the prefill's first chunk: one row
	// reaches every hop in about a decode step's time, however long the
	// prompt and slow the hops, so the hops' first-frame waits (which free
	// sessions that reserve a route and send nothing, and so stay short:
	// at most Idle) never wait for a prompt's worth of work.
	FirstChunkRows = 1
	// DefaultMaxTokens is a generation's length when none is asked.
	DefaultMaxTokens = 128
	// DefaultRouteWait bounds how long a re-route waits for a replacement
	// peer to appear (its advert may be one republish away) before the
	// error names the missing layers.
	DefaultRouteWait = 15 * time.Second
	// RoutePollInterval is how often a waiting re-route plans again.
	RoutePollInterval = 500 * time.Millisecond
	// DefaultCapacityWait bounds how long the origin keeps retrying a
	// route refused with NO_CAPACITY (a full hop is not a failed hop: it is
	// never excluded, only avoided for one plan when a replica exists). It
	// covers a dead epoch whose cells a loaded hop frees late, and a
	// later hop that keeps the old epoch until it notices its upstream is
	// gone, and outlasts one round of squatting at any position: silent
	// sessions hold a hop's slots for at most its first-frame wait (≤
	// DefaultIdle, 60 s) before their origins back off (DefaultSilenceBackoff).
	DefaultCapacityWait = 75 * time.Second
	// CapacityRetryMin and CapacityRetryMax bound the backoff between
	// capacity retries (doubling from the first to the second); a
	// refusal's retry_after_ms is honoured within them.
	CapacityRetryMin = 250 * time.Millisecond
	CapacityRetryMax = 2 * time.Second
)

// Defaults of the origin's failure memory, the hop's ranges and ticket
// admission.
const (
	// DefaultFailureTTL is how long a peer blamed for a failed generation
	// is avoided by later generations of the same node or gateway: long
	// enough that a peer which fails every session (one that claims every
	// layer and cannot serve them wins every plan on hop count) captures
	// one generation, not each; short enough that a peer that crashed and
	// came back is used again soon.
	DefaultFailureTTL = 10 * time.Minute
	// DefaultFailurePeers bounds the peers a FailureMemory holds (when
	// full, the one whose avoidance ends first is forgotten): as the
	// advert table, far above any real swarm.
	DefaultFailurePeers = 4096
	// MovedGrace is how long a hop answers opens for a range it moved away
	// from with NO_CAPACITY (retried elsewhere, never held against it)
	// rather than RANGE_MISMATCH (which blames it): an origin's table may
	// still hold the old advert for a moment.
	MovedGrace = time.Minute
	// DefaultMaxTicketNonces bounds the nonces one hop remembers. Each
	// entry lives until its ticket expires (TTL + clock skew, 2.5 min by
	// default): 65536 is hundreds of admissions a second, far more than a
	// hop's sessions, so only a flood of tickets (which the tracker
	// rate-limits) fills it; then new tickets are refused (NO_CAPACITY,
	// retryable) rather than old nonces forgotten, which would let them be
	// replayed.
	DefaultMaxTicketNonces = 1 << 16
)

// WriteDeadline is the deadline of a data write on a seam for a hop idle
// timeout.
func WriteDeadline(idle time.Duration) time.Duration { return idle / WriteDeadlineDivisor }

// CheckTimeoutLadder reports whether the timeouts are ordered so that the
// most specific failure report wins (see the constants above).
func CheckTimeoutLadder(idle, tokenTimeout time.Duration) error {
	switch w := WriteDeadline(idle); {
	case FailWriteTimeout >= w:
		return fmt.Errorf("session: fail-report write timeout %s must be below the seam write deadline %s", FailWriteTimeout, w)
	case w >= idle:
		return fmt.Errorf("session: seam write deadline %s must be below the hop idle timeout %s", w, idle)
	case DefaultFirstFrame >= idle:
		return fmt.Errorf("session: first-frame timeout %s must be below the hop idle timeout %s", DefaultFirstFrame, idle)
	case idle >= tokenTimeout:
		return fmt.Errorf("session: hop idle timeout %s must be below the origin token timeout %s", idle, tokenTimeout)
	}
	return nil
}
