package node

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/node/shardengine"
	"github.com/neuron-tai/meshp2p/p2p"
	"github.com/neuron-tai/meshp2p/proofgossip"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"github.com/neuron-tai/meshp2p/route"
	"github.com/neuron-tai/meshp2p/session"
)

// AuditEngines are the layers a process can replay for audits and proof
// checks: whole model files it holds (each window split once into
// DataDir, then loaded on demand and kept, at most maxAuditShards), and
// a node's own served window. It implements session.AuditEngines.
type AuditEngines struct {
	// Models are whole GGUF models (fingerprinted once, cached in DataDir).
	Models []string
	// DataDir holds the fingerprint cache and the split windows.
	DataDir string
	Threads int
	Logger  *slog.Logger
	// Served, if set, gives the node's own window (nil when none): used
	// when it is exactly the layers asked for.
	Served func() (session.Engine, string)
	// ServedClass is the kernel class of the served window's device
	// (engine.Device.KernelClass; "": the CPU's). Audit windows loaded
	// here run on the CPU.
	ServedClass string

	mu     sync.Mutex
	loaded []*auditShard // most recently used last
}

// maxAuditShards bounds the windows an auditor keeps loaded.
const maxAuditShards = 2

// auditNCtx is the KV cells of an audit shard: the longest session it
// can replay.
const auditNCtx = 8192

type auditShard struct {
	fp         string
	start, end int
	model      *engine.Model
	shard      *engine.Shard
	scratch    string     // the split file to remove with it ("": a cached shard kept)
	mu         sync.Mutex // one replay at a time; guards closed
	closed     bool
}

// take locks s for one replay; false if it was evicted and closed meanwhile.
func (s *auditShard) take() bool {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return false
	}
	return true
}

var _ session.AuditEngines = (*AuditEngines)(nil)

// Engine returns an engine for layers [start, end) of model fp.
func (a *AuditEngines) Engine(ctx context.Context, fp string, start, end int) (session.Engine, string, func(), error) {
	if a.Served != nil {
		if e, sfp := a.Served(); e != nil && sfp == fp && e.Info().Start == start && e.Info().End == end {
			class := a.ServedClass
			if class == "" {
				class = engine.KernelClass()
			}
			return e, class, func() {}, nil
		}
	}
	a.mu.Lock()
	for i, s := range a.loaded {
		if s.fp == fp && s.start == start && s.end == end {
			a.loaded = append(append(a.loaded[:i:i], a.loaded[i+1:]...), s)
			a.mu.Unlock()
			if !s.take() { // evicted between the two locks: load it again
				return a.Engine(ctx, fp, start, end)
			}
			return shardengine.Engine{Model: s.model, Shard: s.shard}, engine.KernelClass(), s.mu.Unlock, nil
		}
	}
	a.mu.Unlock()
	path, err := a.modelFor(ctx, fp)
	if err != nil {
		return nil, "", nil, err
	}
	s, err := a.load(ctx, path, fp, start, end)
	if err != nil {
		return nil, "", nil, err
	}
	if !s.take() {
		return a.Engine(ctx, fp, start, end)
	}
	return shardengine.Engine{Model: s.model, Shard: s.shard}, engine.KernelClass(), s.mu.Unlock, nil
}

// modelFor is the whole model file with fingerprint fp.
func (a *AuditEngines) modelFor(ctx context.Context, fp string) (string, error) {
	log := a.logger()
	for _, m := range a.Models {
		got, _, err := modelFingerprint(ctx, a.DataDir, m, log)
		if err != nil {
			log.Debug("audit model not usable", "path", m, "err", err)
			continue
		}
		if got == fp {
			return m, nil
		}
	}
	return "", fmt.Errorf("%w: no whole model with fingerprint %.16s here (give one with --model)", session.ErrNoAuditor, fp)
}

func (a *AuditEngines) logger() *slog.Logger {
	if a.Logger == nil {
		return slog.Default()
	}
	return a.Logger
}

// load splits and loads one window, evicting the least recently used.
func (a *AuditEngines) load(ctx context.Context, path, fp string, start, end int) (*auditShard, error) {
	if err := os.MkdirAll(a.DataDir, 0o755); err != nil {
		return nil, err
	}
	// A window split only for a replay is removed with it (evicted or
	// closed): proofs for every range of a model made a tracker keep a copy
	// of each (issue 37, row 6: +255 MB of disk for a 40 MB model), so the
	// split windows on disk are bounded like the loaded ones.
	r := gguf.Range{Start: start, End: end}
	var scratch string // path has fingerprint fp (modelFor checked it)
	if p := shardCachePath(a.DataDir, fp, path, r); !exists(p) {
		scratch = p
	}
	shardPath, _, _, err := prepareShard(ctx, a.DataDir, path, r, nil, a.logger())
	if err != nil {
		return nil, fmt.Errorf("audit window %d-%d of %s: %w", start, end, filepath.Base(path), err)
	}
	if scratch != shardPath {
		scratch = ""
	}
	m, err := engine.LoadModel(ctx, shardPath, engine.LoadOptions{})
	if err != nil {
		removeScratch(scratch)
		return nil, err
	}
	sh, err := engine.NewShard(ctx, m, engine.Config{NCtx: auditNCtx, NBatch: 512, MaxSessions: 1, Threads: a.Threads, Logger: a.logger()})
	if err != nil {
		m.Close()
		removeScratch(scratch)
		return nil, err
	}
	s := &auditShard{fp: fp, start: start, end: end, model: m, shard: sh, scratch: scratch}
	a.mu.Lock()
	a.loaded = append(a.loaded, s)
	var evict []*auditShard
	for len(a.loaded) > maxAuditShards {
		evict, a.loaded = append(evict, a.loaded[0]), a.loaded[1:]
	}
	a.mu.Unlock()
	for _, e := range evict {
		e.close()
	}
	return s, nil
}

func (s *auditShard) close() {
	s.mu.Lock() // after its replay
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.closed = true
	_ = s.shard.Close()
	s.model.Close()
	removeScratch(s.scratch)
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// removeScratch removes a window split only for replays ("" : none).
func removeScratch(path string) {
	if path != "" {
		_ = os.Remove(path)
	}
}

// Close frees the loaded windows.
func (a *AuditEngines) Close() {
	a.mu.Lock()
	all := a.loaded
	a.loaded = nil
	a.mu.Unlock()
	for _, s := range all {
		s.close()
	}
}

// audits are a node's audits of its origins' generations (docs/trust.md):
// the auditor, the layers it replays hops with, and the fraud proofs
// gossiped without a tracker (proofgossip).
type audits struct {
	auditor *session.Auditor
	engines *AuditEngines
	proofs  *proofgossip.Gossip // nil when the proofs topic could not be joined
}

// startAudits sets up the audits of a node's origins: served gives the
// node's own window, failures is their memory of blamed and convicted
// peers.
func startAudits(cfg Config, p *p2p.Node, host session.Host, table *route.Table, failures *session.FailureMemory,
	served func() (session.Engine, string)) *audits {
	models := slices.Clone(cfg.AuditModels)
	if cfg.ModelPath != "" {
		models = append(models, cfg.ModelPath)
	}
	// One thread unless the node's engine says otherwise: an audit is one
	// hop's steps, and an origin's replays must not spin a thread pool
	// against the hops' (8 generate processes on 2 cores slowed to a crawl).
	a := &audits{engines: &AuditEngines{Models: models, DataDir: cfg.P2P.DataDir, Threads: max(1, cfg.Engine.Threads), Logger: cfg.Logger,
		ServedClass: cfg.Device.KernelClass(), Served: served}}
	a.auditor = &session.Auditor{Rate: cfg.AuditRate, Engines: a.engines, OnReport: cfg.OnAudit,
		Protocol: host.ProtocolID(session.ProtoAudit, session.ProtoVersion)}
	// Fraud proofs travel without a tracker: this node's convictions are
	// published, and others' are replayed here when this node holds the
	// layers.
	g, err := proofgossip.Start(context.Background(), p.Discovery(), p.ID(), proofgossip.Config{
		Judge: func(ctx context.Context, pr *meshp2pb.Proof) (session.Verdict, error) {
			return session.Judge(ctx, pr, a.engines)
		},
		Convict:   func(pid peer.ID, _ string) { failures.Convict(pid) },
		Suspect:   failures.Blame,
		Convicted: failures.Convicted,
		Serving: func(pid peer.ID) bool {
			return slices.ContainsFunc(table.Shards(""), func(s route.Shard) bool { return s.Peer == pid })
		},
		Logger: cfg.Logger,
	})
	if err != nil {
		cfg.Logger.Warn("fraud proofs will not be gossiped", "err", err)
		return a
	}
	a.proofs = g
	a.auditor.OnReport = func(r session.AuditReport) {
		if r.Proof != nil {
			publishProof(g, r, cfg.Logger)
		}
		if cfg.OnAudit != nil {
			cfg.OnAudit(r)
		}
	}
	return a
}

// publishProof gossips the fraud proof of audit report r.
func publishProof(g *proofgossip.Gossip, r session.AuditReport, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := g.Publish(ctx, r.Proof); err != nil {
		log.Warn("could not gossip the fraud proof", "peer", r.Peer, "err", err)
	}
}

// wait blocks until the audits started ended (nil: none).
func (a *audits) wait() {
	if a != nil {
		a.auditor.Wait()
	}
}

// stop leaves the proofs topic (before the host closes).
func (a *audits) stop() {
	if a != nil {
		a.proofs.Close()
	}
}

// close waits for the audits and closes the windows they loaded.
func (a *audits) close() {
	if a != nil {
		a.auditor.Wait()
		a.engines.Close()
	}
}
