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
	PeerAddrTTL = 10 * time.Minute
	// RouteProtectTag protects connections to route neighbours from the
	// connection manager while a seam is open.
	RouteProtectTag = "route"

	// DefaultTokenTimeout is how long the origin waits for each token: more
	// than a hop's idle time, so a stalled hop is reported by its
	// neighbour, which can name it, before the origin can only blame the
	// head.
	DefaultTokenTimeout = 90 * time.Second
	// PrefillRowsPerTokenTimeout: the first token waits one more
	// TokenTimeout per this many prompt rows (the prefill).
	PrefillRowsPerTokenTimeout = 1024
	// DialTimeout bounds opening the session stream to the head.
	DialTimeout = 30 * time.Second
	// DefaultMaxReroutes bounds recovery attempts per generation.
	DefaultMaxReroutes = 4
	// DefaultChunk is the prefill chunk size in rows: hops overlap chunks.
	DefaultChunk = 128
	// DefaultMaxTokens is a generation's length when none is asked.
	DefaultMaxTokens = 128
	// DefaultRouteWait bounds how long a re-route waits for a replacement
	// peer to appear (its advert may be one republish away) before the
	// error names the missing layers.
	DefaultRouteWait = 15 * time.Second
	// RoutePollInterval is how often a waiting re-route plans again.
	RoutePollInterval = 500 * time.Millisecond
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
	case idle >= tokenTimeout:
		return fmt.Errorf("session: hop idle timeout %s must be below the origin token timeout %s", idle, tokenTimeout)
	}
	return nil
}
