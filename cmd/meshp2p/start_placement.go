package main

import (
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/neuron-tai/meshp2p/node"
	"github.com/neuron-tai/meshp2p/placement"
)

// placementFlags are start's automatic-placement flags (used without
// --layers; docs/placement.md).
type placementFlags struct {
	memory   string
	interval time.Duration
}

func (p *placementFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&p.memory, "memory", "", "without --layers: memory budget for this node's layers, KV cache and buffers, e.g. 6G or 512M (default: available RAM, or the room under the cgroup's memory limit (v2 memory.max, v1 memory.limit_in_bytes), minus 10%: at least 512 MiB, at most a quarter)")
	fs.DurationVar(&p.interval, "rebalance-interval", node.DefaultRebalanceInterval, "without --layers: how often the node checks whether moving its layer window would help the swarm (±25% jitter)")
}

// config is the placement a start without --layers runs.
func (p *placementFlags) config() (*node.PlacementConfig, error) {
	pc := &node.PlacementConfig{Interval: p.interval}
	if p.memory != "" {
		b, err := placement.ParseBytes(p.memory)
		if err != nil {
			return nil, fmt.Errorf("%w: --memory: %v", errUsage, err)
		}
		pc.Memory = b
	}
	if p.interval <= 0 {
		return nil, fmt.Errorf("%w: --rebalance-interval must be positive", errUsage)
	}
	return pc, nil
}

// printPlacement says how a self-placing node chose its window.
func printPlacement(w io.Writer, n *node.Node) {
	if st := n.Placement(); st.Auto {
		fmt.Fprintf(w, "placement: chose layers %s within a %.1f MiB budget; rechecks every %v (docs/placement.md)\n",
			st.Current, float64(st.Budget)/(1<<20), n.RebalanceInterval())
	}
}
