package perfbench

import (
	"context"
	"fmt"
	"github.com/neuron-tai/meshp2p/client"
	"net"
	"os"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/multiformats/go-multiaddr"

	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/internal/delayproxy"
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
	// delayed: each node listens behind a delayproxy (see StartDelayed).
	link    delayproxy.Link
	proxies []*delayproxy.Proxy
	// Audit is the generations' auditor (nil: none; sessions then ask for
	// no transcripts).
	Audit *session.Auditor
}

// LoopbackOptions shape a loopback swarm: the link every connection
// crosses (zero: none, plain loopback) and a change to each node's hop
// configuration.
type LoopbackOptions struct {
	Link delayproxy.Link
	Hop  func(*session.HopConfig)
	// HeadDraft, if set, is the head node's draft model (node.Config.DraftPath).
	HeadDraft string
}

// StartLoopback starts one node per shard file with ec and a client node,
// and waits until the client sees the whole model.
func StartLoopback(ctx context.Context, shards []string, ec engine.Config) (*Loopback, error) {
	return StartWith(ctx, shards, ec, LoopbackOptions{})
}

// StartDelayed is StartLoopback with a one-way delay h on every link:
// each node (the client too) listens on a loopback port behind its own
// delayproxy and announces only the proxy's address, so every connection
// between two nodes crosses exactly one proxy (the dialled node's) and
// pays h in each direction. CheckProxied tells whether it did.
func StartDelayed(ctx context.Context, shards []string, ec engine.Config, h time.Duration) (*Loopback, error) {
	return StartWith(ctx, shards, ec, LoopbackOptions{Link: delayproxy.Ideal(h)})
}

// StartWith is StartLoopback with options: with a link, every node
// listens behind a delayproxy of that profile, as StartDelayed's.
func StartWith(ctx context.Context, shards []string, ec engine.Config, opt LoopbackOptions) (*Loopback, error) {
	if err := opt.Link.Validate(); err != nil {
		return nil, err
	}
	lb := &Loopback{link: opt.Link}
	proxied := opt.Link != (delayproxy.Link{})
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
		if proxied {
			listen, announce, err := lb.proxied(ctx)
			if err != nil {
				return node.Config{}, err
			}
			pc.ListenAddrs, pc.AnnounceAddrs = []string{listen}, []string{announce}
		}
		hc := session.HopConfig{Idle: time.Minute, OpenTimeout: 30 * time.Second, MaxSessionKV: -1, MaxSessionsPerPeer: -1, MaxKVPerPeer: -1}
		if opt.Hop != nil {
			opt.Hop(&hc)
		}
		return node.Config{P2P: pc, Engine: ec, Logger: quiet, Hop: hc}, nil
	}
	for _, s := range shards {
		c, err := cfg()
		if err != nil {
			lb.Close()
			return nil, err
		}
		c.ModelPath = s
		if len(lb.Nodes) == 0 {
			c.DraftPath = opt.HeadDraft
		}
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
	pc.Network, pc.DataDir, pc.Bootstrap, pc.ListenAddrs, pc.AnnounceAddrs = c.P2P.Network, c.P2P.DataDir, c.P2P.Bootstrap, c.P2P.ListenAddrs, c.P2P.AnnounceAddrs
	c.P2P = pc
	cl, err := node.Start(ctx, c)
	if err != nil {
		lb.Close()
		return nil, err
	}
	lb.Client = cl
	rc, err := client.New(client.Config{Swarm: cl.P2P(), Table: cl.Table()})
	if err != nil {
		lb.Close()
		return nil, err
	}
	m, err := rc.Resolve(ctx, lb.Nodes[0].Fingerprint(), 60*time.Second)
	rc.Close()
	lb.FP, lb.NLayer = m.Fingerprint, m.NLayer
	if err != nil {
		lb.Close()
		return nil, err
	}
	return lb, nil
}

// Generate runs one greedy generation through the swarm.
func (lb *Loopback) Generate(ctx context.Context, prompt []int32, n, chunk int) (*session.Result, error) {
	return lb.GenerateReq(ctx, session.GenerateRequest{Prompt: prompt, MaxTokens: n}, chunk)
}

// GenerateReq runs req (its model filled in) through the swarm.
func (lb *Loopback) GenerateReq(ctx context.Context, req session.GenerateRequest, chunk int) (*session.Result, error) {
	o := lb.Client.Origin(nil)
	o.Chunk, o.Audit = chunk, lb.Audit
	req.Fingerprint, req.NLayer = lb.FP, lb.NLayer
	return o.Generate(ctx, req)
}

// ProxyStats sums the delay proxies' counters (bytes, stalls).
func (lb *Loopback) ProxyStats() delayproxy.Stats {
	var sum delayproxy.Stats
	for _, p := range lb.proxies {
		st := p.Stats()
		sum.Conns += st.Conns
		sum.UploadBytes += st.UploadBytes
		sum.DownloadBytes += st.DownloadBytes
		sum.UploadStalls += st.UploadStalls
		sum.DownloadStalls += st.DownloadStalls
		sum.Stalled += st.Stalled
	}
	return sum
}

// Close stops every node and removes their directories.
func (lb *Loopback) Close() {
	if lb.Client != nil {
		_ = lb.Client.Close()
	}
	for _, n := range lb.Nodes {
		_ = n.Close()
	}
	for _, p := range lb.proxies {
		_ = p.Close()
	}
	for _, d := range lb.dirs {
		_ = os.RemoveAll(d)
	}
}

// proxied picks a free loopback port for a node, starts a delayproxy in
// front of it and returns the node's listen and announce addresses.
func (lb *Loopback) proxied(ctx context.Context) (listen, announce string, err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", "", err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close() // the node takes it over (a tiny race, fine for a bench)
	p, err := delayproxy.StartLink(context.WithoutCancel(ctx), "127.0.0.1:0", fmt.Sprintf("127.0.0.1:%d", port), lb.link)
	if err != nil {
		return "", "", err
	}
	lb.proxies = append(lb.proxies, p)
	return fmt.Sprintf("/ip4/127.0.0.1/tcp/%d", port), fmt.Sprintf("/ip4/127.0.0.1/tcp/%d", p.Addr().Port), nil
}

// CheckProxied reports an error unless every outbound connection of every
// node (each connection is outbound on one side) goes to a proxy.
func (lb *Loopback) CheckProxied() error {
	ports := map[string]bool{}
	for _, p := range lb.proxies {
		ports[fmt.Sprint(p.Addr().Port)] = true
	}
	all := append([]*node.Node{lb.Client}, lb.Nodes...)
	n := 0
	for _, nd := range all {
		for _, c := range nd.P2P().Host().Network().Conns() {
			if c.Stat().Direction != network.DirOutbound {
				continue
			}
			port, err := c.RemoteMultiaddr().ValueForProtocol(multiaddr.P_TCP)
			if _, circErr := c.RemoteMultiaddr().ValueForProtocol(multiaddr.P_CIRCUIT); circErr == nil || err != nil || !ports[port] {
				return fmt.Errorf("connection %s -> %s bypasses the delay proxies (or is relayed)", c.LocalMultiaddr(), c.RemoteMultiaddr())
			}
			n++
		}
	}
	if n == 0 {
		return fmt.Errorf("no connections between the nodes")
	}
	return nil
}
