package client

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/neuron-tai/meshp2p/demand"
	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/route"
	"github.com/neuron-tai/meshp2p/session"
)

// Config is what a Client runs over: a client peer's pieces (node.Start
// with the client preset gives them: P2P(), ControlHost(), Table(),
// Origin(planner)).
type Config struct {
	// Swarm is the client's peer: discovery (adverts pulled from
	// connected peers, DHT lookups) and why it reaches nobody.
	Swarm *p2p.Node
	// Host opens control streams (the vocabulary protocol): it must not
	// wait for hole punches. Needed by Vocab and Generate.
	Host session.Host
	// Table is the capability table the Swarm's adverts feed.
	Table *route.Table
	// Origin runs route sessions (plans, re-routes, capacity waits).
	// Needed by Generate.
	Origin *session.Origin
	// LoadVocab loads a vocabulary-only GGUF file. Needed by Vocab and
	// Generate.
	LoadVocab VocabLoader
	// VocabDir is where fetched vocabularies are kept (and found again).
	VocabDir string
	// RefreshAdverts, if set, re-pulls adverts from connected peers
	// every RefreshInterval on top of gossip (a long-lived gateway). Not
	// to be confused with Warming: models being loaded by peers.
	RefreshAdverts bool
	Logger         *slog.Logger
	// Demand, if set, counts the generations this client runs and is
	// refused, per model (its node gossips the reports: placement follows
	// demand, docs/placement.md "Many models").
	Demand *demand.Meter
	// Warming bounds how long requests for a model that peers
	// offer to load are answered "warming" (zero: package demand's
	// defaults: 5 min, then 30 min of "not found").
	Warming demand.WarmConfig
}

// Client is the origin side of the swarm for one peer. Close it before the
// peer.
type Client struct {
	cfg Config
	log *slog.Logger

	mu      sync.Mutex
	vocabs  map[string]*vocabEntry
	created map[string]int64 // fingerprint → unix time first listed
	warming *demand.Warm     // models asked for that peers offer (warming.go)
	warmCfg demand.WarmConfig

	ctx    context.Context // ends at Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// New returns a client over cfg.
func New(cfg Config) (*Client, error) {
	if cfg.Swarm == nil || cfg.Table == nil {
		return nil, errors.New("client: Config needs Swarm and Table")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	c := &Client{cfg: cfg, log: log, vocabs: map[string]*vocabEntry{}, created: map[string]int64{}, warming: demand.NewWarm(cfg.Warming)}
	c.warmCfg = c.warming.Config()
	c.ctx, c.cancel = context.WithCancel(context.Background())
	if cfg.RefreshAdverts {
		c.wg.Add(1)
		go func() { defer c.wg.Done(); c.refreshAdverts(c.ctx) }()
	}
	return c, nil
}

// Close stops the client's background work and frees its vocabularies.
func (c *Client) Close() {
	c.cancel()
	c.wg.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	for fp, e := range c.vocabs {
		if e.v != nil { // every fetch has ended (wg)
			e.v.Close()
		}
		delete(c.vocabs, fp)
	}
}

// Table is the capability table the client plans over.
func (c *Client) Table() *route.Table { return c.cfg.Table }

// refreshAdverts keeps the capability table current beyond gossip: a
// periodic pull of the adverts every connected peer holds.
func (c *Client) refreshAdverts(ctx context.Context) {
	t := time.NewTicker(RefreshInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			sctx, cancel := context.WithTimeout(ctx, LookupTimeout)
			c.cfg.Swarm.Discovery().Sync(sctx)
			cancel()
		}
	}
}
