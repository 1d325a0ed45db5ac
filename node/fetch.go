package node

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
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

// shardFetcher downloads only a node's layers (docs/fetch.md): from the
// peers that serve them or by range requests from a URL, verified against
// the model's manifest, staged and assembled into a shard file. It needs
// the network (swarm, the fetch protocols' host, the capability table) and
// the data directory, nothing of the node's serving side; the window is
// --layers or what choose (placement) picks.
type shardFetcher struct {
	cfg     FetchConfig
	dataDir string
	// name is --name, the shard files' base name (default: the name the
	// model's peers advertise, or the URL's file name).
	name string
	// bootstrap: the node has bootstrap peers (a URL fetch asks them for
	// the file's manifest).
	bootstrap bool
	host      fetch.Host
	table     *route.Table
	swarm     swarm
	log       *slog.Logger
	// choose picks the window of a model fetched without --layers from
	// its header and fingerprint ("" for the model's first node); nil for
	// a node given --layers.
	choose func(ctx context.Context, f *gguf.File, fp string) (gguf.Range, error)
}

// fetchedModel is what a self-placing node that fetched its window needs
// to fetch another: the verified manifest, the shard files' base name,
// the model's layer count and the URL (nil: from peers).
type fetchedModel struct {
	m      *gguf.Manifest
	base   string
	nLayer int
	url    *fetch.URL
}

// fetch downloads the shard of layers rp (nil: chosen) and returns its
// path and where the model comes from (nil for a cached shard of
// --layers). The p2p host is up (peers are the sources and the manifest's
// holders).
func (f *shardFetcher) fetch(ctx context.Context, rp *gguf.Range) (string, *fetchedModel, error) {
	if rp == nil && f.choose == nil {
		return "", nil, errors.New("fetching a model needs a layer range (--layers A-B) or placement (--memory)")
	}
	if f.cfg.Wait <= 0 {
		f.cfg.Wait = DefaultFetchWait
	}
	if IsURL(f.cfg.Model) {
		return f.fetchURL(ctx, rp)
	}
	return f.fetchPeers(ctx, rp)
}

// window is rp, or the window choose picks, checked against the model's
// nl layers.
func (f *shardFetcher) window(ctx context.Context, rp *gguf.Range, hf *gguf.File, fp string, nl int) (gguf.Range, error) {
	var r gguf.Range
	if rp != nil {
		r = *rp
	} else {
		var err error
		if r, err = f.choose(ctx, hf, fp); err != nil {
			return r, err
		}
	}
	if err := gguf.ValidateRanges([]gguf.Range{r}, nl); err != nil {
		return r, fmt.Errorf("--layers %s: %w", r, err)
	}
	return r, nil
}

// waitPeers waits until pred holds for the table, re-pulling adverts and
// asking the DHT for key every fetchPoll. pred gets how many of those
// pulls ran while connected to at least one peer.
func (f *shardFetcher) waitPeers(ctx context.Context, wait time.Duration, key string, pred func(synced int) bool) bool {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	changed := f.table.Changed(ctx)
	tick := time.NewTicker(fetchPoll)
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
			lctx, c := context.WithTimeout(ctx, fetchPoll)
			if f.swarm.PeerCount() > 0 {
				f.swarm.Sync(lctx)
				synced++
			}
			if key != "" {
				f.swarm.Lookup(lctx, key)
			}
			c()
		}
	}
}

// settleTable pulls adverts from the connected peers once more and waits
// until the table has not changed for settleTableQuiet (at most
// settleTableMax), so a fetch starts with every source a pull batch named,
// not the first one applied.
func (f *shardFetcher) settleTable(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, settleTableMax)
	defer cancel()
	changed := f.table.Changed(ctx)
	f.swarm.Sync(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-time.After(settleTableQuiet):
			return
		}
	}
}

// cachedShard finds a verified shard of layers r of model (a fingerprint or
// a name) fetched earlier, so a restart needs no peer.
func (f *shardFetcher) cachedShard(ctx context.Context, model string, r gguf.Range) string {
	pat := filepath.Join(f.dataDir, "shards", "*", fmt.Sprintf("%s.L%d-%d.gguf", safeName(model, strings.Repeat("x", 16)), r.Start, r.End))
	if route.ValidFingerprint(model) {
		pat = filepath.Join(f.dataDir, "shards", model[:16], fmt.Sprintf("*.L%d-%d.gguf", r.Start, r.End))
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

// fetchSources are the shards of model fp (with nl layers) that can send
// their tensors and the manifest now: loaded windows of other peers. A
// planned window (announced, no session slot) holds no tensors yet: a
// node fetching or cutting it would only answer "not served here".
func (f *shardFetcher) fetchSources(fp string, nl int) []route.Shard {
	var out []route.Shard
	me := f.swarm.ID()
	for _, s := range f.table.Shards(fp) {
		if s.Peer != me && s.NLayer == nl && s.Capacity.GetMaxSessions() > 0 {
			out = append(out, s)
		}
	}
	return out
}

// fetchWindow is the placement controller's shardFor of a self-placing
// node without the model file: it fetches layers r of fm like the start
// did (planFetch, staging, verification against the manifest), from the
// peers that serve them now or by range requests from the URL. The
// tensors of the window it serves now (the shard file held) are staged
// from that file, not downloaded again.
func (f *shardFetcher) fetchWindow(ctx context.Context, fm *fetchedModel, r gguf.Range, held string) (string, error) {
	if fm == nil {
		return "", errors.New("no manifest to fetch a window with")
	}
	fp := fm.m.Fingerprint()
	pl, err := f.planFetch(ctx, fm.m, fm.base, r, func(done, total int64, rate float64, eta time.Duration) {
		f.log.Info("placement: fetching the new window", "layers", r.String(), "done", mib(done), "of", mib(total),
			"MiB_per_s", fmt.Sprintf("%.1f", rate/(1<<20)), "eta", eta.Round(time.Second))
	})
	if err != nil {
		return "", err
	}
	if pl.cached {
		return pl.out, nil
	}
	pl.p.Interval = MoveProgressInterval
	reused := f.stageHeld(ctx, pl, fm.m, held)
	t0 := time.Now()
	if fm.url != nil {
		f.log.Info("placement: downloading the new window's tensors by HTTP range requests", "url", fm.url.URL, "layers", r.String(),
			"bytes", pl.p.Total, "reused_from_current_window", reused)
		err = fm.url.FetchTensors(ctx, pl.st, fm.m, pl.ts, pl.p)
	} else {
		sources, _, _ := f.peerSources(fp, fm.nLayer)
		f.log.Info("placement: fetching the new window's tensors from peers", "layers", r.String(), "tensors", len(pl.ts),
			"bytes", pl.p.Total, "reused_from_current_window", reused, "sources", len(sources))
		fe := &fetch.Fetcher{Host: f.host, Stage: pl.st, Log: f.log, Progress: pl.p}
		err = fe.Fetch(ctx, fm.m, fp, pl.ts, sources)
	}
	if err != nil {
		return "", fmt.Errorf("fetching layers %s: %w", r, err)
	}
	pl.p.Finish()
	f.log.Info("fetched", "bytes", pl.p.Downloaded(), "took", time.Since(t0).Round(time.Millisecond))
	return f.assemble(ctx, pl.st, fm.m, r, pl.out)
}

// stageHeld copies into pl's staging the tensors pl needs that the shard
// at path (the window the node serves) holds, each checked against the
// manifest like a download; it returns the bytes staged.
func (f *shardFetcher) stageHeld(ctx context.Context, pl *fetchPlan, m *gguf.Manifest, path string) int64 {
	if path == "" {
		return 0
	}
	sf, err := gguf.Open(path)
	if err != nil {
		return 0
	}
	defer sf.Close()
	names, _, err := gguf.ShardSourceNames(sf)
	if err != nil {
		return 0
	}
	var staged int64
	for _, t := range pl.ts {
		name, ok := names[t.Name]
		if !ok || ctx.Err() != nil {
			continue
		}
		st, ok := sf.Tensor(name)
		h := m.DataHash(t)
		if !ok || st.Bytes != t.Bytes || pl.st.Have(h, int64(t.Bytes)) {
			continue
		}
		if err := pl.st.Put(h, int64(t.Bytes), sf.TensorData(st)); err != nil {
			f.log.Debug("tensor not reused from the current window", "tensor", t.Name, "err", err)
			continue
		}
		staged += int64(t.Bytes)
	}
	return staged
}

// fetchPeers fetches from the peers that serve the model (a name or
// fingerprint): resolve it in the table, get its manifest, pick the
// window, download its tensors and assemble the shard.
func (f *shardFetcher) fetchPeers(ctx context.Context, rp *gguf.Range) (string, *fetchedModel, error) {
	if rp != nil {
		if p := f.cachedShard(ctx, f.cfg.Model, *rp); p != "" {
			f.log.Info("using cached fetched shard", "path", p)
			return p, nil, nil
		}
	}
	fp, nl, err := f.resolve(ctx)
	if err != nil {
		return "", nil, err
	}
	f.settleTable(ctx)
	sources, peers, name := f.peerSources(fp, nl)
	m, err := f.peerManifest(ctx, fp, peers)
	if err != nil {
		return "", nil, err
	}
	r, err := f.window(ctx, rp, m.File, fp, nl)
	if err != nil {
		return "", nil, err
	}
	fm := &fetchedModel{m: m, base: safeName(name, fp), nLayer: nl}
	pl, err := f.planFetch(ctx, m, fm.base, r, f.cfg.Progress)
	if err != nil {
		return "", nil, err
	}
	if pl.cached {
		return pl.out, fm, nil
	}
	f.log.Info("fetching layers from peers", "model", fp, "layers", r.String(), "tensors", len(pl.ts), "bytes", pl.p.Total, "sources", len(sources))
	t0 := time.Now()
	fe := &fetch.Fetcher{Host: f.host, Stage: pl.st, Log: f.log, Progress: pl.p}
	if err := fe.Fetch(ctx, m, fp, pl.ts, sources); err != nil {
		return "", nil, err
	}
	pl.p.Finish()
	f.log.Info("fetched", "bytes", pl.p.Downloaded(), "took", time.Since(t0).Round(time.Millisecond), "MiB_per_s", fmt.Sprintf("%.1f", pl.p.Rate()/(1<<20)))
	path, err := f.assemble(ctx, pl.st, m, r, pl.out)
	return path, fm, err
}

// resolve waits (up to the fetch's Wait) until the table resolves the
// model to a fingerprint and layer count.
func (f *shardFetcher) resolve(ctx context.Context) (fp string, nl int, err error) {
	key := NameKey(f.cfg.Model)
	if route.ValidFingerprint(f.cfg.Model) {
		key = f.cfg.Model
	}
	var resolveErr error
	ok := f.waitPeers(ctx, f.cfg.Wait, key, func(int) bool {
		fp, nl, resolveErr = f.table.Resolve(f.cfg.Model)
		return resolveErr == nil
	})
	if ok {
		return fp, nl, nil
	}
	if err := ctx.Err(); err != nil {
		return "", 0, err
	}
	if err := f.swarm.NoPeersError(); err != nil {
		return "", 0, fmt.Errorf("fetch %s: %w", f.cfg.Model, err)
	}
	return "", 0, fmt.Errorf("fetch %s: after %s: %w", f.cfg.Model, f.cfg.Wait, resolveErr)
}

// peerSources are the fetch sources of model fp, their peers, and the
// shard files' name (--name, else the name the first source advertises).
func (f *shardFetcher) peerSources(fp string, nl int) ([]fetch.Source, []peer.ID, string) {
	name := f.name
	var sources []fetch.Source
	var peers []peer.ID
	for _, s := range f.fetchSources(fp, nl) {
		sources = append(sources, fetch.Source{Peer: s.Peer, Start: s.Start, End: s.End})
		peers = append(peers, s.Peer)
		if name == "" {
			name = s.ModelName
		}
	}
	return sources, peers, name
}

// peerManifest is the manifest of model fp: cached, or fetched from peers
// (verified against fp) and cached.
func (f *shardFetcher) peerManifest(ctx context.Context, fp string, peers []peer.ID) (*gguf.Manifest, error) {
	mp := manifestPath(f.dataDir, fp)
	if cached, err := gguf.ReadManifestFile(mp, fp); err == nil {
		return cached, nil
	}
	m, raw, err := fetch.FetchManifest(ctx, f.host, peers, fp, nil, f.log)
	if err != nil {
		return nil, err
	}
	if err := writeAtomic(mp, raw); err != nil {
		return nil, err
	}
	return m, nil
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
func (f *shardFetcher) planFetch(ctx context.Context, m *gguf.Manifest, base string, r gguf.Range, progress func(done, total int64, rate float64, eta time.Duration)) (*fetchPlan, error) {
	fp := m.Fingerprint()
	dir := filepath.Join(f.dataDir, "shards", fp[:16])
	pl := &fetchPlan{out: filepath.Join(dir, gguf.ShardName(base, r))}
	if _, err := gguf.CheckShard(ctx, pl.out, fp, r); err == nil {
		f.log.Info("using cached fetched shard", "path", pl.out)
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

func (f *shardFetcher) assemble(ctx context.Context, st *fetch.Stage, m *gguf.Manifest, r gguf.Range, out string) (string, error) {
	res, err := st.Assemble(ctx, m, r, out)
	if err != nil {
		if errors.Is(err, gguf.ErrSourceChanged) {
			_ = st.Remove() // a staged file changed on disk: fetch again next time
		}
		return "", err
	}
	_ = st.Remove()
	f.log.Info("shard written from fetched tensors", "path", res.Path, "bytes", res.Size)
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

// fetchURL fetches from a web server by range requests: verified against
// a peer's manifest of the file when one has it, else (the model's first
// node) streaming the whole file once to compute the fingerprint.
func (f *shardFetcher) fetchURL(ctx context.Context, rp *gguf.Range) (string, *fetchedModel, error) {
	u := &fetch.URL{URL: f.cfg.Model, Log: f.log}
	hf, hdr, err := u.Header(ctx)
	if err != nil {
		return "", nil, err
	}
	nl, err := hf.NLayer()
	if err != nil {
		return "", nil, err
	}
	hh := sha256.Sum256(hdr)
	m := f.urlManifest(ctx, nl, hh[:])
	fp := ""
	if m != nil {
		fp = m.Fingerprint()
	}
	r, err := f.window(ctx, rp, hf, fp, nl)
	if err != nil {
		return "", nil, err
	}
	if m != nil {
		return f.fetchURLVerified(ctx, u, m, r, nl)
	}
	return f.fetchURLFirst(ctx, u, hf, hdr, r, nl)
}

// urlBase is the shard files' base name of a URL fetch: --name, else the
// URL's file name.
func (f *shardFetcher) urlBase() string {
	if f.name != "" {
		return f.name
	}
	base := "model"
	if pu, err := url.Parse(f.cfg.Model); err == nil {
		base = strings.TrimSuffix(path.Base(pu.Path), ".gguf")
	}
	return base
}

// urlManifest asks the peers serving a model with nl layers for the
// manifest of the file whose header hashes to headerHash (nil: none has
// it, or the node has no bootstrap peers).
func (f *shardFetcher) urlManifest(ctx context.Context, nl int, headerHash []byte) *gguf.Manifest {
	if !f.bootstrap {
		return nil
	}
	var peers []peer.ID
	f.waitPeers(ctx, urlManifestWait, "", func(synced int) bool {
		peers = f.manifestCandidates(nl)
		return len(peers) > 0 || synced >= 2
	})
	if len(peers) == 0 {
		return nil
	}
	m, raw, err := fetch.FetchManifest(ctx, f.host, peers, "", headerHash, f.log)
	if err != nil {
		f.log.Info("no peer has a manifest for this file", "err", err)
		return nil
	}
	_ = writeAtomic(manifestPath(f.dataDir, m.Fingerprint()), raw)
	return m
}

// manifestCandidates are the peers (at most maxManifestPeers) to ask for
// a URL's manifest: those serving a model with nl layers, first the peers
// of the model most peers serve (a manifest is only as good as the header
// it matches, and a lone peer could offer one with wrong tensor hashes).
func (f *shardFetcher) manifestCandidates(nl int) []peer.ID {
	votes := map[string]map[peer.ID]bool{}
	fpOf := map[peer.ID]string{}
	for _, s := range f.table.Shards("") {
		if s.NLayer != nl {
			continue
		}
		if votes[s.Fingerprint] == nil {
			votes[s.Fingerprint] = map[peer.ID]bool{}
		}
		votes[s.Fingerprint][s.Peer] = true
		fpOf[s.Peer] = s.Fingerprint
	}
	peers := make([]peer.ID, 0, len(fpOf))
	for p := range fpOf {
		peers = append(peers, p)
	}
	sort.Slice(peers, func(i, j int) bool {
		vi, vj := len(votes[fpOf[peers[i]]]), len(votes[fpOf[peers[j]]])
		return vi > vj || (vi == vj && peers[i] < peers[j])
	})
	return peers[:min(len(peers), maxManifestPeers)]
}

// fetchURLVerified downloads layers r's tensors by range requests,
// verified against a peer's manifest m of the file.
func (f *shardFetcher) fetchURLVerified(ctx context.Context, u *fetch.URL, m *gguf.Manifest, r gguf.Range, nl int) (string, *fetchedModel, error) {
	fp := m.Fingerprint()
	if m.File.Size != u.Size() {
		return "", nil, fmt.Errorf("fetch %s: the swarm's manifest of model %.16s is for a %d-byte file, the server's is %d bytes", f.cfg.Model, fp, m.File.Size, u.Size())
	}
	fm := &fetchedModel{m: m, base: safeName(f.urlBase(), fp), nLayer: nl, url: u}
	pl, err := f.planFetch(ctx, m, fm.base, r, f.cfg.Progress)
	if err != nil {
		return "", nil, err
	}
	if pl.cached {
		return pl.out, fm, nil
	}
	f.log.Info("downloading only this node's tensors by HTTP range requests, verified against a peer's manifest",
		"url", f.cfg.Model, "model", fp, "layers", r.String(), "bytes", pl.p.Total, "file_bytes", u.Size())
	if err := u.FetchTensors(ctx, pl.st, m, pl.ts, pl.p); err != nil {
		return "", nil, err
	}
	pl.p.Finish()
	path, err := f.assemble(ctx, pl.st, m, r, pl.out)
	return path, fm, err
}

// fetchURLFirst is the fetch of a model's first node: nobody can vouch
// for the file, so it streams it once to compute the fingerprint, keeping
// only layers r's tensors.
func (f *shardFetcher) fetchURLFirst(ctx context.Context, u *fetch.URL, hf *gguf.File, hdr []byte, r gguf.Range, nl int) (string, *fetchedModel, error) {
	ts, err := gguf.ShardSources(hf, r)
	if err != nil {
		return "", nil, err
	}
	keep := map[string]bool{}
	for _, t := range ts {
		keep[t.Name] = true
	}
	f.log.Warn("no peer has this model's manifest: this is its first node, so the whole file is streamed once to compute the fingerprint; only this node's layers are kept on disk",
		"url", f.cfg.Model, "layers", r.String(), "file_bytes", u.Size())
	hh := sha256.Sum256(hdr)
	st := &fetch.Stage{Dir: filepath.Join(f.dataDir, "shards", "url-"+hex.EncodeToString(hh[:8]))}
	p := fetch.NewProgress(u.Size()-hf.DataOffset, f.cfg.Progress)
	m, err := u.StreamAll(ctx, st, hf, hdr, func(t *gguf.TensorInfo) bool { return keep[t.Name] }, p)
	if err != nil {
		return "", nil, err
	}
	p.Finish()
	fp := m.Fingerprint()
	f.log.Info("fingerprint of the streamed model", "fingerprint", fp)
	if err := writeAtomic(manifestPath(f.dataDir, fp), m.Marshal()); err != nil {
		return "", nil, err
	}
	fm := &fetchedModel{m: m, base: safeName(f.urlBase(), fp), nLayer: nl, url: u}
	out := filepath.Join(f.dataDir, "shards", fp[:16], gguf.ShardName(fm.base, r))
	path, err := f.assemble(ctx, st, m, r, out)
	return path, fm, err
}
