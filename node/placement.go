package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/multiformats/go-multiaddr"

	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/placement"
	"github.com/neuron-tai/meshp2p/route"
)

// PlacementConfig makes a node choose its own layers (start without
// --layers): it sizes its window from Memory and places and moves it by
// the rules in package placement (docs/placement.md).
type PlacementConfig struct {
	// Memory is the budget in bytes (0: on a GPU, its free memory less
	// 10%; else placement.Budget, the available RAM or cgroup room minus
	// a reserve).
	Memory int64
	// Device is the node's device (Config.Device, set by the node).
	Device engine.Device
	// Interval is the rebalance check period (DefaultRebalanceInterval),
	// jittered by ±RebalanceJitter.
	Interval time.Duration
	// Seed seeds the tie-breaks and jitter (0: random).
	Seed uint64
	// ModelRules shape the choice between a multi-model node's models
	// (placement.ChooseModel; zero: its defaults).
	ModelRules placement.ModelRules
}

// PlacementStatus is what the node's placement is doing.
type PlacementStatus struct {
	Auto    bool
	Budget  int64
	Current gguf.Range
	// Moving is the window being left (draining), or the one being loaded
	// (Loading), during a move.
	Moving, Loading *gguf.Range
	Moves           int
	LastWhy         string
	// Plan is the heal plan of the last check, while the model has no
	// route and several nodes must move ("": none).
	Plan string
	// ModelWhy is the last cross-model choice of a multi-model node
	// ("": a node with one model).
	ModelWhy string
}

// places reports whether the node chooses its own window: Placement set,
// no Layers, and a whole model (a pre-cut shard holds fixed layers).
func (c Config) places() bool {
	if c.Placement == nil || c.Layers != nil || c.ModelPath == "" {
		return false
	}
	f, err := gguf.Open(c.ModelPath)
	if err != nil {
		return true // startPlaced reports it
	}
	defer f.Close()
	_, err = gguf.ReadShardInfo(f.Metadata)
	return err != nil
}

// windowHost is what the placement controller needs of what the node
// serves (*served, served.go): a snapshot of it, and the changes a move,
// a model switch and the extras make, each one call that updates every
// registry (the hop, the vocabulary and tensor servers, the advert).
type windowHost interface {
	// now is the model and window served now (extras included).
	now() servedNow
	// serveWindow serves ls (loaded by the controller's windowLoader): as
	// the first window, the first of a new model (setModel), or beside
	// the window served now, which stops admitting; once ls is advertised
	// it drains and closes the old one, returning how many sessions that
	// ended. commit runs under the served set's lock as the swap becomes
	// visible (from: the old range, nil if none), so readers see both
	// changes together. An error changes nothing.
	serveWindow(ctx context.Context, ls *loadedShard, commit func(from *gguf.Range)) (ended int, err error)
	// releaseWindow stops serving the window served now and closes it
	// (draining its sessions), before a new one loads: the node serves
	// none until serveWindow. It returns the window and its shard file;
	// ok is false when none is served.
	releaseWindow(ctx context.Context) (from gguf.Range, path string, ended int, ok bool)
	// setModel makes a multi-model node serve another of its models
	// (models.go; its window released first): the old model's
	// vocabulary and tensors go, the new one's vocabulary is served.
	setModel(ctx context.Context, m catalogModel)
	// addExtra and releaseExtra serve other models whole beside the own
	// one (extras.go).
	addExtra(ctx context.Context, m catalogModel) error
	releaseExtra(ctx context.Context, fp string) int
}

// placementController owns where a serving node's layer window is: for a
// self-placing node (auto) it chooses the window, announces it, loads it,
// checks it every rebalance interval and moves it; for any serving node it
// runs a move it is asked for (tests) and reports its state.
//
// Lock order: served.mu before placementController.mu. The served set
// reads the controller's state while it holds its own lock (the advert,
// Placement, serveWindow's commit); the controller never calls it (nor
// publishes) while holding mu.
type placementController struct {
	set windowHost
	// loader cuts, checks and loads the windows the node moves to.
	loader *windowLoader
	// adv publishes the advert (the controller's planned window and
	// model switch are in it); nil in tests that run no node.
	adv   *advertiser
	swarm swarm
	// moved records a finished move (node.json); set before the
	// controller runs.
	moved func()
	log   *slog.Logger
	// bootstrap: the node has bootstrap peers to settle with.
	bootstrap bool
	auto      bool
	cfg       PlacementConfig

	// Set before the controller runs (the start), read-only after. rng is
	// used by one goroutine at a time: the start, then the rebalance loop.
	sizing placement.Sizing
	budget int64
	// budgetFrom says where budget came from (--memory, or what
	// placement.Budget read).
	budgetFrom string
	rng        *rand.Rand
	reb        *placement.Rebalancer
	nEmbd      int
	arch       string
	// shardFor gets the shard file of a window: cut from the whole model
	// file (served.cutOwn), or fetched from peers or a URL
	// (shardFetcher.fetchWindow).
	shardFor func(ctx context.Context, r gguf.Range) (string, error)
	// fetched is where a node without the model file fetches windows
	// from (nil for a node with the file).
	fetched *fetchedModel

	// mu guards the move state: loading is a window being loaded
	// (advertised as planned), draining one being left.
	mu                sync.Mutex
	loading, draining *gguf.Range
	moves             int
	lastWhy           string
	plan              string // the heal plan of the last check ("": none)

	// A multi-model node's models (models.go; nil: one model), the table
	// whose demand and offers it weighs, when each was last asked for and
	// when the controller started (a model never asked for is idle since).
	// models, table and started are set before the controller runs;
	// lastAsked is the rebalance goroutine's. modelWhy is guarded by mu.
	models    []catalogModel
	table     *route.Table
	lastAsked map[string]time.Time
	started   time.Time
	modelWhy  string
	// failedAt: when a switch to each model last failed (rebalance
	// goroutine only); switching is a switch under way (advertised), and
	// pinned says the node holds its model's last route while it is
	// needed (its offers say so); both guarded by mu.
	failedAt      map[string]time.Time
	extraFailedAt map[string]time.Time // the same for loading a model as an extra
	switching     *switchIntent
	pinned        bool
}

// newPlacementController returns the controller of a node's window; cfg
// nil: the node was given its layers (no automatic placement). Its
// shardFor, moved and table are set before it runs.
func newPlacementController(set windowHost, ld *windowLoader, adv *advertiser, sw swarm, log *slog.Logger, cfg *PlacementConfig, bootstrap bool) *placementController {
	c := &placementController{set: set, loader: ld, adv: adv, swarm: sw, log: log, bootstrap: bootstrap, moved: func() {},
		lastAsked: map[string]time.Time{}, started: time.Now(), failedAt: map[string]time.Time{},
		extraFailedAt: map[string]time.Time{}}
	if cfg != nil {
		c.auto, c.cfg = true, *cfg
	}
	return c
}

// size sets the model's sizing and shape, the budget (the configured
// memory, else placement.Budget) and the seeded generator. src says where
// the budget came from.
func (c *placementController) size(sz placement.Sizing, nEmbd int, arch string) (src string, err error) {
	c.sizing, c.nEmbd, c.arch = sz, nEmbd, arch
	c.budget, src = c.cfg.Memory, "--memory"
	if dev := c.cfg.Device; c.budget <= 0 && !dev.IsCPU() {
		// A GPU node's layers live in the device's memory: its budget is
		// what the backend reports free, less 10% for the compute
		// buffers the backend allocates beside the weights and cache.
		c.budget = int64(dev.FreeBytes / 10 * 9)
		src = dev.Name + "'s free memory (the backend's query) minus 10%"
		if dev.Type == "igpu" || dev.Software {
			// Its memory is the host's, which the mapped model file
			// and the process share: the smaller of the two.
			if host, hsrc, err := placement.Budget(); err == nil && host < c.budget {
				c.budget, src = host, hsrc+" (the host's: "+dev.Name+" shares it)"
			}
		}
	}
	if c.budget <= 0 {
		if c.budget, src, err = placement.Budget(); err != nil {
			return "", err
		}
	}
	c.budgetFrom = src
	seed := c.cfg.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	c.rng = rand.New(rand.NewPCG(seed, seed^rngStream))
	return src, nil
}

// placeFirst chooses a window for a node holding the whole model file,
// announces it, reconsiders after a random pause and loads it.
func (c *placementController) placeFirst(ctx context.Context) (*loadedShard, error) {
	nl := c.set.now().nLayer
	if len(placement.Candidates(c.sizing, c.budget)) == 0 {
		return nil, fmt.Errorf("memory budget %s (%s) holds no layer of this model: one layer needs at least %s; pass a larger --memory or --layers",
			mib(c.budget), c.budgetFrom, mib(c.sizing.Need(placement.Range{Start: nl / 2, End: nl/2 + 1})))
	}
	c.log.Info("placing layers", "budget", mib(c.budget), "budget_from", c.budgetFrom, "n_layer", nl,
		"layers_that_fit", fmt.Sprintf("%d in the middle", c.sizing.MaxWindow(nl/2, c.budget)))
	c.settle(ctx)
	first, ok := placement.Choose(c.view(ctx), c.sizing, c.budget, 0, nil, c.rng)
	if !ok {
		return nil, errors.New("placing layers: no window fits the budget")
	}
	r, err := c.announce(ctx, first)
	if err != nil {
		return nil, err
	}
	return c.load(ctx, r)
}

// chooseFetched picks the window of a fetched model without --layers from
// the header's sizes and the swarm now (announced first unless this is
// the model's first node, announce false: no other windows are known).
// Once the node serves it, it rebalances like one with the whole file,
// fetching the window it moves to.
func (c *placementController) chooseFetched(ctx context.Context, sz placement.Sizing, nEmbd int, arch string, announce bool) (gguf.Range, error) {
	src, err := c.size(sz, nEmbd, arch)
	if err != nil {
		return gguf.Range{}, err
	}
	c.settle(ctx)
	ch, ok := placement.Choose(c.view(ctx), sz, c.budget, 0, nil, c.rng)
	if !ok {
		return gguf.Range{}, fmt.Errorf("memory budget %s (%s) holds no window of this model; pass a larger --memory or --layers", mib(c.budget), src)
	}
	r := gguf.Range{Start: ch.Range.Start, End: ch.Range.End}
	if announce {
		// Like a node with the file: announce the window (others
		// starting now see it while this one fetches), pause, reconsider.
		if r, err = c.announce(ctx, ch); err != nil {
			return r, err
		}
	}
	c.log.Info("placement chose the layers to fetch (a move later fetches the new window)", "range", r.String(), "why", choiceWhy(ch),
		"estimate", mib(sz.Need(placement.Range{Start: r.Start, End: r.End})), "budget", mib(c.budget))
	return r, nil
}

// announce advertises the window first chose as planned (no session
// slot), waits a random part of PlacementPause, and reconsiders it against
// the swarm then, so that nodes starting together see each other's
// choices and spread; it returns the window to load (still advertised as
// planned until it is).
func (c *placementController) announce(ctx context.Context, first placement.Choice) (gguf.Range, error) {
	r := gguf.Range{Start: first.Range.Start, End: first.Range.End}
	c.log.Info("placement: announcing", "range", r.String(), "why", choiceWhy(first), "estimate", mib(c.sizing.Need(first.Range)), "budget", mib(c.budget))
	c.setLoading(&r)
	if err := c.publish(); err != nil {
		return r, err
	}
	select {
	case <-ctx.Done():
		return r, ctx.Err()
	case <-time.After(time.Duration(c.rng.Int64N(int64(PlacementPause)))):
	}
	c.settle(ctx)
	if again, ok := placement.Choose(c.view(ctx), c.sizing, c.budget, 0, &first.Range, c.rng); ok && again.Range != first.Range {
		r = gguf.Range{Start: again.Range.Start, End: again.Range.End}
		c.log.Info("placement: reconsidered after the pause", "range", r.String(), "why", choiceWhy(again))
		c.setLoading(&r)
		if err := c.publish(); err != nil {
			return r, err
		}
	}
	return r, nil
}

// load gets the shard file of r (shardFor) and loads it.
func (c *placementController) load(ctx context.Context, r gguf.Range) (*loadedShard, error) {
	path, err := c.shardFor(ctx, r)
	if err != nil {
		return nil, err
	}
	return c.loader.load(ctx, path)
}

// firstServed is the commit of a first window: it is no longer planned.
func (c *placementController) firstServed(*gguf.Range) { c.setLoading(nil) }

// publish re-publishes the advert (with the planned window, if any).
func (c *placementController) publish() error {
	if c.adv == nil {
		return nil
	}
	return c.adv.publish()
}

// startRebalancing starts the checks; they end with ctx.
func (c *placementController) startRebalancing() {
	c.reb = placement.NewRebalancer(c.sizing, c.budget, c.rng)
}

func (c *placementController) setLoading(r *gguf.Range) {
	c.mu.Lock()
	c.loading = r
	c.mu.Unlock()
}

// planned is the window being loaded, advertised as planned (nil: none).
func (c *placementController) planned() (r *gguf.Range, nEmbd int, arch string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.loading, c.nEmbd, c.arch
}

// status is the controller's part of PlacementStatus (Current is the
// node's).
func (c *placementController) status() PlacementStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := PlacementStatus{Auto: c.auto, Moves: c.moves, LastWhy: c.lastWhy, Plan: c.plan, Loading: c.loading, Moving: c.draining, ModelWhy: c.modelWhy}
	if c.auto {
		st.Budget = c.budget
	}
	return st
}

// advertisedBudget is the budget the node advertises for heal plans (0:
// no automatic placement; nil controller too).
func (c *placementController) advertisedBudget() int64 {
	if c == nil || !c.auto {
		return 0
	}
	return c.budget
}

// interval is the period of the placement checks (0 without automatic
// placement).
func (c *placementController) interval() time.Duration {
	if !c.auto {
		return 0
	}
	if iv := c.cfg.Interval; iv > 0 {
		return iv
	}
	return DefaultRebalanceInterval
}

// run checks the window every jittered interval, LossCheckDelay after
// losing a peer, and every HealRecheck while the model has no route, and
// moves it when the rebalancer says so, until ctx ends.
func (c *placementController) run(ctx context.Context) {
	iv := c.interval()
	events := c.swarm.SubscribeConn(ctx)
	// The first check comes soon: a node that starts (or restarts) into a
	// swarm with no route helps at once, not after a period.
	due := time.Now().Add(HealRecheck)
	timer := time.NewTimer(HealRecheck)
	defer timer.Stop()
	// A multi-model node also looks every WarmCheck whether one of its
	// models is asked for and has no route (warming waits for no period).
	var warm <-chan time.Time
	if len(c.models) > 1 {
		wt := time.NewTicker(c.jittered(WarmCheck))
		defer wt.Stop()
		warm = wt.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-warm:
			// Only the cross-model choice: the rebalancer's safeguards
			// count checks at the rebalance interval.
			if c.warmWanted() {
				c.checkModel(ctx)
			}
			continue
		case ev, ok := <-events:
			if !ok {
				events = nil // no more events; the timer still runs
				continue
			}
			if ev.Kind != p2p.Disconnected {
				continue // the check stays due when it was
			}
			// A peer went away: if it served layers, a check soon sees
			// whether the model still has a route.
			if soon := time.Now().Add(LossCheckDelay + time.Duration(c.rng.Int64N(int64(LossCheckJitter)))); soon.Before(due) {
				c.log.Debug("placement: peer lost; checking soon", "peer", ev.Peer, "in", time.Until(soon).Round(time.Millisecond))
				due = soon
				timer.Reset(time.Until(due))
			}
			continue
		case <-timer.C:
		}
		next := c.jittered(iv)
		if c.check(ctx) {
			next = HealRecheck
		}
		due = time.Now().Add(next)
		timer.Reset(next)
	}
}

// jittered is iv spread by ±RebalanceJitter.
func (c *placementController) jittered(iv time.Duration) time.Duration {
	return time.Duration(float64(iv) * (1 - RebalanceJitter + 2*RebalanceJitter*c.rng.Float64()))
}

// check is one placement check: stay, or move where the rebalancer says.
// It reports whether to check again soon (HealRecheck: no route).
func (c *placementController) check(ctx context.Context) (recheck bool) {
	if c.checkModel(ctx) {
		return true // look again soon: the switch changed the swarm
	}
	st := c.set.now()
	cur, ms := st.window, st.msPerLayer
	dec := c.reb.Check(c.view(ctx), c.swarm.ID().String(), placement.Range{Start: cur.Start, End: cur.End}, ms)
	c.mu.Lock()
	c.lastWhy = dec.Why
	c.plan = ""
	if dec.Plan != nil {
		c.plan = dec.Plan.String()
	}
	c.mu.Unlock()
	if !dec.Move {
		if dec.Plan != nil || dec.Recheck {
			c.log.Info("placement: model has no route", "range", cur.String(), "why", dec.Why)
		} else {
			c.log.Debug("placement check: staying", "range", cur.String(), "why", dec.Why)
		}
		return dec.Recheck
	}
	to := gguf.Range{Start: dec.To.Start, End: dec.To.End}
	both := c.sizing.Need(placement.Range{Start: cur.Start, End: cur.End}) + c.sizing.Need(dec.To)
	releaseFirst := both > c.ownBudget()
	if releaseFirst && dec.Reason == placement.ReasonThroughput {
		// A throughput move while routes exist must not drop the old
		// window before the new one serves, nor hold both beyond the
		// budget.
		c.log.Info("placement: not moving: holding both windows during the move exceeds the budget", "from", cur.String(), "to", to.String(),
			"both", mib(both), "budget", mib(c.ownBudget()))
		return dec.Recheck
	}
	c.log.Info("placement: moving", "from", cur.String(), "to", to.String(), "reason", string(dec.Reason), "why", dec.Why, "release_first", releaseFirst)
	if err := c.move(ctx, to, releaseFirst); err != nil {
		c.log.Warn("placement: move failed; staying", "to", dec.To.String(), "err", err)
	}
	return true // look again soon: the move changed the swarm
}

// move is graceful: announce and load the new window, add it to the hop,
// advertise it, stop admitting on the old window, let its sessions finish
// (or end them after DrainTimeout so their origins re-route), release it.
// With releaseFirst (both windows do not fit the budget, and the model has
// no route, so the old window serves nothing) the old window is released
// before the new one loads.
func (c *placementController) move(ctx context.Context, to gguf.Range, releaseFirst bool) error {
	c.setLoading(&to)
	if err := c.publish(); err != nil {
		c.log.Warn("advertise planned window", "err", err)
	}
	// Get the new window's file first (cut or fetched: disk, not memory):
	// a move that cannot get it leaves the node where it is.
	path, err := c.shardFor(ctx, to)
	if err != nil {
		c.abandon()
		return err
	}
	var released *gguf.Range
	var oldPath string
	if releaseFirst {
		if r, p, ended, ok := c.set.releaseWindow(ctx); ok {
			released, oldPath = &r, p
			c.log.Info("placement: released the old window first (both do not fit the budget)", "from", r.String(), "sessions_ended_by_drain", ended)
		}
	}
	ls, err := c.loader.load(ctx, path)
	if err != nil && released != nil {
		// Serve the old window again rather than nothing.
		if back, berr := c.loader.load(ctx, oldPath); berr == nil {
			if _, serr := c.set.serveWindow(ctx, back, func(*gguf.Range) {}); serr != nil {
				back.close()
			}
		}
	}
	if err != nil {
		c.abandon()
		return err
	}
	var from *gguf.Range
	// Advertised, then the old window drains (draining until it closed).
	ended, err := c.set.serveWindow(ctx, ls, func(f *gguf.Range) {
		from = f
		c.mu.Lock()
		c.loading, c.draining = nil, f
		c.moves++
		c.mu.Unlock()
	})
	if err != nil {
		ls.close()
		c.abandon()
		return err
	}
	if from == nil {
		from = released
	}
	c.mu.Lock()
	c.draining = nil
	c.mu.Unlock()
	c.log.Info("placement: moved", "from", rangeString(from), "to", to.String(), "sessions_ended_by_drain", ended)
	c.moved()
	return nil
}

func rangeString(r *gguf.Range) string {
	if r == nil {
		return "none"
	}
	return r.String()
}

// abandon withdraws the planned window of a failed move.
func (c *placementController) abandon() {
	c.setLoading(nil)
	_ = c.publish()
}

// settle waits (up to PlacementSettle, not at all without bootstrap
// peers) until the node holds some peer's advert, pulling from connected
// peers meanwhile (a pull right after connecting can precede identify).
func (c *placementController) settle(ctx context.Context) {
	if !c.bootstrap {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, PlacementSettle)
	defer cancel()
	me := c.swarm.ID()
	for ctx.Err() == nil {
		if c.swarm.PeerCount() > 0 {
			c.swarm.Sync(ctx)
			for _, a := range c.swarm.Adverts() {
				if a.Peer != me {
					return
				}
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(settlePoll):
		}
	}
}

// view is the swarm for this node's model, from the adverts discovery
// holds now (not the route table, which follows them asynchronously):
// every other peer's windows, a peer we hold no connection to counted only
// if a short dial reaches it (a crashed node's advert outlives it by up to
// its TTL).
func (c *placementController) view(ctx context.Context) placement.View {
	st := c.set.now()
	return c.viewOf(ctx, st.fp, st.nLayer)
}

// viewOf is view for model fp of nl layers.
func (c *placementController) viewOf(ctx context.Context, fp string, nl int) placement.View {
	v := placement.View{NLayer: nl}
	shards := c.modelShards(fp, nl)
	alive := c.alive(ctx, shards)
	for _, s := range shards {
		if !alive[s.Peer] {
			continue
		}
		v.Servers = append(v.Servers, placement.Server{Peer: s.Peer.String(), Range: placement.Range{Start: s.Start, End: s.End},
			MsPerLayer: float64(s.DecodeMsPerLayer), Relayed: relayedOnly(s.Addrs), Planned: s.Capacity.GetMaxSessions() == 0,
			Budget: s.PlacementBudget})
	}
	return v
}

// modelShards are the windows of model fp (nl layers) other peers
// advertise.
func (c *placementController) modelShards(fp string, nl int) []route.Shard {
	me := c.swarm.ID()
	var shards []route.Shard
	for _, a := range c.swarm.Adverts() {
		if a.Peer == me {
			continue
		}
		ss, err := route.DecodeAdvert(a)
		if err != nil {
			continue
		}
		for _, s := range ss {
			if s.Fingerprint == fp && s.NLayer == nl {
				shards = append(shards, s)
			}
		}
	}
	return shards
}

// alive says which of the shards' peers count: connected ones, and ones a
// short dial reaches. Dials run LivenessDials at a time, at most
// MaxLivenessDials per check (peers beyond that count as gone until a
// later check).
func (c *placementController) alive(ctx context.Context, shards []route.Shard) map[peer.ID]bool {
	alive := map[peer.ID]bool{}
	dials := 0
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, LivenessDials)
	for _, s := range shards {
		connected := c.swarm.Connected(s.Peer)
		mu.Lock()
		_, seen := alive[s.Peer]
		if !seen {
			alive[s.Peer] = connected
		}
		mu.Unlock()
		if seen || connected {
			continue
		}
		if dials++; dials > MaxLivenessDials {
			continue // counted as gone this check: adverts cannot make a check dial without end
		}
		wg.Add(1)
		sem <- struct{}{}
		go func(p peer.ID) {
			defer func() { <-sem; wg.Done() }()
			ok := c.reachable(ctx, p)
			mu.Lock()
			alive[p] = ok
			mu.Unlock()
		}(s.Peer)
	}
	wg.Wait()
	return alive
}

func (c *placementController) reachable(ctx context.Context, p peer.ID) bool {
	if c.swarm.Connected(p) {
		return true
	}
	dctx, cancel := context.WithTimeout(ctx, LivenessDial)
	defer cancel()
	return c.swarm.Dial(dctx, p) == nil
}

// relayedOnly: every address the peer advertises is a relay circuit (the
// same for every observer, so all nodes weigh it alike).
func relayedOnly(addrs []multiaddr.Multiaddr) bool {
	if len(addrs) == 0 {
		return false
	}
	for _, a := range addrs {
		if !strings.Contains(a.String(), "/p2p-circuit") {
			return false
		}
	}
	return true
}

func choiceWhy(c placement.Choice) string {
	return fmt.Sprintf("layers missing from the best route %d → %d; weakest layer %.3g → %.3g tokens/s", c.DeficitBefore, c.Deficit, c.WeakestBefore, c.Weakest)
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
