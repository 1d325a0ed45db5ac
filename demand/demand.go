// Package demand keeps a swarm's demand per model (issue 28: placement
// that follows demand): what origins, gateways and heads measure where
// requests happen — requests, sessions queued and refused (NO_CAPACITY),
// tokens per second served — merged from the reports of many authors as
// gossip brings them, bounded and decaying. It is pure Go (no network,
// no cgo); the node gossips reports and placement reads the merged map.
//
// Trust rule: an author can only replace its own report. Its rates are
// capped per model (Config.MaxRate), its reports rate-limited
// (Config.MinInterval) and of bounded size (Config.MaxModels), and the map
// holds at most Config.MaxAuthors authors, refusing new ones while full
// (a flood of fresh identities cannot push out those counted). So a
// hostile peer can add at most MaxRate of demand to a model and cannot
// lower anyone else's: it cannot make the swarm abandon a model that
// others ask for.
package demand

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"time"
)

// Errors Add returns; callers drop the report (and may count the author).
var (
	ErrTooSoon  = errors.New("demand: report too soon after the author's last")
	ErrTooLarge = errors.New("demand: report names too many models")
	ErrBadValue = errors.New("demand: report has a bad value")
	ErrStale    = errors.New("demand: report too old or from the future")
	ErrFull     = errors.New("demand: no room for another author")
)

// Sample is one model's demand as one author measured it over its last
// report window, all per second.
type Sample struct {
	Requests     float64 // generations asked for
	Queued       float64 // sessions that waited for a route or a slot
	Refused      float64 // sessions refused for lack of capacity (NO_CAPACITY)
	TokensPerSec float64 // tokens served
}

// Unmet is the part of the demand the swarm did not serve at once:
// queued plus refused sessions per second.
func (s Sample) Unmet() float64 { return s.Queued + s.Refused }

func (s Sample) add(o Sample, w float64) Sample {
	return Sample{s.Requests + w*o.Requests, s.Queued + w*o.Queued, s.Refused + w*o.Refused, s.TokensPerSec + w*o.TokensPerSec}
}

// Report is one author's demand for the models it saw.
type Report struct {
	Author string // peer id of the signer (gossip checks the signature)
	At     time.Time
	Models map[string]Sample // by model fingerprint
}

// Config bounds and shapes the map; zero fields take the defaults.
type Config struct {
	// TTL: a report older than this counts for nothing (DefaultTTL).
	TTL time.Duration
	// HalfLife: a report's weight halves every HalfLife of age
	// (DefaultHalfLife), so demand moves within a few half-lives.
	HalfLife time.Duration
	// MinInterval: an author's reports closer together are refused
	// (DefaultMinInterval).
	MinInterval time.Duration
	// MaxModels bounds the models of one report (DefaultMaxModels).
	MaxModels int
	// MaxAuthors bounds the authors kept (DefaultMaxAuthors): a new
	// author is refused while the map is full (expired ones make room).
	MaxAuthors int
	// MaxRate caps each of an author's per-model rates (DefaultMaxRate,
	// per second): a liar adds at most this much to a model.
	MaxRate float64
	// MaxSkew bounds how far in the future a report's time may be
	// (DefaultMaxSkew).
	MaxSkew time.Duration
}

// Defaults of Config.
const (
	DefaultTTL         = 5 * time.Minute
	DefaultHalfLife    = time.Minute
	DefaultMinInterval = 5 * time.Second
	DefaultMaxModels   = 64
	DefaultMaxAuthors  = 4096
	DefaultMaxRate     = 50
	DefaultMaxSkew     = 30 * time.Second
)

func (c Config) withDefaults() Config {
	if c.TTL <= 0 {
		c.TTL = DefaultTTL
	}
	if c.HalfLife <= 0 {
		c.HalfLife = DefaultHalfLife
	}
	if c.MinInterval <= 0 {
		c.MinInterval = DefaultMinInterval
	}
	if c.MaxModels <= 0 {
		c.MaxModels = DefaultMaxModels
	}
	if c.MaxAuthors <= 0 {
		c.MaxAuthors = DefaultMaxAuthors
	}
	if c.MaxRate <= 0 {
		c.MaxRate = DefaultMaxRate
	}
	if c.MaxSkew <= 0 {
		c.MaxSkew = DefaultMaxSkew
	}
	return c
}

// Map merges reports. It is safe for concurrent use.
type Map struct {
	cfg     Config
	mu      sync.Mutex
	authors map[string]Report // each author's latest accepted report
}

// New returns an empty map.
func New(cfg Config) *Map {
	return &Map{cfg: cfg.withDefaults(), authors: map[string]Report{}}
}

// Add takes r as its author's report at now, replacing the author's
// previous one, after the bounds: size, values, time and rate. Rates
// over MaxRate are capped, not refused.
func (m *Map) Add(now time.Time, r Report) error {
	c := m.cfg
	if len(r.Models) > c.MaxModels {
		return fmt.Errorf("%w: %d models (at most %d)", ErrTooLarge, len(r.Models), c.MaxModels)
	}
	if age := now.Sub(r.At); age > c.TTL || age < -c.MaxSkew {
		return fmt.Errorf("%w: made %v ago", ErrStale, age.Round(time.Millisecond))
	}
	models := make(map[string]Sample, len(r.Models))
	for fp, s := range r.Models {
		for _, v := range []float64{s.Requests, s.Queued, s.Refused, s.TokensPerSec} {
			if math.IsNaN(v) || v < 0 {
				return fmt.Errorf("%w: model %.16s: %v", ErrBadValue, fp, v)
			}
		}
		capTo := func(v float64) float64 { return min(v, c.MaxRate) }
		// Tokens per second are bounded by what one author can serve,
		// not by requests: capped at MaxRate × 1000 tokens per request.
		// Queued and refused requests are requests: together they are at
		// most the author's requests (a report claiming more unmet demand
		// than demand would make its model look starved forever).
		req := capTo(s.Requests)
		queued := min(capTo(s.Queued), req)
		refused := min(capTo(s.Refused), req-queued)
		models[fp] = Sample{req, queued, refused, min(s.TokensPerSec, c.MaxRate*1000)}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if prev, ok := m.authors[r.Author]; ok && r.At.Sub(prev.At) < c.MinInterval {
		return fmt.Errorf("%w: %v after the last (at least %v)", ErrTooSoon, r.At.Sub(prev.At).Round(time.Millisecond), c.MinInterval)
	}
	if _, ok := m.authors[r.Author]; !ok && len(m.authors) >= c.MaxAuthors {
		m.expireLocked(now)
		if len(m.authors) >= c.MaxAuthors {
			// Refused, not evicting: identities are cheap, and a flood of
			// new ones must not push out the authors already counted.
			return fmt.Errorf("%w: %d authors", ErrFull, len(m.authors))
		}
	}
	m.authors[r.Author] = Report{Author: r.Author, At: r.At, Models: models}
	return nil
}

// expireLocked drops the authors whose report is past the TTL.
func (m *Map) expireLocked(now time.Time) {
	for a, r := range m.authors {
		if now.Sub(r.At) > m.cfg.TTL {
			delete(m.authors, a)
		}
	}
}

// weight is a report's weight at age: 1 when fresh, halving every
// HalfLife, 0 past the TTL.
func (m *Map) weight(age time.Duration) float64 {
	if age > m.cfg.TTL {
		return 0
	}
	if age < 0 {
		age = 0
	}
	return math.Exp2(-age.Seconds() / m.cfg.HalfLife.Seconds())
}

// Demand is every model's demand at now: the authors' reports summed,
// each weighted by its age.
func (m *Map) Demand(now time.Time) map[string]Sample {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]Sample{}
	for a, r := range m.authors {
		w := m.weight(now.Sub(r.At))
		if w == 0 {
			delete(m.authors, a)
			continue
		}
		for fp, s := range r.Models {
			out[fp] = out[fp].add(s, w)
		}
	}
	return out
}

// Authors is how many authors' reports the map holds.
func (m *Map) Authors() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.authors)
}
