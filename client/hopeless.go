package client

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/neuron-tai/meshp2p/route"
)

// Failing fast: once the swarm's adverts are in (p2p.Discovery.Settle),
// a generation that waits for its route (Request.WaitForRoute) fails at
// once when waiting will not change the answer: nobody serves or offers
// the model asked for, or nobody serves some of its layers. It keeps
// waiting while a node is still choosing its layers (route.Choosing), and
// for layers of a model that nodes placing themselves serve: either may
// fill the gap. Nodes given their layers load them before they join, so
// one still loading is not in the swarm to be seen.

// hopeless is the error to fail with at once, the adverts being in, for
// routable's err on model; nil: keep waiting.
func (c *Client) hopeless(model string, err error) error {
	if err == nil || c.nodesChoosing() {
		return nil
	}
	var gap *gapError
	switch {
	case errors.As(err, &gap):
		if c.selfPlacing(gap.err.Fingerprint) {
			return nil // they move to layers nobody serves (docs/placement.md)
		}
		return err
	case errors.Is(err, route.ErrUnknownModel) && !errors.Is(err, route.ErrAmbiguousModel):
		if _, ferr := c.cfg.Table.Fingerprint(model); ferr == nil {
			return nil // known: the peers' vote on its layers, say, is still out
		}
		return c.notFound(model, err, "")
	}
	return nil
}

// selfPlacing reports whether a node serving model fp chooses its own
// layers (it advertises a placement budget): the swarm may yet fill a gap.
func (c *Client) selfPlacing(fp string) bool {
	for _, s := range c.cfg.Table.Shards(fp) {
		if s.PlacementBudget > 0 {
			return true
		}
	}
	return false
}

// nodesChoosing reports whether some peer serves layers but advertises
// none yet (a node placing itself, about to announce its window).
func (c *Client) nodesChoosing() bool {
	for _, a := range c.cfg.Swarm.Discovery().Adverts() {
		if route.Choosing(a) {
			return true
		}
	}
	return false
}

// notFound is ErrModelNotFound for model (err: the table's, which it
// wraps too), saying what the swarm serves and the nearest name to the
// one asked for. waited is the wait it ends ("": none).
func (c *Client) notFound(model string, err error, waited string) error {
	sw := c.cfg.Swarm
	names := c.servedNames()
	served := "nothing"
	if len(names) > 0 {
		served = strings.Join(names, ", ")
	}
	msg := fmt.Sprintf("model %q not found%s: no peer serves or offers it", model, waited)
	if near := nearestName(model, names); near != "" {
		msg += fmt.Sprintf("; did you mean %q?", near)
	}
	msg += fmt.Sprintf(" (the swarm serves: %s; connected to %d peer(s), %d advert(s) seen)", served, sw.PeerCount(), len(sw.Discovery().Adverts()))
	return &notFoundError{msg: msg, err: err}
}

// notFoundError is notFound's error: ErrModelNotFound and the table's.
type notFoundError struct {
	msg string
	err error
}

func (e *notFoundError) Error() string   { return e.msg }
func (e *notFoundError) Unwrap() []error { return []error{ErrModelNotFound, e.err} }

// servedNames are the names of the models peers serve (any layers) or
// offer, sorted; a model without a name by its fingerprint's first 16
// characters.
func (c *Client) servedNames() []string {
	seen := map[string]bool{}
	add := func(name, fp string) {
		if name == "" {
			name = fp[:min(len(fp), route.MinPrefix)]
		}
		seen[name] = true
	}
	for _, s := range c.cfg.Table.Shards("") {
		add(s.ModelName, s.Fingerprint)
	}
	for _, o := range c.cfg.Table.Offers("") {
		add(o.ModelName, o.Fingerprint)
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// nearestName is the name in names closest to want (case aside, by edit
// distance, or one containing the other) when it is close enough to be a
// typo of it: at most a third of its characters apart; "" if none is.
func nearestName(want string, names []string) string {
	w := strings.ToLower(want)
	best, bestD := "", -1
	for _, n := range names {
		l := strings.ToLower(n)
		d := editDistance(w, l)
		if len(w) >= 3 && (strings.Contains(l, w) || strings.Contains(w, l)) {
			d = min(d, 1)
		}
		if d <= max(1, max(len(w), len(l))/3) && (bestD < 0 || d < bestD) {
			best, bestD = n, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance of a and b (bytes).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// gapError: nobody serves some layers of a model; it names them and who
// serves the rest. It wraps the planner's *route.NoRouteError.
type gapError struct {
	model  string
	served []route.Shard // the model's shards, by start layer
	err    *route.NoRouteError
}

func (e *gapError) Error() string {
	var parts []string
	for _, s := range e.served {
		parts = append(parts, fmt.Sprintf("%d-%d by %s", s.Start, s.End, s.Peer))
	}
	served := "nothing"
	if len(parts) > 0 {
		served = strings.Join(parts, ", ")
	}
	return fmt.Sprintf("no node serves layers %d-%d of %d in model %s (served: %s)", e.err.MissingStart, e.err.MissingEnd, e.err.NLayer, e.model, served)
}

func (e *gapError) Unwrap() error { return e.err }

// withServed is err, a planner's error for model fp with nl layers, with
// the shards that are served when it names a gap.
func (c *Client) withServed(fp string, nl int, err error) error {
	var nre *route.NoRouteError
	if !errors.As(err, &nre) || nre.MaxHops > 0 || nre.MissingStart >= nre.MissingEnd {
		return err
	}
	g := &gapError{model: c.modelOf(fp, nl).ID, err: nre}
	for _, s := range c.cfg.Table.Shards(fp) {
		if s.NLayer == nl {
			g.served = append(g.served, s)
		}
	}
	return g
}
