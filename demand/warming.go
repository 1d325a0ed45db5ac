package demand

import (
	"fmt"
	"time"
)

// State is what a request for a model without a route gets.
type State int

const (
	// Unknown: nobody serves the model and no node claims it can warm
	// it: a 404.
	Unknown State = iota
	// Serve: the model has a route.
	Serve
	// Warming: standby nodes claim they can load it and it was first
	// asked for less than WarmConfig.Timeout ago: a 503 with
	// Retry-After.
	Warming
	// GaveUp: it was asked for longer than Timeout ago and still has no
	// route: the claims are not believed for Cooldown (a clear error,
	// not endless 503s).
	GaveUp
)

func (s State) String() string {
	return [...]string{"unknown", "serve", "warming", "gave up"}[s]
}

// WarmConfig bounds warming claims; zero fields take the defaults.
type WarmConfig struct {
	// Timeout is how long requests wait for a claimed model to get a
	// route (DefaultWarmTimeout).
	Timeout time.Duration
	// Cooldown is how long the claims for a model that did not warm in
	// time are ignored (DefaultWarmCooldown).
	Cooldown time.Duration
	// RetryAfter is what a Warming answer tells the client
	// (DefaultRetryAfter).
	RetryAfter time.Duration
	// ClaimTTL: a claim not renewed for this long lapses (DefaultClaimTTL).
	ClaimTTL time.Duration
	// MaxClaimsPerAuthor and MaxModels bound the state (DefaultMaxClaims,
	// DefaultMaxWarmModels).
	MaxClaimsPerAuthor, MaxModels int
}

// Defaults of WarmConfig.
const (
	DefaultWarmTimeout   = 5 * time.Minute
	DefaultWarmCooldown  = 30 * time.Minute
	DefaultRetryAfter    = 10 * time.Second
	DefaultClaimTTL      = 5 * time.Minute
	DefaultMaxClaims     = 16
	DefaultMaxWarmModels = 256
)

func (c WarmConfig) withDefaults() WarmConfig {
	if c.Timeout <= 0 {
		c.Timeout = DefaultWarmTimeout
	}
	if c.Cooldown <= 0 {
		c.Cooldown = DefaultWarmCooldown
	}
	if c.RetryAfter <= 0 {
		c.RetryAfter = DefaultRetryAfter
	}
	if c.ClaimTTL <= 0 {
		c.ClaimTTL = DefaultClaimTTL
	}
	if c.MaxClaimsPerAuthor <= 0 {
		c.MaxClaimsPerAuthor = DefaultMaxClaims
	}
	if c.MaxModels <= 0 {
		c.MaxModels = DefaultMaxWarmModels
	}
	return c
}

// Warm tracks which models standby nodes claim they can warm and how
// long requests for each have waited. Not safe for concurrent use (the
// caller holds it under its own lock).
type Warm struct {
	cfg    WarmConfig
	claims map[string]map[string]time.Time // model → author → claimed at
	asked  map[string]time.Time            // model → first unanswered ask
}

// NewWarm returns an empty tracker.
func NewWarm(cfg WarmConfig) *Warm {
	return &Warm{cfg: cfg.withDefaults(), claims: map[string]map[string]time.Time{}, asked: map[string]time.Time{}}
}

// Claim records that author can warm models (its whole claim: earlier
// models it no longer names lapse). Over MaxClaimsPerAuthor models it is
// refused whole.
func (w *Warm) Claim(now time.Time, author string, models []string) error {
	if len(models) > w.cfg.MaxClaimsPerAuthor {
		return fmt.Errorf("%w: %d models claimed warmable (at most %d)", ErrTooLarge, len(models), w.cfg.MaxClaimsPerAuthor)
	}
	for m, as := range w.claims {
		delete(as, author)
		if len(as) == 0 {
			delete(w.claims, m)
		}
	}
	for _, m := range models {
		if w.claims[m] == nil {
			w.expire(now)
			if len(w.claims) >= w.cfg.MaxModels {
				return fmt.Errorf("%w: %d models claimed warmable", ErrFull, len(w.claims))
			}
			w.claims[m] = map[string]time.Time{}
		}
		w.claims[m][author] = now
	}
	return nil
}

func (w *Warm) expire(now time.Time) {
	for m, as := range w.claims {
		for a, at := range as {
			if now.Sub(at) > w.cfg.ClaimTTL {
				delete(as, a)
			}
		}
		if len(as) == 0 {
			delete(w.claims, m)
		}
	}
	for m, at := range w.asked {
		if now.Sub(at) > w.cfg.Timeout+w.cfg.Cooldown {
			delete(w.asked, m)
		}
	}
}

// Config is the tracker's configuration with the defaults filled in.
func (w *Warm) Config() WarmConfig { return w.cfg }

// Waited is how long model has been asked for without a route (0: not
// asked, or served since).
func (w *Warm) Waited(now time.Time, model string) time.Duration {
	if at, ok := w.asked[model]; ok {
		return now.Sub(at)
	}
	return 0
}

// Warmable lists the models with a live claim.
func (w *Warm) Warmable(now time.Time) []string {
	w.expire(now)
	var out []string
	for m := range w.claims {
		out = append(out, m)
	}
	return out
}

// Ask answers a request for model at now (routable: it has a route) and
// for Warming how long the client should wait, by the claims recorded.
func (w *Warm) Ask(now time.Time, model string, routable bool) (State, time.Duration) {
	if routable {
		return w.AskOffered(now, model, true, false)
	}
	w.expire(now)
	return w.AskOffered(now, model, false, len(w.claims[model]) > 0)
}

// AskOffered is Ask for a caller that knows itself whether some peer
// offers the model (a table of bounded, signed adverts) instead of
// recording claims. When MaxModels models are waiting, the one asked for
// longest ago is forgotten to make room (many fake offered models cannot
// shut out a real one).
func (w *Warm) AskOffered(now time.Time, model string, routable, offered bool) (State, time.Duration) {
	if routable {
		delete(w.asked, model)
		return Serve, 0
	}
	first, asked := w.asked[model]
	if asked && now.Sub(first) > w.cfg.Timeout {
		if now.Sub(first) <= w.cfg.Timeout+w.cfg.Cooldown {
			return GaveUp, 0 // until Timeout+Cooldown after the first ask
		}
		delete(w.asked, model)
		asked = false
	}
	if !offered {
		return Unknown, 0
	}
	if !asked {
		if len(w.asked) >= w.cfg.MaxModels {
			oldest, at := "", now
			for m, t := range w.asked {
				if t.Before(at) || oldest == "" {
					oldest, at = m, t
				}
			}
			delete(w.asked, oldest)
		}
		w.asked[model] = now
	}
	return Warming, w.cfg.RetryAfter
}
