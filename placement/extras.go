package placement

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"
)

// Extra models (docs/placement.md "Many models"): a multi-model node whose
// budget holds its own model whole and more serves other models of its
// catalog whole beside it, on the same hop, when they are asked for and
// short of routes; it releases one after it has had no demand for the idle
// release time. Its own model stays what placement moves and switches; an
// extra is never switched to, and extras are released before a switch
// whose new model would not fit beside them. Extras holds the decisions;
// package node carries them out.

// Extras is a multi-model node's view of its extra models.
type Extras struct {
	// Own is the node's own model; OwnWhole: it serves it whole (extras
	// only beside a whole model, so its window never grows into their
	// memory).
	Own      string
	OwnWhole bool
	// Budget is the node's whole memory budget; Need each model's
	// whole-model memory (Sizing.Need of every layer).
	Budget int64
	Need   map[string]int64
	// Served are the extras served now.
	Served map[string]bool
	// Skip leaves a model out (one that failed lately); nil: none.
	Skip func(fp string) bool
	// IdleRelease is how long an extra without demand is kept
	// (ModelRules.IdleReleaseOrDefault).
	IdleRelease time.Duration
}

// Used is the memory the extras served now take.
func (e Extras) Used() int64 {
	var used int64
	for fp := range e.Served {
		used += e.Need[fp]
	}
	return used
}

// Spare is the budget left beside the own model and the extras.
func (e Extras) Spare() int64 { return e.Budget - e.Need[e.Own] - e.Used() }

// Plan decides which extras to release (no demand for IdleRelease) and
// the one model to load as an extra ("": none): asked for, fitting the
// spare memory, with no route and nobody loading it. Extras warm models;
// more routes of a model that has one come from ChooseModel's switches,
// whose hysteresis and spreading bound them (a liar's refusals cannot make
// every node load a copy). Among candidates, the most unmet demand wins
// (ties: the smaller fingerprint).
func (e Extras) Plan(loads []ModelLoad) (load string, release []string) {
	spare := e.Spare()
	for _, l := range loads {
		if e.Served[l.Fingerprint] && l.Demand == 0 && l.IdleFor >= e.IdleRelease {
			release = append(release, l.Fingerprint)
			spare += e.Need[l.Fingerprint]
		}
	}
	slices.Sort(release)
	if !e.OwnWhole {
		return "", release
	}
	best, bestUnmet := "", -1.0
	for _, l := range loads {
		fp := l.Fingerprint
		if fp == e.Own || e.Served[fp] || (e.Skip != nil && e.Skip(fp)) || l.Demand <= 0 || l.Routes > 0 || l.Nodes > 0 || e.Need[fp] > spare {
			continue
		}
		if l.Unmet > bestUnmet || (l.Unmet == bestUnmet && fp < best) {
			best, bestUnmet = fp, l.Unmet
		}
	}
	return best, release
}

// ErrNoRoom: a switch would need the memory of an extra that holds the
// last route of a model still needed.
var ErrNoRoom = errors.New("switch needs the memory of an extra model still asked for")

// RoomFor lists the extras to release before switching the own model to
// fp, whose whole model must fit beside the extras kept: the least
// recently asked for first, only as many as needed. It refuses (ErrNoRoom)
// when that would release the last route of a model asked for within
// IdleRelease.
func (e Extras) RoomFor(fp string, loads []ModelLoad) ([]string, error) {
	if len(e.Served) == 0 {
		return nil, nil
	}
	room := e.Budget - e.Used()
	want := e.Need[fp]
	byFP := map[string]ModelLoad{}
	for _, l := range loads {
		byFP[l.Fingerprint] = l
	}
	order := slices.Sorted(maps.Keys(e.Served))
	slices.SortStableFunc(order, func(a, b string) int { return cmp.Compare(byFP[b].IdleFor, byFP[a].IdleFor) })
	var release []string
	for _, x := range order {
		if room >= want {
			break
		}
		if l := byFP[x]; l.Routes <= 1 && l.needed(e.IdleRelease) {
			return nil, fmt.Errorf("%w: %.16s", ErrNoRoom, x)
		}
		room += e.Need[x]
		release = append(release, x)
	}
	return release, nil
}
