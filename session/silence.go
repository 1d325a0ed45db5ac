package session

import (
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// silenceMemory makes squatting cost the squatter. A session that reserves
// a hop's slot and KV cells and then sends nothing is a strike against its
// (authenticated) origin; each strike refuses that origin's new sessions on
// this hop for twice as long as the last (base, 2·base, … up to max). A
// session that did send frames takes one strike back, and an origin that
// stays clean for max is forgotten. Bounded: when full, the entry whose
// refusal ends first is dropped.
type silenceMemory struct {
	base, max time.Duration
	cap       int
	now       func() time.Time

	mu sync.Mutex
	m  map[peer.ID]silence
}

type silence struct {
	strikes int
	until   time.Time // new sessions refused until then
}

func newSilenceMemory(base, max time.Duration, capacity int, now func() time.Time) *silenceMemory {
	if now == nil {
		now = time.Now
	}
	return &silenceMemory{base: base, max: max, cap: capacity, now: now, m: map[peer.ID]silence{}}
}

// blocked reports how much longer origin's new sessions are refused (0:
// not at all).
func (s *silenceMemory) blocked(origin peer.ID) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.m[origin]
	if !ok {
		return 0
	}
	return max(0, e.until.Sub(s.now()))
}

// strike counts a silent session of origin and returns its new refusal.
func (s *silenceMemory) strike(origin peer.ID) time.Duration {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[origin]
	if now.Sub(e.until) > s.max { // clean for max: a fresh start
		e.strikes = 0
	}
	e.strikes = max(0, e.strikes) + 1
	d := s.base << min(max(0, e.strikes-1), 30)
	if d > s.max || d <= 0 {
		d = s.max
	}
	e.until = now.Add(d)
	if _, ok := s.m[origin]; !ok && len(s.m) >= s.cap {
		s.evict(now)
	}
	s.m[origin] = e
	return d
}

// heard takes one strike back from origin: one of its sessions sent frames.
func (s *silenceMemory) heard(origin peer.ID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.m[origin]
	if !ok {
		return
	}
	if e.strikes = max(0, e.strikes-1); e.strikes == 0 && !s.now().Before(e.until) {
		delete(s.m, origin)
		return
	}
	s.m[origin] = e
}

// evict drops the forgotten entries, or else the one whose refusal ends
// first (s.mu held).
func (s *silenceMemory) evict(now time.Time) {
	var first peer.ID
	for p, e := range s.m {
		if now.Sub(e.until) > s.max {
			delete(s.m, p)
			continue
		}
		if first == "" || e.until.Before(s.m[first].until) {
			first = p
		}
	}
	if len(s.m) >= s.cap && first != "" {
		delete(s.m, first)
	}
}
