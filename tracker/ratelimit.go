package tracker

import (
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// rateLimiter is a token bucket per client peer: burst requests at once,
// refilled at rate per second. At most max clients are tracked; beyond
// that full buckets (clients idle long enough to have refilled: forgetting
// them changes nothing) are dropped first, then the least recently seen.
type rateLimiter struct {
	rate, burst float64
	max         int

	mu      sync.Mutex
	buckets map[peer.ID]*bucket
}

type bucket struct {
	tokens float64
	at     time.Time // last refill
}

func newRateLimiter(rate float64, burst, maxClients int) *rateLimiter {
	return &rateLimiter{rate: rate, burst: float64(burst), max: maxClients, buckets: map[peer.ID]*bucket{}}
}

// allow takes one token of p's bucket at now; when none is left it
// returns false and how long until one is.
func (l *rateLimiter) allow(p peer.ID, now time.Time) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.buckets[p]
	if b == nil {
		if len(l.buckets) >= l.max {
			l.evictLocked(now)
		}
		b = &bucket{tokens: l.burst, at: now}
		l.buckets[p] = b
	}
	if dt := now.Sub(b.at); dt > 0 {
		b.tokens = min(l.burst, b.tokens+dt.Seconds()*l.rate)
		b.at = now
	}
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	wait := time.Duration((1 - b.tokens) / l.rate * float64(time.Second))
	return false, max(wait, time.Millisecond)
}

// evictLocked drops every bucket that has refilled by now, or else the
// least recently refilled one.
func (l *rateLimiter) evictLocked(now time.Time) {
	var oldest peer.ID
	var oldestAt time.Time
	for p, b := range l.buckets {
		if b.tokens+now.Sub(b.at).Seconds()*l.rate >= l.burst {
			delete(l.buckets, p)
			continue
		}
		if oldest == "" || b.at.Before(oldestAt) {
			oldest, oldestAt = p, b.at
		}
	}
	if len(l.buckets) >= l.max {
		delete(l.buckets, oldest)
	}
}
