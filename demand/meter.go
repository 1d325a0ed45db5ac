package demand

import (
	"slices"
	"sync"
	"time"
)

// Meter counts the demand this peer sees where requests happen (an
// origin: a gateway, a CLI client, a node generating) and turns it into a
// Report per window. It is safe for concurrent use.
type Meter struct {
	mu     sync.Mutex
	since  time.Time
	counts map[string]*count
}

type count struct{ requests, queued, refused, tokens float64 }

// NewMeter returns a meter counting from now.
func NewMeter(now time.Time) *Meter { return &Meter{since: now, counts: map[string]*count{}} }

func (m *Meter) get(fp string) *count {
	c := m.counts[fp]
	if c == nil {
		if len(m.counts) >= 4*DefaultMaxModels {
			return &count{} // bounded: the surplus is not counted
		}
		c = &count{}
		m.counts[fp] = c
	}
	return c
}

// Request counts a generation asked for model fp.
func (m *Meter) Request(fp string) { m.add(fp, func(c *count) { c.requests++ }) }

// Queued counts a generation that waited for a route or a slot.
func (m *Meter) Queued(fp string) { m.add(fp, func(c *count) { c.queued++ }) }

// Refused counts a generation refused for lack of a route, of capacity,
// or because the model is still warming.
func (m *Meter) Refused(fp string) { m.add(fp, func(c *count) { c.refused++ }) }

// Tokens counts n tokens generated for model fp.
func (m *Meter) Tokens(fp string, n int) { m.add(fp, func(c *count) { c.tokens += float64(n) }) }

func (m *Meter) add(fp string, f func(*count)) {
	if m == nil || fp == "" {
		return
	}
	m.mu.Lock()
	f(m.get(fp))
	m.mu.Unlock()
}

// Take is the window since the last Take (or NewMeter) as a report at
// now, in rates per second, and starts a new window. It keeps the
// DefaultMaxModels models with the most requests (a report names no
// more). ok is false when nothing was counted.
func (m *Meter) Take(now time.Time, author string) (r Report, ok bool) {
	m.mu.Lock()
	counts, since := m.counts, m.since
	m.counts, m.since = map[string]*count{}, now
	m.mu.Unlock()
	secs := now.Sub(since).Seconds()
	if len(counts) == 0 || secs <= 0 {
		return Report{}, false
	}
	fps := make([]string, 0, len(counts))
	for fp := range counts {
		fps = append(fps, fp)
	}
	slices.SortFunc(fps, func(a, b string) int {
		ra, rb := counts[a].requests, counts[b].requests
		switch {
		case ra > rb:
			return -1
		case ra < rb:
			return 1
		}
		return 0
	})
	r = Report{Author: author, At: now, Models: map[string]Sample{}}
	for _, fp := range fps[:min(len(fps), DefaultMaxModels)] {
		c := counts[fp]
		r.Models[fp] = Sample{Requests: c.requests / secs, Queued: c.queued / secs, Refused: c.refused / secs, TokensPerSec: c.tokens / secs}
	}
	return r, true
}
