package placement

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"time"
)

// ModelSimConfig is a swarm of nodes serving several models under
// shifting demand, stepped in virtual time: the test bed of ChooseModel
// (docs/placement.md, "Many models").
type ModelSimConfig struct {
	Nodes int
	// ModelBytes are the models' sizes; NodeBudget every node's memory,
	// so a route of model m takes ceil(ModelBytes[m]/NodeBudget) nodes.
	ModelBytes []int64
	NodeBudget int64
	// RouteRate is what one route serves (requests per second).
	RouteRate float64
	// Demand is model m's request rate at t.
	Demand func(m int, t time.Duration) float64
	// Duration, Tick (the step; views lag one tick, as gossip does),
	// CheckEvery (each node's check, jittered), LoadTime (a move's
	// download and load, serving nothing meanwhile).
	Duration, Tick, CheckEvery, LoadTime time.Duration
	Rules                                ModelRules
	Seed                                 uint64
	// Static keeps every node where it started: the baseline.
	Static bool
}

// ModelSimReport is what a run measured.
type ModelSimReport struct {
	// Served is the fraction of all requests served at once.
	Served float64
	// TimeToServe is, per model that went from no demand to demand
	// during the run, how long until it had a route (-1: never).
	TimeToServe map[int]time.Duration
	// MovesPerNodeHour is the moves per node per hour.
	MovesPerNodeHour float64
	// Flaps counts moves back to the model a node left less than an
	// hour before.
	Flaps int
	// LostLastRoute counts ticks in which a model with demand had no
	// route although it had one before.
	LostLastRoute int
}

func (r ModelSimReport) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "served %.1f%% of requests, %.2f moves/node/hour, %d flaps, %d ticks a requested model lost its last route",
		100*r.Served, r.MovesPerNodeHour, r.Flaps, r.LostLastRoute)
	for m, d := range r.TimeToServe {
		if d < 0 {
			fmt.Fprintf(&b, "; model %d never served after its first request", m)
			continue
		}
		fmt.Fprintf(&b, "; model %d served %v after its first request", m, d)
	}
	return b.String()
}

type modelSimNode struct {
	model     int // -1: standby
	loadedAt  time.Duration
	nextCheck time.Duration
	left      map[int]time.Duration // model → when this node left it
}

// SimulateModels runs cfg.
func SimulateModels(cfg ModelSimConfig) ModelSimReport {
	s := newModelSim(cfg)
	for t := time.Duration(0); t < cfg.Duration; t += cfg.Tick {
		loads, loaded, sb := s.loads(t)
		s.serve(t, loads, loaded)
		if s.view == nil {
			s.view, s.standby = loads, sb
		}
		s.move(t)
		s.view, s.standby = loads, sb // the next tick sees this one's state
	}
	return s.report()
}

// modelSim is a run of SimulateModels.
type modelSim struct {
	cfg   ModelSimConfig
	rng   *rand.Rand
	k     []int // nodes per route, per model
	nodes []modelSimNode
	rep   ModelSimReport
	// Per model: when it was first asked for (-1: not yet; 0: from the
	// start), last asked for, and whether it ever had a route.
	firstAsked, lastDemand []time.Duration
	everRouted             []bool
	asked, served          float64 // requests over the run
	moves                  int
	// view and standby are what the nodes see: the previous tick's loads
	// and standby nodes (the first tick: its own), with this tick's moves
	// so far.
	view    []ModelLoad
	standby int
}

// newModelSim starts a run: nodes spread over the models by their demand
// at t=0, each with its first check jittered.
func newModelSim(cfg ModelSimConfig) *modelSim {
	nm := len(cfg.ModelBytes)
	s := &modelSim{
		cfg:        cfg,
		rng:        rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
		k:          make([]int, nm),
		nodes:      make([]modelSimNode, cfg.Nodes),
		rep:        ModelSimReport{TimeToServe: map[int]time.Duration{}},
		firstAsked: make([]time.Duration, nm),
		lastDemand: make([]time.Duration, nm),
		everRouted: make([]bool, nm),
	}
	for m, b := range cfg.ModelBytes {
		s.k[m] = int(math.Ceil(float64(b) / float64(cfg.NodeBudget)))
	}
	var d0 float64
	for m := range nm {
		d0 += cfg.Demand(m, 0) * float64(s.k[m])
	}
	i := 0
	for m := range nm {
		n := 0
		if d0 > 0 {
			n = int(float64(cfg.Nodes) * cfg.Demand(m, 0) * float64(s.k[m]) / d0)
		}
		for ; n > 0 && i < cfg.Nodes; n-- {
			s.nodes[i] = modelSimNode{model: m}
			i++
		}
	}
	for ; i < cfg.Nodes; i++ {
		s.nodes[i] = modelSimNode{model: -1}
	}
	for i := range s.nodes {
		s.nodes[i].nextCheck = time.Duration(s.rng.Int64N(int64(cfg.CheckEvery)))
		s.nodes[i].left = map[int]time.Duration{}
	}
	for m := range nm {
		s.firstAsked[m] = -1
		if cfg.Demand(m, 0) > 0 {
			s.firstAsked[m] = 0 // asked from the start: not "newly requested"
		}
	}
	return s
}

// loads are the models' loads at t (nodes only: serve adds the demand),
// how many nodes of each have finished loading, and the standby nodes.
func (s *modelSim) loads(t time.Duration) (loads []ModelLoad, loaded []int, standby int) {
	nm := len(s.k)
	loads = make([]ModelLoad, nm)
	for m := range nm {
		loads[m] = ModelLoad{Fingerprint: fmt.Sprint(m), Bytes: s.cfg.ModelBytes[m], NodesPerRoute: s.k[m]}
	}
	loaded = make([]int, nm)
	for _, n := range s.nodes {
		if n.model < 0 {
			standby++
			continue
		}
		loads[n.model].Nodes++
		if n.loadedAt <= t {
			loaded[n.model]++
		}
	}
	return loads, loaded, standby
}

// serve serves each model's demand at t with the routes its loaded nodes
// make, fills in the loads' demand, and measures.
func (s *modelSim) serve(t time.Duration, loads []ModelLoad, loaded []int) {
	cfg := s.cfg
	for m := range loads {
		d := cfg.Demand(m, t)
		routes := loaded[m] / s.k[m]
		sv := math.Min(d, float64(routes)*cfg.RouteRate)
		s.asked += d * cfg.Tick.Seconds()
		s.served += sv * cfg.Tick.Seconds()
		loads[m].Demand, loads[m].Unmet, loads[m].Routes = d, d-sv, routes
		if d > 0 {
			s.lastDemand[m] = t
			if s.firstAsked[m] < 0 {
				s.firstAsked[m] = t
			}
		} else {
			loads[m].IdleFor = t - s.lastDemand[m]
		}
		if routes > 0 {
			if _, ok := s.rep.TimeToServe[m]; !ok && s.firstAsked[m] > 0 {
				s.rep.TimeToServe[m] = t - s.firstAsked[m]
			}
			s.everRouted[m] = true
		} else if d > 0 && s.everRouted[m] {
			s.rep.LostLastRoute++
		}
	}
}

// move lets each node due for its check at t choose a model from the view
// (ChooseModel) and move there, unless cfg.Static.
func (s *modelSim) move(t time.Duration) {
	cfg := s.cfg
	for i := range s.nodes {
		n := &s.nodes[i]
		if cfg.Static || n.nextCheck > t {
			continue
		}
		n.nextCheck = t + cfg.CheckEvery/2 + time.Duration(s.rng.Int64N(int64(cfg.CheckEvery)))
		if n.loadedAt > t {
			continue // still loading
		}
		cur := ""
		if n.model >= 0 {
			cur = fmt.Sprint(n.model)
		}
		c := ChooseModel(cur, s.view, s.standby, cfg.Rules)
		if c.Target == cur || s.rng.Float64() >= c.Move {
			continue
		}
		var to int
		fmt.Sscan(c.Target, &to)
		if at, ok := n.left[to]; ok && t-at < time.Hour {
			s.rep.Flaps++
		}
		if n.model >= 0 {
			n.left[n.model] = t
			// What the view shows at once is this node's own
			// move (it no longer serves there), as its advert does.
			s.view[n.model].Nodes--
		} else {
			s.standby--
		}
		s.view[to].Nodes++
		n.model, n.loadedAt = to, t+cfg.LoadTime
		s.moves++
	}
}

// report is what the run measured.
func (s *modelSim) report() ModelSimReport {
	rep := s.rep
	if s.asked > 0 {
		rep.Served = s.served / s.asked
	}
	for m := range s.firstAsked {
		if s.firstAsked[m] > 0 {
			if _, ok := rep.TimeToServe[m]; !ok {
				rep.TimeToServe[m] = -1
			}
		}
	}
	rep.MovesPerNodeHour = float64(s.moves) / float64(s.cfg.Nodes) / s.cfg.Duration.Hours()
	return rep
}

// DayOfDemand is a day of shifting demand over nm models: each model's
// rate follows the day with its own phase; the last model is asked for
// only from hour 6 (a newly requested model), the first fades out at
// hour 12 (its windows must be released), and model 1 has a three-hour
// surge from hour 15. peak is the busiest model's rate.
func DayOfDemand(nm int, peak float64) func(m int, t time.Duration) float64 {
	return func(m int, t time.Duration) float64 {
		h := t.Hours()
		switch {
		case m == nm-1 && h < 6:
			return 0
		case m == 0 && h >= 12:
			return 0
		}
		base := peak / float64(1+m%4) * (0.6 + 0.4*math.Sin(2*math.Pi*(h/24+float64(m)/float64(nm))))
		if m == 1 && h >= 15 && h < 18 {
			base *= 3
		}
		return base
	}
}
