// Package testswarm starts in-process loopback swarms of real nodes for
// tests outside package node (the API's and the client's end-to-end
// tests): shard nodes on the test preset, client peers on the client
// preset, as `start` and `generate` run them, and a client.Client over a
// client peer. Its own tests are the API's end-to-end tests over a real
// swarm (api_e2e_test.go): here, not in api/, so that fuzzing api (make
// fuzz) does not build llama.cpp with fuzz instrumentation.
package testswarm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/client"
	"github.com/neuron-tai/meshp2p/client/enginevocab"
	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/node"
	"github.com/neuron-tai/meshp2p/session"
)

// Net is a swarm of in-process nodes on loopback; the first node started
// is everyone's bootstrap peer.
type Net struct {
	t       testing.TB
	Network string
	boot    []peer.AddrInfo
}

var seq atomic.Int64

// New returns an empty swarm with a network name of its own.
func New(t testing.TB) *Net {
	return &Net{t: t, Network: fmt.Sprintf("ts%d-%d", os.Getpid(), seq.Add(1))}
}

func (tn *Net) config(dir string) node.Config {
	pc := node.Preset(node.PresetTest)
	pc.Network, pc.DataDir, pc.Bootstrap = tn.Network, dir, tn.boot
	// One test client stands in for many (concurrent sessions): no
	// per-session cap or per-origin quota but the engine's.
	return node.Config{P2P: pc, Engine: engine.Config{NCtx: 512, NBatch: 64, MaxSessions: 4, Threads: 1},
		Hop: session.HopConfig{Idle: 20 * time.Second, OpenTimeout: 10 * time.Second, MaxSessionKV: -1, MaxSessionsPerPeer: -1, MaxKVPerPeer: -1}}
}

// Shard starts a node serving layers r of model (nil: all), after tweak.
func (tn *Net) Shard(model string, r *gguf.Range, tweak func(*node.Config)) *node.Node {
	tn.t.Helper()
	cfg := tn.config(tn.t.TempDir())
	cfg.ModelPath, cfg.Layers = model, r
	if tweak != nil {
		tweak(&cfg)
	}
	n, err := node.Start(context.Background(), cfg)
	if err != nil {
		tn.t.Fatalf("start node %v: %v", r, err)
	}
	tn.t.Cleanup(func() { n.Close() })
	if tn.boot == nil {
		tn.boot = []peer.AddrInfo{n.P2P().AddrInfo()}
	}
	return n
}

// Peer starts a node without weights on the client preset, as `generate`
// and `serve` do.
func (tn *Net) Peer() *node.Node { return tn.PeerWith(nil) }

// PeerWith is Peer after tweak (e.g. audits: node.Config.AuditRate).
func (tn *Net) PeerWith(tweak func(*node.Config)) *node.Node {
	tn.t.Helper()
	cfg := tn.config(tn.t.TempDir())
	pc := node.TestRelax(node.Preset(node.PresetClient))
	pc.Network, pc.DataDir, pc.Bootstrap, pc.ListenAddrs = cfg.P2P.Network, cfg.P2P.DataDir, cfg.P2P.Bootstrap, cfg.P2P.ListenAddrs
	cfg.P2P = pc
	if tweak != nil {
		tweak(&cfg)
	}
	n, err := node.Start(context.Background(), cfg)
	if err != nil {
		tn.t.Fatal(err)
	}
	tn.t.Cleanup(func() { n.Close() })
	return n
}

// Client is a client.Client over a new client peer, as `serve` builds it.
func (tn *Net) Client() *client.Client { return tn.ClientOn(tn.Peer()) }

// ClientOn is a client.Client over client peer n.
func (tn *Net) ClientOn(n *node.Node) *client.Client {
	tn.t.Helper()
	c, err := client.New(client.Config{Swarm: n.P2P(), Host: n.ControlHost(), Table: n.Table(), Origin: n.Origin(nil),
		LoadVocab: enginevocab.Load, VocabDir: filepath.Join(tn.t.TempDir(), "vocab")})
	if err != nil {
		tn.t.Fatal(err)
	}
	tn.t.Cleanup(c.Close)
	return c
}
