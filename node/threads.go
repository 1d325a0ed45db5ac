package node

import (
	"context"
	"log/slog"
	"sync"
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
// (engine.Shard.SetThreads; results do not depend on it). Methods on a nil
// threadShare do nothing.
type threadShare struct {
	m   *cpushare.Member
	log *slog.Logger

	mu     sync.Mutex
	shards map[*engine.Shard]bool
	last   int
}

func newThreadShare(m *cpushare.Member, log *slog.Logger) *threadShare {
	return &threadShare{m: m, log: log, shards: map[*engine.Shard]bool{}}
}

// threads measures the share now.
func (ts *threadShare) threads(ctx context.Context) int {
	n := ts.m.Threads(ctx)
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
