package session

import (
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// FailureMemory remembers peers blamed for failed generations, shared by
// every Origin of a node or gateway, so a peer that made one generation
// re-route is avoided by the next ones too instead of capturing each of
// them first. The avoidance is soft: a route through a remembered peer is
// still planned when no other route exists. Safe for concurrent use; a
// nil *FailureMemory remembers nothing.
type FailureMemory struct {
	ttl time.Duration
	max int
	now func() time.Time // tests

	mu    sync.Mutex
	until map[peer.ID]time.Time
}

// NewFailureMemory returns a memory that avoids a blamed peer for ttl
// (DefaultFailureTTL when 0) and holds at most max peers
// (DefaultFailurePeers when 0).
func NewFailureMemory(ttl time.Duration, max int) *FailureMemory {
	if ttl <= 0 {
		ttl = DefaultFailureTTL
	}
	if max <= 0 {
		max = DefaultFailurePeers
	}
	return &FailureMemory{ttl: ttl, max: max, now: time.Now, until: map[peer.ID]time.Time{}}
}

// Blame records that p failed a generation: it is avoided for the TTL from
// now.
func (m *FailureMemory) Blame(p peer.ID) {
	if m == nil || p == "" {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	m.expire(now)
	if _, ok := m.until[p]; !ok && len(m.until) >= m.max {
		var first peer.ID
		for q, t := range m.until {
			if first == "" || t.Before(m.until[first]) {
				first = q
			}
		}
		delete(m.until, first)
	}
	m.until[p] = now.Add(m.ttl)
}

// Avoided reports whether p is being avoided now.
func (m *FailureMemory) Avoided(p peer.ID) bool {
	if m == nil {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	t, ok := m.until[p]
	return ok && m.now().Before(t)
}

// Len is the number of peers held (some may have just expired).
func (m *FailureMemory) Len() int {
	if m == nil {
		return 0
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.until)
}

// avoiding returns exclude plus the peers avoided now, or nil when that
// adds nobody.
func (m *FailureMemory) avoiding(exclude map[peer.ID]bool) map[peer.ID]bool {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.expire(m.now())
	var out map[peer.ID]bool
	for p := range m.until {
		if exclude[p] {
			continue
		}
		if out == nil {
			out = make(map[peer.ID]bool, len(exclude)+len(m.until))
			for q, v := range exclude {
				out[q] = v
			}
		}
		out[p] = true
	}
	return out
}

// expire forgets the peers whose avoidance ended. Called with mu held.
func (m *FailureMemory) expire(now time.Time) {
	for p, t := range m.until {
		if !now.Before(t) {
			delete(m.until, p)
		}
	}
}
