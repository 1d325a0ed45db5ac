package placement

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// ModelLoad is what a node knows of one model when it chooses which model
// to serve (issue 28: placement across models; the demand comes from
// package demand, the rest from adverts).
type ModelLoad struct {
	Fingerprint string
	// Bytes are the whole model's weights: demand is weighed per byte,
	// since a big model takes more nodes per route.
	Bytes int64
	// Demand is requests per second; Unmet the part not served at once
	// (queued plus refused sessions per second).
	Demand, Unmet float64
	// Nodes serve it or are loading it; Routes are its complete routes
	// (of loaded windows); NodesPerRoute is how many nodes one route
	// takes (the model's size over a node's budget; 0: 1).
	Nodes, Routes, NodesPerRoute int
	// IdleFor is how long it has had no demand (0: it has some).
	IdleFor time.Duration
}

// pressure is unmet demand per GiB of weights.
func (m ModelLoad) pressure() float64 {
	return m.Unmet / math.Max(float64(m.Bytes)/(1<<30), 1e-9)
}

// wantNodes is how many nodes the model's demand needs: one route's
// worth while it has none, then as many routes as its demand over what a
// route serves now (measured: the served demand over its routes).
func (m ModelLoad) wantNodes() float64 {
	k := float64(max(1, m.NodesPerRoute))
	if m.Demand <= 0 {
		return 0
	}
	served := m.Demand - m.Unmet
	switch {
	case m.Routes == 0:
		return k
	case served <= 0:
		// Routes exist and serve nothing of the demand measured: more
		// routes need evidence that routes help (served requests), or a
		// report of refusals alone would grow a model without end.
		return k * float64(m.Routes)
	}
	return math.Ceil(m.Demand/(served/float64(m.Routes))) * k
}

// keepNodes is what the model must keep: a route's worth while it is
// needed.
func (m ModelLoad) keepNodes(idle time.Duration) float64 {
	if m.needed(idle) && m.Routes > 0 {
		return float64(max(1, m.NodesPerRoute))
	}
	return 0
}

// needed reports whether the model must keep what it has: it has demand,
// or had some less than idle ago.
func (m ModelLoad) needed(idle time.Duration) bool { return m.Demand > 0 || m.IdleFor < idle }

// ModelRules shape ChooseModel; zero fields take the defaults.
type ModelRules struct {
	// Hysteresis: a node leaves its model only for one whose pressure is
	// at least (1+Hysteresis) times its own (DefaultModelHysteresis).
	Hysteresis float64
	// IdleRelease: a model without demand keeps its last route this long
	// (DefaultIdleRelease).
	IdleRelease time.Duration
}

// Defaults of ModelRules.
const (
	DefaultModelHysteresis = 0.5
	DefaultIdleRelease     = 30 * time.Minute
)

// IdleReleaseOrDefault is IdleRelease, or DefaultIdleRelease when unset.
func (r ModelRules) IdleReleaseOrDefault() time.Duration { return r.withDefaults().IdleRelease }

func (r ModelRules) withDefaults() ModelRules {
	if r.Hysteresis <= 0 {
		r.Hysteresis = DefaultModelHysteresis
	}
	if r.IdleRelease <= 0 {
		r.IdleRelease = DefaultIdleRelease
	}
	return r
}

// ModelChoice is ChooseModel's answer.
type ModelChoice struct {
	// Target is the model to serve ("" : none); Target == the current
	// model means stay.
	Target string
	// Move is the probability with which the node should act on a move
	// (the swarm's deficit over the nodes that could fill it), so that a
	// thousand nodes seeing the same view do not all jump at once.
	Move float64
	Why  string
}

// ChooseModel is the cross-model rule for a node serving cur ("" : a
// standby node serving nothing), given every model's load and how many
// standby nodes there are:
//   - a model that is requested and has no route comes first: a standby
//     node promotes itself to serve it ("warming"), a serving node moves
//     to it if its own model keeps a route without it;
//   - never uncover the last route of a model that has demand, or had
//     some within IdleRelease;
//   - otherwise move toward the model with the most unmet demand per byte
//     of weights, only when it beats the current model's by the
//     hysteresis;
//   - Move spreads the decision: the nodes the swarm lacks (wanted by
//     demand, not yet serving or loading) over the nodes that could
//     supply them (standby, and beyond what their models want or must
//     keep), so a thousand nodes seeing one view do not all jump at once.
func ChooseModel(cur string, models []ModelLoad, standby int, rules ModelRules) ModelChoice {
	r := rules.withDefaults()
	ms := slices.Clone(models)
	// Deterministic order: most pressing first, fingerprint to break ties.
	slices.SortFunc(ms, func(a, b ModelLoad) int {
		if ua, ub := a.Demand > 0 && a.Routes == 0, b.Demand > 0 && b.Routes == 0; ua != ub {
			if ua {
				return -1
			}
			return 1
		}
		if pa, pb := a.pressure(), b.pressure(); pa != pb {
			if pa > pb {
				return -1
			}
			return 1
		}
		switch {
		case a.Fingerprint < b.Fingerprint:
			return -1
		case a.Fingerprint > b.Fingerprint:
			return 1
		}
		return 0
	})
	var own *ModelLoad
	for i := range ms {
		if ms[i].Fingerprint == cur {
			own = &ms[i]
		}
	}
	stay := ModelChoice{Target: cur}
	if own != nil && own.Routes <= 1 && own.needed(r.IdleRelease) {
		stay.Why = fmt.Sprintf("%.16s has %d route(s) and demand: never uncovered", cur, own.Routes)
		return stay
	}
	deficit, surplus := 0.0, float64(standby)
	for _, m := range ms {
		want := m.wantNodes()
		deficit += math.Max(0, want-float64(m.Nodes))
		surplus += math.Max(0, float64(m.Nodes)-math.Max(want, m.keepNodes(r.IdleRelease)))
	}
	var t *ModelLoad
	for i := range ms {
		if ms[i].Fingerprint != cur && ms[i].Demand > 0 && float64(ms[i].Nodes) < ms[i].wantNodes() {
			t = &ms[i]
			break
		}
	}
	if t == nil || deficit == 0 {
		stay.Why = "no model lacks capacity"
		return stay
	}
	if surplus == 0 {
		// Nobody is spare: the nodes that could move are those whose
		// model keeps a route without them.
		for _, m := range ms {
			if m.Routes > 1 {
				surplus += float64(m.Nodes) - float64(max(1, m.NodesPerRoute))
			}
		}
	}
	move := 1.0
	if surplus > 0 {
		move = math.Min(1, deficit/surplus)
	}
	switch {
	case cur == "":
		return ModelChoice{Target: t.Fingerprint, Move: move, Why: fmt.Sprintf("standby: %.16s is asked for (%.2f/s unmet, %d routes)", t.Fingerprint, t.Unmet, t.Routes)}
	case t.Routes == 0:
		return ModelChoice{Target: t.Fingerprint, Move: move, Why: fmt.Sprintf("%.16s is asked for and has no route", t.Fingerprint)}
	case own != nil && own.needed(r.IdleRelease) && float64(own.Nodes) <= own.wantNodes():
		// Our own model needs us too: only a clearly hungrier one wins.
		if t.pressure() < (1+r.Hysteresis)*own.pressure() || own.pressure() == 0 && t.pressure() == 0 {
			stay.Why = fmt.Sprintf("%.16s's unmet demand per GiB (%.3g) does not beat this model's (%.3g) by %.0f%%", t.Fingerprint, t.pressure(), own.pressure(), 100*r.Hysteresis)
			return stay
		}
	}
	return ModelChoice{Target: t.Fingerprint, Move: move, Why: fmt.Sprintf("%.16s has the most unmet demand per GiB (%.3g)", t.Fingerprint, t.pressure())}
}
