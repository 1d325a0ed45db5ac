package session

import (
	"slices"
	"strings"
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
	// convicts are peers an audit proved wrong (Convict): never routed
	// through again by this memory's origins (hard, unlike until).
	convicts map[peer.ID]bool
}

// DefaultMaxConvicts bounds the convicted peers one memory holds (the
// oldest conviction is forgotten first beyond it).
const DefaultMaxConvicts = 1024

// Convict records that an audit proved p returned wrong activations: the
// origins sharing this memory never route through p again.
func (m *FailureMemory) Convict(p peer.ID) {
	if m == nil || p == "" {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.convicts == nil {
		m.convicts = map[peer.ID]bool{}
	}
	if len(m.convicts) >= DefaultMaxConvicts {
		for q := range m.convicts { // any: the bound is a memory bound, not a policy
			delete(m.convicts, q)
			break
		}
	}
	m.convicts[p] = true
}

// Convicted reports whether an audit convicted p.
func (m *FailureMemory) Convicted(p peer.ID) bool {
	if m == nil {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.convicts[p]
}

// Convicts lists the convicted peers, sorted: what a short-lived client
// saves so its next runs never route through them either (a conviction
// never ends; DefaultMaxConvicts bounds how many are kept).
func (m *FailureMemory) Convicts() []peer.ID {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]peer.ID, 0, len(m.convicts))
	for p := range m.convicts {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// convicted is a fresh exclusion set holding the convicted peers.
func (m *FailureMemory) convicted() map[peer.ID]bool {
	out := map[peer.ID]bool{}
	if m == nil {
		return out
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for p := range m.convicts {
		out[p] = true
	}
	return out
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

// FailureEntry is one remembered peer and when its avoidance ends: what
// Snapshot returns and Restore takes, so a short-lived client can keep
// its memory between runs (the file lives outside this package, which
// does no file I/O: cmd/meshp2p's failure file).
type FailureEntry struct {
	Peer  peer.ID
	Until time.Time
}

// Snapshot returns the peers avoided now with the end of their avoidance,
// the latest-ending first.
func (m *FailureMemory) Snapshot() []FailureEntry {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.expire(m.now())
	out := make([]FailureEntry, 0, len(m.until))
	for p, t := range m.until {
		out = append(out, FailureEntry{Peer: p, Until: t})
	}
	sortFailures(out)
	return out
}

// Restore merges entries (e.g. a Snapshot saved by an earlier run) into
// the memory: an entry already ended is dropped, one ending beyond the
// TTL from now (a clock set back, a hand-edited file) ends at the TTL,
// and a peer held both ways keeps the later end. The max bound holds: the
// entries whose avoidance ends first go.
func (m *FailureMemory) Restore(entries []FailureEntry) {
	if m == nil || len(entries) == 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	m.expire(now)
	limit := now.Add(m.ttl)
	for _, e := range entries {
		if e.Peer == "" || !now.Before(e.Until) {
			continue
		}
		t := e.Until
		if t.After(limit) {
			t = limit
		}
		if old, ok := m.until[e.Peer]; !ok || t.After(old) {
			m.until[e.Peer] = t
		}
	}
	if len(m.until) <= m.max {
		return
	}
	all := make([]FailureEntry, 0, len(m.until))
	for p, t := range m.until {
		all = append(all, FailureEntry{Peer: p, Until: t})
	}
	sortFailures(all)
	for _, e := range all[m.max:] {
		delete(m.until, e.Peer)
	}
}

// sortFailures orders entries latest-ending first (ties by peer), the
// order in which the bound keeps them.
func sortFailures(entries []FailureEntry) {
	slices.SortFunc(entries, func(a, b FailureEntry) int {
		if c := b.Until.Compare(a.Until); c != 0 {
			return c
		}
		return strings.Compare(string(a.Peer), string(b.Peer))
	})
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

// Len is the number of peers held, blamed (some may have just expired)
// or convicted.
func (m *FailureMemory) Len() int {
	if m == nil {
		return 0
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.until) + len(m.convicts)
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
