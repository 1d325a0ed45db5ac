package node

import (
	"context"
	"log/slog"
	"path/filepath"
	"regexp"
	"sync"
	"time"

	"github.com/neuron-tai/meshp2p/engine"
	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/fetch"
	"github.com/neuron-tai/meshp2p/session"
	"github.com/neuron-tai/meshp2p/vocab"
)

// served is what a node serves, and its one owner: the node's own model
// (its identity, the layer window placement moves, its vocabulary and
// manifest), the extras (other models served whole beside it, extras.go),
// and the registries that make them reachable: the hop service's engines,
// vocab.Service, fetch.Server and the advert (publish). Each change is one
// call that updates every registry: serveWindow, releaseWindow, setModel,
// addExtra, releaseExtra (windowHost, for the placement controller); what
// one releases is then served by none of them. What the advert says about
// it is built here too (describe, servedview.go).
//
// Locking: mu guards own, win, hop, extras and catalog. It is never held
// across a drain, a file read or written, network I/O or a publish; the
// registries are called outside it. Lock order: advertiser.mu → served.mu
// → placementController.mu, the hop's and the engines' own locks (an
// advert reads placement's planned window and the hop's speed under mu; a
// swap's commit updates placement's state under it). Changes come from
// one goroutine at a time (Start, then the placement controller's loop);
// readers (the advert, status, gauges, audits, Info) come any time.
type served struct {
	log    *slog.Logger
	loader *windowLoader
	kernel string                              // the device's kernel class, advertised
	wrap   func(session.Engine) session.Engine // Config.WrapEngine (tests)
	// publish re-publishes the advert (advertiser.publish); set in Start
	// before anything is served.
	publish func() error

	// Set by listen once the host is up, fixed after.
	host   session.Host
	hopCfg session.HopConfig
	vocab  *vocab.Service
	fetch  *fetch.Server

	mu  sync.Mutex
	own ownModel
	win *loadedShard // the own model's window (nil: none)
	// hop serves the windows and extras to route sessions; it is made
	// with the first window and fixed from then on.
	hop    *session.HopService
	extras map[string]*extraModel
	// catalog are the models a multi-model node may serve (Config.Models;
	// set during Start, read-only after).
	catalog []catalogModel
}

// ownModel is the model a node serves a window of.
type ownModel struct {
	fp, name string
	nLayer   int
	// file is the whole model file windows are cut from, its vocabulary
	// written from and its manifest built from ("": a node serving a
	// pre-cut or fetched shard).
	file     string
	manifest []byte // the model's manifest (nil: none yet)
	vocab    string // the vocabulary file served ("": none)
}

func newServed(cfg Config, ld *windowLoader) *served {
	return &served{log: cfg.Logger, loader: ld, kernel: cfg.Device.KernelClass(), wrap: cfg.hopEngine,
		extras: map[string]*extraModel{}}
}

// listen makes the registries reachable on host: the vocabulary and
// tensor servers now, the hop service (hop: its configuration) with the
// first window.
func (s *served) listen(host session.Host, hop session.HopConfig, uploadLimit, perPeer int64) {
	s.host, s.hopCfg = host, hop
	s.vocab = vocab.NewService(host, hop.Limits, s.log)
	s.fetch = fetch.NewServerLimits(host, uploadLimit, perPeer, s.log)
}

// identify makes m the model of a node that serves one model for life
// (given its layers, a pre-cut shard, a fetched window); nothing is
// registered before its window is served (serveWindow).
func (s *served) identify(m ownModel) {
	s.mu.Lock()
	s.own = m
	s.mu.Unlock()
}

// knowManifest gives the own model a manifest when it has none (a
// fetched model's, verified during the fetch), served with its tensors.
func (s *served) knowManifest(mb []byte) {
	s.mu.Lock()
	if s.own.manifest == nil {
		s.own.manifest = mb
	}
	s.mu.Unlock()
}

// setCatalog sets a multi-model node's models (offered in the advert).
func (s *served) setCatalog(cat []catalogModel) {
	s.mu.Lock()
	s.catalog = cat
	s.mu.Unlock()
}

// setModel makes m the model a self-placing node serves (its own; the
// node must serve no window of the previous one: releaseWindow first):
// the previous model's vocabulary and tensors are no longer served, m's
// vocabulary is, and the advert says so.
func (s *served) setModel(ctx context.Context, m catalogModel) {
	s.mu.Lock()
	prev := s.own.fp
	s.own = ownModel{fp: m.fp, name: m.name, nLayer: m.nLayer, file: m.path}
	s.mu.Unlock()
	if prev != "" && prev != m.fp {
		s.vocab.Remove(prev)
		s.fetch.Remove(prev)
	}
	// The vocabulary of the whole model file, whatever window comes.
	vp := s.loader.vocabFile(m.fp)
	if err := writeVocab(ctx, m.path, vp, m.fp, s.log); err != nil {
		s.log.Warn("vocabulary not served", "err", err)
	} else if err := s.vocab.Add(m.fp, vp); err == nil {
		s.mu.Lock()
		s.own.vocab = vp
		s.mu.Unlock()
	}
	s.advertise("advertise the model")
}

// serveWindow serves ls, a window of the own model: as the first window
// (a new hop service), as the first of a new model (the hop retargeted:
// setModel), or beside the window served now, which stops admitting. It
// serves ls's tensors to fetchers (and its vocabulary, if it has one and
// the node served none), publishes the advert, then lets the old window's
// sessions finish (ending them after DrainTimeout: their origins
// re-route) and closes it. commit runs under mu as the swap becomes
// visible (from: the old window, nil if none), so readers see both
// changes together. It returns how many sessions the drain ended; an error
// (the hop refused ls) changes nothing.
func (s *served) serveWindow(ctx context.Context, ls *loadedShard, commit func(from *gguf.Range)) (int, error) {
	s.mu.Lock()
	fp, hop := s.own.fp, s.hop
	s.mu.Unlock()
	switch {
	case hop == nil:
		cfg := s.hopCfg
		cfg.Fingerprint = fp
		hop = session.NewHopService(s.host, s.wrap(ls.engine()), cfg)
	case hop.Fingerprint() != fp:
		// A multi-model node's new model: its old model's windows were
		// drained (releaseWindow).
		if err := hop.Retarget(fp, s.wrap(ls.engine())); err != nil {
			return 0, err
		}
	default:
		if err := hop.AddEngine(ls.engine()); err != nil {
			return 0, err
		}
	}
	s.mu.Lock()
	old := s.win
	var from *gguf.Range
	if old != nil {
		r := old.window()
		from = &r
	}
	s.win, s.hop = ls, hop
	commit(from)
	s.mu.Unlock()
	if from != nil {
		hop.StopAdmitting(from.Start, from.End)
	}
	s.serveTensors(ctx, fp, ls.path)
	s.serveVocabOf(ctx, ls)
	s.advertise("advertise the new window")
	if old == nil {
		return 0, nil
	}
	return retire(ctx, hop, fp, old), nil
}

// releaseWindow stops serving the own model's window before another loads
// (the node serves none until serveWindow): its tensors are no longer
// served (the model's manifest still is), the advert drops it, its
// sessions drain as in serveWindow and it is closed. It returns the window
// and its shard file; ok is false when none is served.
func (s *served) releaseWindow(ctx context.Context) (from gguf.Range, path string, ended int, ok bool) {
	s.mu.Lock()
	old, hop, m := s.win, s.hop, s.own
	if old == nil || hop == nil {
		s.mu.Unlock()
		return gguf.Range{}, "", 0, false
	}
	s.win = nil
	s.mu.Unlock()
	s.fetch.Remove(m.fp)
	if m.manifest != nil {
		_ = s.fetch.Add(m.fp, "", m.manifest)
	}
	s.advertise("advertise without the released window")
	return old.window(), old.path, retire(ctx, hop, m.fp, old), true
}

// retire lets the sessions on old (a window of model fp) finish, ending
// them after DrainTimeout, closes it and returns how many it ended.
func retire(ctx context.Context, hop *session.HopService, fp string, old *loadedShard) int {
	r := old.window()
	dctx, cancel := context.WithTimeout(ctx, DrainTimeout)
	ended := hop.DrainModel(dctx, fp, r.Start, r.End)
	cancel()
	old.close()
	return ended
}

// serveTensors serves the own model's manifest and window's tensors (the
// shard file at path) to fetchers, building the manifest from the whole
// model file when the node has none.
func (s *served) serveTensors(ctx context.Context, fp, path string) {
	s.mu.Lock()
	m := s.own
	s.mu.Unlock()
	if m.manifest == nil && m.file != "" {
		mb, err := ensureManifest(ctx, s.loader.dataDir, m.file, fp)
		if err != nil {
			s.log.Warn("no manifest to serve to fetchers", "err", err)
		}
		s.mu.Lock()
		s.own.manifest = mb
		s.mu.Unlock()
		m.manifest = mb
	}
	if err := s.fetch.Add(fp, path, m.manifest); err != nil {
		s.log.Warn("tensors not served to fetchers", "err", err)
	}
}

// serveVocabOf serves the vocabulary ls carries when the node serves none
// (a fetched node whose first window was a middle one, which has no
// tokenizer; a node given its layers, at its first window). A node that
// serves one keeps it whatever window it moves to.
func (s *served) serveVocabOf(ctx context.Context, ls *loadedShard) {
	s.mu.Lock()
	have, fp, first := s.own.vocab != "", s.own.fp, s.hop == nil
	s.mu.Unlock()
	if have || !ls.model.Info().HasVocab {
		return
	}
	vp := s.loader.vocabFile(fp)
	if err := writeVocab(ctx, ls.path, vp, fp, s.log); err != nil {
		s.log.Warn("vocabulary not served", "err", err)
		return
	}
	if err := s.vocab.Add(fp, vp); err != nil {
		s.log.Warn("vocabulary not served", "err", err)
		return
	}
	s.mu.Lock()
	s.own.vocab = vp
	s.mu.Unlock()
	if !first {
		s.log.Info("serving the vocabulary of the new window", "file", vp)
	}
}

// advertise publishes the advert after a change, logging a failure.
func (s *served) advertise(what string) {
	if s.publish == nil {
		return
	}
	if err := s.publish(); err != nil {
		s.log.Warn(what, "err", err)
	}
}

// cutOwn cuts (or finds cached) window r of the own model's whole file:
// the placement controller's shardFor on a node with the file.
func (s *served) cutOwn(ctx context.Context, r gguf.Range) (string, error) {
	s.mu.Lock()
	m := s.own
	s.mu.Unlock()
	return s.loader.cut(ctx, m.file, m.fp, r)
}

// stop takes the registries off the host (the node is closing): sessions
// end, nothing more is fetched.
func (s *served) stop() {
	s.mu.Lock()
	hop := s.hop
	s.mu.Unlock()
	if hop != nil {
		hop.Close()
	}
	if s.vocab != nil {
		s.vocab.Close()
	}
	if s.fetch != nil {
		s.fetch.Close()
	}
}

// close closes the loaded window and extras (after stop).
func (s *served) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for fp, e := range s.extras {
		e.ls.close()
		delete(s.extras, fp)
	}
	if s.win != nil {
		s.win.close()
		s.win = nil
	}
}

// modelName is the name a model is advertised under: given, else the
// file name without .gguf (of a shard file cut by `shard split`,
// <model>.L<a>-<b>.gguf, the model's, as the nodes holding the whole file
// advertise it).
func modelName(given, path string) string {
	if given != "" || path == "" {
		return given
	}
	b := filepath.Base(path)
	b = b[:len(b)-len(filepath.Ext(b))]
	if m := shardSuffix.FindStringSubmatch(b); m != nil {
		return m[1]
	}
	return b
}

var shardSuffix = regexp.MustCompile(`^(.+)\.L\d+-\d+$`)

// servedNow is a snapshot of what the node serves.
type servedNow struct {
	fp     string // the own model ("" on a client)
	nLayer int
	// serving: a window is loaded; window is it, path its shard file,
	// msPerLayer its decode time per layer (measured by the hop, else the
	// start-up calibration).
	serving     bool
	window      gguf.Range
	path        string
	msPerLayer  float64
	calibration time.Duration
	extras      map[string]bool // the extras' fingerprints
}

func (s *served) now() servedNow {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := servedNow{fp: s.own.fp, nLayer: s.own.nLayer, extras: map[string]bool{}}
	for fp := range s.extras {
		st.extras[fp] = true
	}
	if s.win == nil {
		return st
	}
	st.serving, st.window, st.path, st.calibration = true, s.win.window(), s.win.path, s.win.calibration
	var measured float32
	if s.hop != nil {
		measured = s.hop.DecodeMsPerLayer()
	}
	st.msPerLayer = float64(measured)
	if measured == 0 {
		st.msPerLayer = float64(float32(float64(st.calibration.Microseconds()) / 1000 / float64(max(1, st.window.Len()))))
	}
	return st
}

// shard is the own model's loaded window (nil: none).
func (s *served) shard() *engine.Shard {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.win == nil {
		return nil
	}
	return s.win.shard
}

// hopService is the hop service (nil before the first window).
func (s *served) hopService() *session.HopService {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hop
}

// capacity is the window's capacity (zero while none is served: a client,
// or a move that released its old window before loading the new).
func (s *served) capacity() engine.Capacity {
	if sh := s.shard(); sh != nil {
		return sh.Capacity()
	}
	return engine.Capacity{}
}
