package node

import (
	"context"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/node/cpushare"
)

// DefaultThreadShareInterval is how often a node re-checks its share of
// the machine's CPUs (Config.ThreadShareInterval).
const DefaultThreadShareInterval = 30 * time.Second

// threadShare sizes the compute threads of a node's loaded windows as the
// process's share of the machine (package cpushare): the share when a
// window loads, and again every interval, applied between decodes
// (engine.Shard.SetThreads; results do not depend on it). Where the
// platform has a cpushare.Gate, the share is the CPUs that meshp2p
// processes may use (Member.Cap) and each decode takes what the
// co-located processes are not computing on at that moment: the hops of a
// route on one machine decode one after another, each on every core.
// Methods on a nil threadShare do nothing.
type threadShare struct {
	m    *cpushare.Member
	gate *cpushare.Gate // nil: the static share (Member.Threads)
	log  *slog.Logger

	mu     sync.Mutex
	shards map[*engine.Shard]bool
	last   int
}

func newThreadShare(m *cpushare.Member, log *slog.Logger) *threadShare {
	return &threadShare{m: m, gate: m.Gate(), log: log, shards: map[*engine.Shard]bool{}}
}

// mode names what sizes a window's threads, for its "shard ready" log:
// "fixed" (--threads, a GPU, or a process that could not join the CPU
// share, which start logs), "share" (the static share) or "gate" (each
// decode claims the co-located processes' free CPUs).
func (ts *threadShare) mode() string {
	switch {
	case ts == nil:
		return "fixed"
	case ts.gate == nil:
		return "share"
	}
	return "gate"
}

// configure sizes ec for a window: its pool's threads (the share now)
// and the gate its decodes claim them through (nil: none).
func (ts *threadShare) configure(ctx context.Context, ec *engine.Config) *windowGate {
	ec.Threads = ts.threads(ctx)
	if ts.gate == nil {
		return nil
	}
	wg := &windowGate{g: ts.gate}
	wg.limit.Store(math.MaxInt32)
	ec.Gate = wg
	return wg
}

// windowGate is one window's way to the process's gate: its decodes claim
// at most limit threads. A model so small that its rows gain nothing from
// a second thread (the demo's stories260K: ggml's per-operation barriers
// cost more than they split) is held to one (choose).
type windowGate struct {
	g     *cpushare.Gate
	limit atomic.Int32
	most  atomic.Int32 // the most threads a decode got (choose)
}

func (w *windowGate) Acquire(n int) int {
	k := w.g.Acquire(min(n, int(w.limit.Load())))
	if int32(k) > w.most.Load() {
		w.most.Store(int32(k))
	}
	return k
}

func (w *windowGate) Release(n int) { w.g.Release(n) }

// gateProbeMax: a window whose decode step takes longer than this on every
// thread it may claim is compute-bound enough that more threads pay; it
// is not measured on one.
const gateProbeMax = 20 * time.Millisecond

// gateGainMin: more threads must make a decode step at least this much
// faster than one thread, or the window computes on one.
const gateGainMin = 0.9

// choose measures the window's decode step on one thread against many
// (its calibration, measured on what the gate gave) and holds it to one
// thread where many were not gateGainMin faster. It returns the
// calibration of the count chosen. Where the calibration never got a
// second thread (other members computed throughout), nothing is decided.
func (w *windowGate) choose(ctx context.Context, sh *engine.Shard, many time.Duration, log *slog.Logger) (time.Duration, error) {
	if w == nil || sh.Threads() < 2 || many > gateProbeMax || w.most.Load() < 2 {
		return many, nil
	}
	w.limit.Store(1)
	one, err := sh.MeasureDecode(ctx, calibrationRows)
	if err != nil {
		return 0, err
	}
	if float64(many) < gateGainMin*float64(one) {
		w.limit.Store(math.MaxInt32)
		log.Info("decodes claim the machine's free CPUs", "step_one_thread", one, "step_free_cpus", many)
		return many, nil
	}
	log.Info("decodes compute on one thread: more are no faster for this window", "step_one_thread", one, "step_free_cpus", many)
	return one, nil
}

// threads measures the share now.
func (ts *threadShare) threads(ctx context.Context) int {
	n, _ := ts.m.Pool(ctx)
	ts.mu.Lock()
	ts.last = n
	ts.mu.Unlock()
	return n
}

func (ts *threadShare) add(s *engine.Shard) {
	if ts == nil {
		return
	}
	ts.mu.Lock()
	ts.shards[s] = true
	ts.mu.Unlock()
}

func (ts *threadShare) remove(s *engine.Shard) {
	if ts == nil {
		return
	}
	ts.mu.Lock()
	delete(ts.shards, s)
	ts.mu.Unlock()
}

// run re-checks the share every interval and applies a changed one to
// every window, until ctx ends.
func (ts *threadShare) run(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		interval = DefaultThreadShareInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ts.mu.Lock()
		before := ts.last
		ts.mu.Unlock()
		n := ts.threads(ctx)
		if ctx.Err() != nil {
			return
		}
		ts.mu.Lock()
		for s := range ts.shards {
			s.SetThreads(n)
		}
		ts.mu.Unlock()
		if n != before {
			ts.log.Info("compute threads follow the machine's free CPUs", "threads", n, "was", before, "meshp2p_processes", ts.m.Members())
		}
	}
}
