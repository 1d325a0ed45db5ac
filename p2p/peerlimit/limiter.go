package peerlimit

import (
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"golang.org/x/time/rate"
)

// Limiter is a token bucket per peer: each peer may take burst tokens at
// once, refilled at limit tokens per second, and a refused request takes
// nothing. At most maxPeers peers are tracked (a Table: past it the least
// recently seen peer is forgotten and comes back with a full bucket).
// Times are the caller's (like rate.Limiter.AllowN), so tests choose the
// clock. Safe for concurrent use.
type Limiter struct {
	limit rate.Limit
	burst int

	mu    sync.Mutex
	peers *Table[*rate.Limiter]
}

// NewLimiter returns a limiter of limit tokens per second (rate.Every for
// one per interval; rate.Inf: no limit) with bursts of burst, tracking at
// most maxPeers peers (maxPeers must be positive).
func NewLimiter(limit rate.Limit, burst, maxPeers int) *Limiter {
	return &Limiter{limit: limit, burst: burst, peers: NewTable[*rate.Limiter](maxPeers)}
}

// Allow takes one of p's tokens at now and reports whether there was one.
func (l *Limiter) Allow(p peer.ID, now time.Time) bool {
	ok, _ := l.Take(p, now)
	return ok
}

// Take takes one of p's tokens at now. When there is none it takes nothing
// and returns how long until p has one (> 0; rate.InfDuration if never).
func (l *Limiter) Take(p peer.ID, now time.Time) (ok bool, retryAfter time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b, found := l.peers.Get(p)
	if !found {
		b = rate.NewLimiter(l.limit, l.burst)
		l.peers.Put(p, b)
	}
	if b.AllowN(now, 1) {
		return true, 0
	}
	if l.limit <= 0 || l.burst < 1 {
		return false, rate.InfDuration
	}
	wait := (1 - b.TokensAt(now)) / float64(l.limit) * float64(time.Second)
	if wait >= float64(rate.InfDuration) {
		return false, rate.InfDuration
	}
	return false, max(time.Duration(wait), time.Nanosecond)
}

// Len is the number of peers tracked.
func (l *Limiter) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.peers.Len()
}
