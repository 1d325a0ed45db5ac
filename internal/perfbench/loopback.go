package perfbench

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/node"
	"github.com/neuron-tai/meshp2p/session"
)

// Loopback is a swarm of real nodes on 127.0.0.1 (TCP, the test preset,
// as the README's e2e tests start them), one per shard file, and a client.
type Loopback struct {
	Nodes  []*node.Node
	Client *node.Node
	FP     string
	NLayer int
	dirs   []string
}

// StartLoopback starts one node per shard file with ec and a client node,
// and waits until the client sees the whole model.
func StartLoopback(ctx context.Context, shards []string, ec engine.Config) (*Loopback, error) {
	lb := &Loopback{}
	network := fmt.Sprintf("perf%d", os.Getpid())
	var boot []peer.AddrInfo
	cfg := func() (node.Config, error) {
		d, err := os.MkdirTemp("", "meshp2p-perf-")
		if err != nil {
			return node.Config{}, err
		}
		lb.dirs = append(lb.dirs, d)
		pc := node.Preset(node.PresetTest)
		pc.Network, pc.DataDir, pc.Bootstrap = network, d, boot
		return node.Config{P2P: pc, Engine: ec, Logger: quiet, Hop: session.HopConfig{Idle: time.Minute, OpenTimeout: 30 * time.Second,
			MaxSessionKV: -1, MaxSessionsPerPeer: -1, MaxKVPerPeer: -1}}, nil
	}
	for _, s := range shards {
		c, err := cfg()
		if err != nil {
			lb.Close()
			return nil, err
		}
		c.ModelPath = s
		n, err := node.Start(ctx, c)
		if err != nil {
			lb.Close()
			return nil, fmt.Errorf("start node for %s: %w", s, err)
		}
		lb.Nodes = append(lb.Nodes, n)
		if boot == nil {
			boot = []peer.AddrInfo{n.P2P().AddrInfo()}
		}
	}
	c, err := cfg()
	if err != nil {
		lb.Close()
		return nil, err
	}
	pc := node.TestRelax(node.Preset(node.PresetClient))
	pc.Network, pc.DataDir, pc.Bootstrap, pc.ListenAddrs = c.P2P.Network, c.P2P.DataDir, c.P2P.Bootstrap, c.P2P.ListenAddrs
	c.P2P = pc
	cl, err := node.Start(ctx, c)
	if err != nil {
		lb.Close()
		return nil, err
	}
	lb.Client = cl
	lb.FP, lb.NLayer, err = cl.WaitForModel(ctx, lb.Nodes[0].Fingerprint(), 60*time.Second)
	if err != nil {
		lb.Close()
		return nil, err
	}
	return lb, nil
}

// Generate runs one greedy generation through the swarm.
func (lb *Loopback) Generate(ctx context.Context, prompt []int32, n, chunk int) (*session.Result, error) {
	o := lb.Client.Origin(nil)
	o.Chunk = chunk
	return o.Generate(ctx, session.GenerateRequest{Fingerprint: lb.FP, NLayer: lb.NLayer, Prompt: prompt, MaxTokens: n})
}

// Close stops every node and removes their directories.
func (lb *Loopback) Close() {
	if lb.Client != nil {
		_ = lb.Client.Close()
	}
	for _, n := range lb.Nodes {
		_ = n.Close()
	}
	for _, d := range lb.dirs {
		_ = os.RemoveAll(d)
	}
}
