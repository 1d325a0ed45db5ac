package session

import (
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// Grammar time is budgeted per origin over time, not only per session
// (engine.MaxGrammarTime): a tail charges each session's grammar time to
// the origin that signed it when the session ends, and refuses an origin
// in debt new sessions that carry a grammar until the budget refills. One
// origin re-opening sessions with a costly grammar (issue 37, row 2: 17–27×
// slower honest runs) gets DefaultGrammarBudget at once and then
// DefaultGrammarRefill of tail time per minute; other origins are not
// charged for it.
const (
	// DefaultGrammarBudget is an origin's grammar time before it is
	// refused: two sessions at the per-session cap. JSON-schema grammars
	// take milliseconds per token.
	DefaultGrammarBudget = 10 * time.Second
	// DefaultGrammarRefill is how much budget comes back per minute (5%
	// of one core).
	DefaultGrammarRefill = 3 * time.Second
)

// grammarBudget is the per-origin accounting. Bounded: past capacity
// origins, the one with the most budget left (the least interesting) is
// forgotten.
type grammarBudget struct {
	budget, refill time.Duration // refill per minute
	cap            int
	now            func() time.Time

	mu sync.Mutex
	m  map[peer.ID]grammarAccount
}

type grammarAccount struct {
	left time.Duration // may go below zero: debt
	at   time.Time
}

func newGrammarBudget(budget, refill time.Duration, capacity int, now func() time.Time) *grammarBudget {
	if now == nil {
		now = time.Now
	}
	return &grammarBudget{budget: budget, refill: refill, cap: capacity, now: now, m: map[peer.ID]grammarAccount{}}
}

// account is origin's account refilled to now (g.mu held).
func (g *grammarBudget) account(origin peer.ID, now time.Time) grammarAccount {
	a, ok := g.m[origin]
	if !ok {
		return grammarAccount{left: g.budget, at: now}
	}
	a.left = min(g.budget, a.left+time.Duration(float64(g.refill)*now.Sub(a.at).Minutes()))
	a.at = now
	return a
}

// blocked is how long until origin may open a session with a grammar (0:
// now).
func (g *grammarBudget) blocked(origin peer.ID) time.Duration {
	now := g.now()
	g.mu.Lock()
	defer g.mu.Unlock()
	a := g.account(origin, now)
	switch {
	case a.left > 0:
		return 0
	case g.refill <= 0:
		return time.Hour
	}
	return time.Duration(float64(-a.left)/float64(g.refill)*float64(time.Minute)) + time.Second
}

// charge takes spent from origin's budget.
func (g *grammarBudget) charge(origin peer.ID, spent time.Duration) {
	if spent <= 0 {
		return
	}
	now := g.now()
	g.mu.Lock()
	defer g.mu.Unlock()
	a := g.account(origin, now)
	a.left -= spent
	if _, ok := g.m[origin]; !ok && len(g.m) >= g.cap {
		var richest peer.ID
		best := time.Duration(-1 << 62)
		for p := range g.m {
			if l := g.account(p, now).left; l > best {
				richest, best = p, l
			}
		}
		delete(g.m, richest)
	}
	g.m[origin] = a
}
