package node

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/fetch"
	"github.com/neuron-tai/meshp2p/placement"
	"github.com/neuron-tai/meshp2p/route"
)

// FetchConfig makes a node without a local model file download only the
// tensors of its layers (docs/fetch.md): from peers serving the model, or
// from a GGUF file on an HTTP server by range requests.
type FetchConfig struct {
	// Model is a model name or fingerprint (fetched from peers), or an
	// http:// or https:// URL of a whole GGUF file.
	Model string
	// Wait bounds how long to wait for peers that serve the model (or, for
	// a URL, for a peer with its manifest) (0: DefaultFetchWait).
	Wait time.Duration
	// Progress, if set, gets bytes in hand, total, rate and time left.
	Progress func(done, total int64, rate float64, eta time.Duration)
}

// DefaultFetchWait is how long a fetch waits for peers that serve the model.
const DefaultFetchWait = 60 * time.Second

// urlManifestWait bounds how long a URL fetch looks for a peer with the
// file's manifest before it concludes it is the model's first node; it
// concludes so sooner once two advert pulls from connected peers showed
// no candidate.
const urlManifestWait = 20 * time.Second

// IsURL reports whether model names an HTTP(S) URL.
func IsURL(model string) bool {
	return strings.HasPrefix(model, "http://") || strings.HasPrefix(model, "https://")
}

// manifestPath is where a node keeps the manifest of model fp.
func manifestPath(dataDir, fp string) string {
	return filepath.Join(dataDir, "shards", fp[:16], "manifest")
}

// ensureManifest returns the manifest of the whole model at modelPath,
// building it (one hashing pass) when the fingerprint pass did not (nil
// when the header is too large for a manifest).
func ensureManifest(ctx context.Context, dataDir, modelPath, fp string) ([]byte, error) {
	mp := manifestPath(dataDir, fp)
	if m, err := gguf.ReadManifestFile(mp, fp); err == nil {
		return m.Marshal(), nil
	}
	m, err := gguf.BuildManifest(ctx, modelPath, nil)
	if errors.Is(err, gguf.ErrTooLarge) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if m.Fingerprint() != fp {
		return nil, fmt.Errorf("%s changed: fingerprint %.16s, expected %.16s", modelPath, m.Fingerprint(), fp)
	}
	b := m.Marshal()
	return b, writeAtomic(mp, b)
}

func writeAtomic(p string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

// fetchShard downloads the shard of n.cfg.Layers and returns its path. The
// p2p host is up (peers are the sources and the manifest's holders).
func (n *Node) fetchShard(ctx context.Context) (string, error) {
	fc := n.cfg.Fetch
	if n.cfg.Layers == nil && n.cfg.Placement == nil {
		return "", errors.New("fetching a model needs a layer range (--layers A-B) or placement (--memory)")
	}
	r := n.cfg.Layers
	if fc.Wait <= 0 {
		fc.Wait = DefaultFetchWait
	}
	if IsURL(fc.Model) {
		return n.fetchURL(ctx, fc, r)
	}
	return n.fetchPeers(ctx, fc, r)
}

// waitPeers waits until pred holds for the table, re-pulling adverts and
// asking the DHT for key every second. pred gets how many of those pulls
// ran while connected to at least one peer.
func (n *Node) waitPeers(ctx context.Context, wait time.Duration, key string, pred func(synced int) bool) bool {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	changed := n.table.Changed()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	synced := 0
	for {
		if pred(synced) {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-changed:
		case <-tick.C:
			lctx, c := context.WithTimeout(ctx, time.Second)
			if n.p2p.PeerCount() > 0 {
				n.p2p.Discovery().Sync(lctx)
				synced++
			}
			if key != "" {
				_, _ = n.p2p.Discovery().Lookup(lctx, key)
			}
			c()
		}
	}
}

// cachedShard finds a verified shard of layers r of model (a fingerprint or
// a name) fetched earlier, so a restart needs no peer.
func (n *Node) cachedShard(ctx context.Context, model string, r gguf.Range) string {
	pat := filepath.Join(n.cfg.P2P.DataDir, "shards", "*", fmt.Sprintf("%s.L%d-%d.gguf", safeName(model, strings.Repeat("x", 16)), r.Start, r.End))
	if route.ValidFingerprint(model) {
		pat = filepath.Join(n.cfg.P2P.DataDir, "shards", model[:16], fmt.Sprintf("*.L%d-%d.gguf", r.Start, r.End))
	}
	paths, _ := filepath.Glob(pat)
	for _, p := range paths {
		si, err := gguf.VerifyShard(ctx, p)
		if err == nil && si.Range == r && (!route.ValidFingerprint(model) || si.ParentFingerprint == model) {
			return p
		}
	}
	return ""
}

// chooseFetchRange picks the window of a fetched model without --layers
// with the placement code, from the header's sizes and the swarm now (fp
// may be "" for the first node of a model: no other windows are known),
// and sets up the node's placement: once it serves the window it
// rebalances like a node with the whole file, fetching the window it
// moves to (fetchWindow).
func (n *Node) chooseFetchRange(ctx context.Context, f *gguf.File, fp string) (gguf.Range, error) {
	sz, in, err := fileSizing(f, n.cfg.Engine)
	if err != nil {
		return gguf.Range{}, err
	}
	nl, err := f.NLayer()
	if err != nil {
		return gguf.Range{}, err
	}
	budget, src := n.cfg.Placement.Memory, "--memory"
	if budget <= 0 {
		if budget, src, err = placement.Budget(); err != nil {
			return gguf.Range{}, err
		}
	}
	seed := n.cfg.Placement.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	n.fp, n.nLayer = fp, nl
	n.settle(ctx)
	c, ok := placement.Choose(n.view(ctx), sz, budget, 0, nil, rng)
	if !ok {
		return gguf.Range{}, fmt.Errorf("memory budget %s (%s) holds no window of this model; pass a larger --memory or --layers", mib(budget), src)
	}
	n.placement = &placementState{cfg: *n.cfg.Placement, sizing: sz, budget: budget, rng: rng, nEmbd: in.NEmbd, arch: in.Architecture,
		shardFor: n.fetchWindow}
	r := gguf.Range{Start: c.Range.Start, End: c.Range.End}
	if fp != "" {
		// Like a node with the file: announce the window (others
		// starting now see it while this one fetches), pause, reconsider.
		if r, err = n.announceChoice(ctx, n.placement, c); err != nil {
			return r, err
		}
	}
	n.log.Info("placement chose the layers to fetch (a move later fetches the new window)", "range", r.String(), "why", choiceWhy(c), "budget", mib(budget))
	return r, nil
}

// fetchSources are the shards of model fp (with nl layers) that can send
// their tensors and the manifest now: loaded windows of other peers. A
// planned window (announced, no session slot) holds no tensors yet: a
// node fetching or cutting it would only answer "not served here".
func (n *Node) fetchSources(fp string, nl int) []route.Shard {
	var out []route.Shard
	for _, s := range n.table.Shards(fp) {
		if s.Peer != n.p2p.ID() && s.NLayer == nl && s.Capacity.GetMaxSessions() > 0 {
			out = append(out, s)
		}
	}
	return out
}

// MoveProgressInterval is how often a move's fetch logs its progress (a
// move runs in the background: a log line, not a progress bar).
const MoveProgressInterval = 10 * time.Second

// fetchedModel is what a self-placing node that fetched its window needs
// to fetch another: the verified manifest, the shard files' base name,
// and the URL (nil: from peers).
type fetchedModel struct {
	m    *gguf.Manifest
	base string
	url  *fetch.URL
}

// recordFetched records where a self-placing node's model comes from (nothing
// for a node given --layers).
func (n *Node) recordFetched(fm *fetchedModel) {
	if n.placement != nil {
		n.placement.fetched = fm
	}
}

// fetchWindow is placementState.shardFor of a self-placing node without
// the model file: it fetches layers r like the start did (planFetch,
// staging, verification against the manifest), from the peers that serve
// them now or by range requests from the URL. The tensors of the window
// it serves now are staged from its own shard, not downloaded again.
func (n *Node) fetchWindow(ctx context.Context, r gguf.Range) (string, error) {
	fm := n.placement.fetched
	if fm == nil {
		return "", errors.New("no manifest to fetch a window with")
	}
	fp := fm.m.Fingerprint()
	pl, err := n.planFetch(ctx, fm.m, fm.base, r, func(done, total int64, rate float64, eta time.Duration) {
		n.log.Info("placement: fetching the new window", "layers", r.String(), "done", mib(done), "of", mib(total),
			"MiB_per_s", fmt.Sprintf("%.1f", rate/(1<<20)), "eta", eta.Round(time.Second))
	})
	if err != nil {
		return "", err
	}
	if pl.cached {
		return pl.out, nil
	}
	pl.p.Interval = MoveProgressInterval
	n.mu.Lock()
	cur := n.shardPath
	n.mu.Unlock()
	reused := n.stageHeld(ctx, pl, fm.m, cur)
	t0 := time.Now()
	if fm.url != nil {
		n.log.Info("placement: downloading the new window's tensors by HTTP range requests", "url", fm.url.URL, "layers", r.String(),
			"bytes", pl.p.Total, "reused_from_current_window", reused)
		err = fm.url.FetchTensors(ctx, pl.st, fm.m, pl.ts, pl.p)
	} else {
		var sources []fetch.Source
		for _, s := range n.fetchSources(fp, n.nLayer) {
			sources = append(sources, fetch.Source{Peer: s.Peer, Start: s.Start, End: s.End})
		}
		n.log.Info("placement: fetching the new window's tensors from peers", "layers", r.String(), "tensors", len(pl.ts),
			"bytes", pl.p.Total, "reused_from_current_window", reused, "sources", len(sources))
		fe := &fetch.Fetcher{Host: n.host, Stage: pl.st, Log: n.log, Progress: pl.p}
		err = fe.Fetch(ctx, fm.m, fp, pl.ts, sources)
	}
	if err != nil {
		return "", fmt.Errorf("fetching layers %s: %w", r, err)
	}
	pl.p.Finish()
	n.log.Info("fetched", "bytes", pl.p.Downloaded(), "took", time.Since(t0).Round(time.Millisecond))
	return n.assemble(ctx, pl.st, fm.m, r, pl.out)
}

// stageHeld copies into pl's staging the tensors pl needs that the shard
// at path (the window the node serves) holds, each checked against the
// manifest like a download; it returns the bytes staged.
func (n *Node) stageHeld(ctx context.Context, pl *fetchPlan, m *gguf.Manifest, path string) int64 {
	if path == "" {
		return 0
	}
	f, err := gguf.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	names, _, err := gguf.ShardSourceNames(f)
	if err != nil {
		return 0
	}
	var staged int64
	for _, t := range pl.ts {
		name, ok := names[t.Name]
		if !ok || ctx.Err() != nil {
			continue
		}
		st, ok := f.Tensor(name)
		h := m.DataHash(t)
		if !ok || st.Bytes != t.Bytes || pl.st.Have(h, int64(t.Bytes)) {
			continue
		}
		if err := pl.st.Put(h, int64(t.Bytes), f.TensorData(st)); err != nil {
			n.log.Debug("tensor not reused from the current window", "tensor", t.Name, "err", err)
			continue
		}
		staged += int64(t.Bytes)
	}
	return staged
}

func (n *Node) fetchPeers(ctx context.Context, fc *FetchConfig, rp *gguf.Range) (string, error) {
	if rp != nil {
		if p := n.cachedShard(ctx, fc.Model, *rp); p != "" {
			n.log.Info("using cached fetched shard", "path", p)
			return p, nil
		}
	}
	key := NameKey(fc.Model)
	if route.ValidFingerprint(fc.Model) {
		key = fc.Model
	}
	var fp string
	var nl int
	var resolveErr error
	ok := n.waitPeers(ctx, fc.Wait, key, func(int) bool {
		fp, nl, resolveErr = n.table.Resolve(fc.Model)
		return resolveErr == nil
	})
	if !ok {
		if err := ctx.Err(); err != nil {
			return "", err
		}
		if err := n.p2p.NoPeersError(); err != nil {
			return "", fmt.Errorf("fetch %s: %w", fc.Model, err)
		}
		return "", fmt.Errorf("fetch %s: after %s: %w", fc.Model, fc.Wait, resolveErr)
	}
	n.settleTable(ctx)
	name := n.cfg.ModelName
	var sources []fetch.Source
	var peers []peer.ID
	for _, s := range n.fetchSources(fp, nl) {
		sources = append(sources, fetch.Source{Peer: s.Peer, Start: s.Start, End: s.End})
		peers = append(peers, s.Peer)
		if name == "" {
			name = s.ModelName
		}
	}
	var m *gguf.Manifest
	mp := manifestPath(n.cfg.P2P.DataDir, fp)
	if cached, err := gguf.ReadManifestFile(mp, fp); err == nil {
		m = cached
	} else {
		var raw []byte
		if m, raw, err = fetch.FetchManifest(ctx, n.host, peers, fp, nil, n.log); err != nil {
			return "", err
		}
		if err := writeAtomic(mp, raw); err != nil {
			return "", err
		}
	}
	var r gguf.Range
	if rp != nil {
		r = *rp
	} else {
		var err error
		if r, err = n.chooseFetchRange(ctx, m.File, fp); err != nil {
			return "", err
		}
	}
	if err := gguf.ValidateRanges([]gguf.Range{r}, nl); err != nil {
		return "", fmt.Errorf("--layers %s: %w", r, err)
	}
	n.recordFetched(&fetchedModel{m: m, base: safeName(name, fp)})
	pl, err := n.planFetch(ctx, m, safeName(name, fp), r, fc.Progress)
	if err != nil {
		return "", err
	}
	if pl.cached {
		return pl.out, nil
	}
	n.log.Info("fetching layers from peers", "model", fp, "layers", r.String(), "tensors", len(pl.ts), "bytes", pl.p.Total, "sources", len(sources))
	t0 := time.Now()
	fe := &fetch.Fetcher{Host: n.host, Stage: pl.st, Log: n.log, Progress: pl.p}
	if err := fe.Fetch(ctx, m, fp, pl.ts, sources); err != nil {
		return "", err
	}
	pl.p.Finish()
	n.log.Info("fetched", "bytes", pl.p.Downloaded(), "took", time.Since(t0).Round(time.Millisecond), "MiB_per_s", fmt.Sprintf("%.1f", pl.p.Rate()/(1<<20)))
	return n.assemble(ctx, pl.st, m, r, pl.out)
}

// fetchPlan is a fetch of layers r of a verified manifest: the shard file
// it writes, the tensors it needs, their staging directory and progress.
// cached: out already holds a valid shard, nothing to fetch.
type fetchPlan struct {
	out    string
	cached bool
	ts     []*gguf.TensorInfo
	st     *fetch.Stage
	p      *fetch.Progress
}

// planFetch lays out the fetch of layers r of model m (named base) in the
// model's shard cache directory, or finds the shard already there.
func (n *Node) planFetch(ctx context.Context, m *gguf.Manifest, base string, r gguf.Range, progress func(done, total int64, rate float64, eta time.Duration)) (*fetchPlan, error) {
	fp := m.Fingerprint()
	dir := filepath.Join(n.cfg.P2P.DataDir, "shards", fp[:16])
	pl := &fetchPlan{out: filepath.Join(dir, gguf.ShardName(base, r))}
	if _, err := gguf.CheckShard(ctx, pl.out, fp, r); err == nil {
		n.log.Info("using cached fetched shard", "path", pl.out)
		pl.cached = true
		return pl, nil
	}
	var err error
	if pl.ts, err = gguf.ShardSources(m.File, r); err != nil {
		return pl, err
	}
	pl.st = &fetch.Stage{Dir: filepath.Join(dir, "staging")}
	pl.p = fetch.NewProgress(distinctBytes(m, pl.ts), progress)
	return pl, nil
}

func (n *Node) assemble(ctx context.Context, st *fetch.Stage, m *gguf.Manifest, r gguf.Range, out string) (string, error) {
	res, err := st.Assemble(ctx, m, r, out)
	if err != nil {
		if errors.Is(err, gguf.ErrSourceChanged) {
			_ = st.Remove() // a staged file changed on disk: fetch again next time
		}
		return "", err
	}
	_ = st.Remove()
	n.log.Info("shard written from fetched tensors", "path", res.Path, "bytes", res.Size)
	return res.Path, nil
}

func distinctBytes(m *gguf.Manifest, ts []*gguf.TensorInfo) int64 {
	seen := map[gguf.Digest]bool{}
	var total int64
	for _, t := range ts {
		if h := m.DataHash(t); !seen[h] {
			seen[h] = true
			total += int64(t.Bytes)
		}
	}
	return total
}

// safeName is a file-name-safe model name (the fingerprint prefix if none).
func safeName(name, fp string) string {
	ok := name != "" && len(name) <= 128
	for _, c := range name {
		if !(c == '-' || c == '_' || c == '.' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			ok = false
		}
	}
	if !ok || strings.HasPrefix(name, ".") {
		return fp[:16]
	}
	return name
}

func (n *Node) fetchURL(ctx context.Context, fc *FetchConfig, rp *gguf.Range) (string, error) {
	u := &fetch.URL{URL: fc.Model, Log: n.log}
	f, hdr, err := u.Header(ctx)
	if err != nil {
		return "", err
	}
	nl, err := f.NLayer()
	if err != nil {
		return "", err
	}
	base := "model"
	if pu, err := url.Parse(fc.Model); err == nil {
		base = strings.TrimSuffix(path.Base(pu.Path), ".gguf")
	}
	if n.cfg.ModelName != "" {
		base = n.cfg.ModelName
	}
	hh := sha256.Sum256(hdr)
	// Does a peer have the manifest of this file? Ask every peer that
	// serves a model with this layer count.
	var m *gguf.Manifest
	if len(n.cfg.P2P.Bootstrap) > 0 {
		var peers []peer.ID
		n.waitPeers(ctx, urlManifestWait, "", func(synced int) bool {
			// Ask first the peers of the model most peers serve: a
			// manifest is only as good as the header it matches, and a
			// lone peer could offer one with wrong tensor hashes.
			votes := map[string]map[peer.ID]bool{}
			fpOf := map[peer.ID]string{}
			for _, s := range n.table.Shards("") {
				if s.NLayer != nl {
					continue
				}
				if votes[s.Fingerprint] == nil {
					votes[s.Fingerprint] = map[peer.ID]bool{}
				}
				votes[s.Fingerprint][s.Peer] = true
				fpOf[s.Peer] = s.Fingerprint
			}
			peers = peers[:0]
			for p := range fpOf {
				peers = append(peers, p)
			}
			sort.Slice(peers, func(i, j int) bool {
				vi, vj := len(votes[fpOf[peers[i]]]), len(votes[fpOf[peers[j]]])
				return vi > vj || (vi == vj && peers[i] < peers[j])
			})
			peers = peers[:min(len(peers), 16)]
			return len(peers) > 0 || synced >= 2
		})
		if len(peers) > 0 {
			var raw []byte
			if m, raw, err = fetch.FetchManifest(ctx, n.host, peers, "", hh[:], n.log); err == nil {
				_ = writeAtomic(manifestPath(n.cfg.P2P.DataDir, m.Fingerprint()), raw)
			} else {
				n.log.Info("no peer has a manifest for this file", "err", err)
				m = nil
			}
		}
	}
	var r gguf.Range
	if rp != nil {
		r = *rp
	} else {
		fp := ""
		if m != nil {
			fp = m.Fingerprint()
		}
		if r, err = n.chooseFetchRange(ctx, f, fp); err != nil {
			return "", err
		}
	}
	if err := gguf.ValidateRanges([]gguf.Range{r}, nl); err != nil {
		return "", fmt.Errorf("--layers %s: %w", r, err)
	}
	if m != nil {
		fp := m.Fingerprint()
		if m.File.Size != u.Size() {
			return "", fmt.Errorf("fetch %s: the swarm's manifest of model %.16s is for a %d-byte file, the server's is %d bytes", fc.Model, fp, m.File.Size, u.Size())
		}
		n.recordFetched(&fetchedModel{m: m, base: safeName(base, fp), url: u})
		pl, err := n.planFetch(ctx, m, safeName(base, fp), r, fc.Progress)
		if err != nil {
			return "", err
		}
		if pl.cached {
			return pl.out, nil
		}
		n.log.Info("downloading only this node's tensors by HTTP range requests, verified against a peer's manifest",
			"url", fc.Model, "model", fp, "layers", r.String(), "bytes", pl.p.Total, "file_bytes", u.Size())
		if err := u.FetchTensors(ctx, pl.st, m, pl.ts, pl.p); err != nil {
			return "", err
		}
		pl.p.Finish()
		return n.assemble(ctx, pl.st, m, r, pl.out)
	}
	// First node of this model: nobody can vouch for the file, so stream it
	// once to compute the fingerprint, keeping only our tensors.
	ts, err := gguf.ShardSources(f, r)
	if err != nil {
		return "", err
	}
	keep := map[string]bool{}
	for _, t := range ts {
		keep[t.Name] = true
	}
	n.log.Warn("no peer has this model's manifest: this is its first node, so the whole file is streamed once to compute the fingerprint; only this node's layers are kept on disk",
		"url", fc.Model, "layers", r.String(), "file_bytes", u.Size())
	st := &fetch.Stage{Dir: filepath.Join(n.cfg.P2P.DataDir, "shards", "url-"+hex.EncodeToString(hh[:8]))}
	p := fetch.NewProgress(u.Size()-f.DataOffset, fc.Progress)
	m, err = u.StreamAll(ctx, st, f, hdr, func(t *gguf.TensorInfo) bool { return keep[t.Name] }, p)
	if err != nil {
		return "", err
	}
	p.Finish()
	fp := m.Fingerprint()
	n.log.Info("fingerprint of the streamed model", "fingerprint", fp)
	if err := writeAtomic(manifestPath(n.cfg.P2P.DataDir, fp), m.Marshal()); err != nil {
		return "", err
	}
	n.recordFetched(&fetchedModel{m: m, base: safeName(base, fp), url: u})
	out := filepath.Join(n.cfg.P2P.DataDir, "shards", fp[:16], gguf.ShardName(safeName(base, fp), r))
	return n.assemble(ctx, st, m, r, out)
}

// settleTable pulls adverts from the connected peers once more and waits
// until the table has not changed for 250 ms (at most 2 s), so a fetch
// starts with every source a pull batch named, not the first one applied.
func (n *Node) settleTable(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	changed := n.table.Changed()
	n.p2p.Discovery().Sync(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-time.After(250 * time.Millisecond):
			return
		}
	}
}

// followTable feeds the capability table while the node fetches (before
// Start's own follower runs); the returned func stops it.
func (n *Node) followTable() func() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); route.Follow(ctx, n.p2p.Discovery(), n.table) }()
	return func() { cancel(); <-done }
}

// serveFetch makes a self-placing node (which holds the whole file) serve
// the manifest and its current window's tensors to fetchers.
func (n *Node) serveFetch(ctx context.Context, shardPath string) {
	if n.manifest == nil {
		mb, err := ensureManifest(ctx, n.cfg.P2P.DataDir, n.cfg.ModelPath, n.fp)
		if err != nil {
			n.log.Warn("no manifest to serve to fetchers", "err", err)
		}
		n.manifest = mb
	}
	if err := n.fetchSrv.Add(n.fp, shardPath, n.manifest); err != nil {
		n.log.Warn("tensors not served to fetchers", "err", err)
	}
}
