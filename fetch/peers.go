package fetch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/neuron-tai/meshp2p/engine/gguf"
	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// Source is a peer that serves layers [Start, End) of a model (from its
// advert); it may also serve the globals those layers' role keeps.
type Source struct {
	Peer       peer.ID
	Start, End int
}

// FetchManifest asks the peers in turn for the manifest of model fp (or,
// with fp empty, for the manifest whose GGUF header hashes to headerHash)
// and returns the first that checks: one that proves fp, or whose header
// has that hash. A peer whose manifest does not check is logged and skipped.
func FetchManifest(ctx context.Context, h Host, peers []peer.ID, fp string, headerHash []byte, log *slog.Logger) (*gguf.Manifest, []byte, error) {
	if log == nil {
		log = slog.Default()
	}
	var errs []error
	for _, p := range peers {
		b, claimed, err := requestManifest(ctx, h, p, fp, headerHash)
		if err == nil {
			want := fp
			if want == "" {
				want = claimed
			}
			var m *gguf.Manifest
			if m, err = gguf.CheckManifest(b, want); err == nil {
				if fp == "" && string(sha256Of(m.Header)) != string(headerHash) {
					err = errors.New("manifest is for another header")
				} else {
					return m, b, nil
				}
			}
			log.Warn("peer sent a manifest that does not check; ignoring it", "peer", p, "err", err)
		}
		errs = append(errs, fmt.Errorf("%s: %w", p, err))
		if ctx.Err() != nil {
			break
		}
	}
	return nil, nil, fmt.Errorf("fetch: no peer of %d sent a valid manifest: %w", len(peers), errors.Join(errs...))
}

func requestManifest(ctx context.Context, h Host, p peer.ID, fp string, headerHash []byte) ([]byte, string, error) {
	ctx, cancel := context.WithTimeout(ctx, RequestTimeout)
	defer cancel()
	s, err := h.NewStream(ctx, p, h.ProtocolID(ProtoManifest, ProtoVersion))
	if err != nil {
		return nil, "", err
	}
	defer s.Close()
	dl, _ := ctx.Deadline()
	_ = s.SetDeadline(dl)
	lim := frame.Limits{MaxHeader: headerLimit, MaxPayload: gguf.MaxManifestBytes}
	if err := frame.NewWriter(s, lim).WriteMessage(&meshp2pb.ManifestRequest{ModelFingerprint: fp, HeaderSha256: headerHash}); err != nil {
		return nil, "", err
	}
	var resp meshp2pb.ManifestResponse
	b, err := frame.NewReader(s, lim).ReadBlob(&resp)
	if err != nil {
		return nil, "", err
	}
	if resp.GetError() != nil {
		return nil, "", frame.FromProto(resp.GetError())
	}
	if uint64(len(b)) != resp.GetSize() {
		return nil, "", fmt.Errorf("manifest of %d bytes, announced %d", len(b), resp.GetSize())
	}
	return b, resp.GetModelFingerprint(), nil
}

// Fetcher downloads tensors of a verified manifest from peers into a Stage:
// at most MaxTransfersPerPeer streams per source and MaxTransfers in all,
// each tensor checked against its hash as it completes. A source that sends
// a bad tensor is dropped for the rest of the fetch (and logged); the
// tensor is fetched from another.
type Fetcher struct {
	Host     Host
	Stage    *Stage
	Log      *slog.Logger
	Progress *Progress // may be nil
	// Attempts bounds how often one tensor is tried (0: DefaultAttempts).
	Attempts int
	// MinRate (bytes/s) and Grace override the package's (0: those): a
	// source slower than MinRate after Grace is given up for that tensor.
	MinRate int64
	Grace   time.Duration
}

// ErrTooSlow means a source sent a tensor slower than the minimum rate.
var ErrTooSlow = errors.New("peer sends too slowly")

// ErrNoSource means no source could deliver a tensor.
var ErrNoSource = errors.New("no peer could send the tensor")

type job struct {
	t        *gguf.TensorInfo
	hash     gguf.Digest
	tried    map[peer.ID]bool
	attempts int
	busy     int // "busy" answers (not failures, up to maxBusy)
}

// Fetch downloads every tensor in ts (of manifest m, model fp) that is not
// staged yet.
func (f *Fetcher) Fetch(ctx context.Context, m *gguf.Manifest, fp string, ts []*gguf.TensorInfo, sources []Source) error {
	log := f.Log
	if log == nil {
		log = slog.Default()
	}
	attempts := f.Attempts
	if attempts <= 0 {
		attempts = DefaultAttempts
	}
	queue := f.pending(m, ts)
	if len(queue) == 0 {
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	_, untied := m.Digests.Global("output.weight")
	r := &fetchRun{f: f, ctx: ctx, cancel: cancel, log: log, fp: fp, attempts: attempts,
		sources: sources, nLayer: len(m.Digests.Layers), untied: untied,
		queue: queue, active: map[peer.ID]int{}, dropped: map[peer.ID]bool{}}
	r.cond = sync.NewCond(&r.mu)
	stop := context.AfterFunc(ctx, func() { r.mu.Lock(); r.cond.Broadcast(); r.mu.Unlock() })
	defer stop()
	var wg sync.WaitGroup
	for w := 0; w < MaxTransfers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.worker()
		}()
	}
	wg.Wait()
	if r.firstErr != nil {
		return r.firstErr
	}
	return ctx.Err()
}

// pending is the queue of jobs for the tensors in ts not staged yet: one
// per distinct data hash (tensors with equal data are fetched once); the
// bytes of those already staged count as progress.
func (f *Fetcher) pending(m *gguf.Manifest, ts []*gguf.TensorInfo) []*job {
	var queue []*job
	seen := map[gguf.Digest]bool{}
	for _, t := range ts {
		h := m.DataHash(t)
		if seen[h] {
			continue
		}
		seen[h] = true
		if f.Stage.Have(h, int64(t.Bytes)) {
			f.Progress.skip(int64(t.Bytes))
			continue
		}
		queue = append(queue, &job{t: t, hash: h, tried: map[peer.ID]bool{}})
	}
	return queue
}

// fetchRun is the state one Fetch shares among its MaxTransfers workers.
// The fields below mu are guarded by it; cond is signalled whenever a
// transfer ends, the queue changes or ctx is done.
type fetchRun struct {
	f        *Fetcher
	ctx      context.Context
	cancel   context.CancelFunc
	log      *slog.Logger
	fp       string
	attempts int
	sources  []Source
	nLayer   int  // the model's layers: which source ranges are head and tail
	untied   bool // the model has its own output.weight

	mu       sync.Mutex
	cond     *sync.Cond
	queue    []*job
	active   map[peer.ID]int // transfers in flight per source
	dropped  map[peer.ID]bool
	running  int
	firstErr error
}

// holds reports whether source s may hold tensor t, by the role its range
// has.
func (r *fetchRun) holds(s Source, t *gguf.TensorInfo) bool {
	if i, ok := layerIndex(t.Name); ok {
		return i >= s.Start && i < s.End
	}
	head, tail := s.Start == 0, s.End == r.nLayer
	switch t.Name {
	case "token_embd.weight":
		return head || (tail && !r.untied)
	case "output.weight":
		return tail
	case "output_norm.weight":
		return head || tail
	}
	return true
}

// nextLocked picks a job and the least loaded source for it and takes the
// job off the queue (mu held), or reports that none can start now.
func (r *fetchRun) nextLocked() (*job, peer.ID, bool) {
	for i, j := range r.queue {
		var best peer.ID
		found, bestLoad := false, 0
		for _, s := range r.sources {
			if r.dropped[s.Peer] || j.tried[s.Peer] || r.active[s.Peer] >= MaxTransfersPerPeer || !r.holds(s, j.t) {
				continue
			}
			if !found || r.active[s.Peer] < bestLoad {
				best, found, bestLoad = s.Peer, true, r.active[s.Peer]
			}
		}
		if found {
			r.queue = append(r.queue[:i], r.queue[i+1:]...)
			return j, best, true
		}
	}
	return nil, "", false
}

// stuckLocked returns a job no source could ever take (all tried or
// dropped), if any (mu held).
func (r *fetchRun) stuckLocked() *job {
	for _, j := range r.queue {
		ok := false
		for _, s := range r.sources {
			if !r.dropped[s.Peer] && !j.tried[s.Peer] && r.holds(s, j.t) {
				ok = true
			}
		}
		if !ok {
			return j
		}
	}
	return nil
}

// worker runs transfers one after the other until the queue is done, the
// fetch failed or ctx is done.
func (r *fetchRun) worker() {
	for {
		j, p, ok := r.take()
		if !ok {
			return
		}
		busy, err := r.transfer(j, p)
		r.settle(j, p, err, busy)
	}
}

// take waits for a job and a source to send it, and counts the transfer
// as running. It reports false when this worker should stop: ctx done, the
// fetch failed, nothing left, or a job no source can ever take (which
// fails the fetch).
func (r *fetchRun) take() (*job, peer.ID, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		if r.ctx.Err() != nil || r.firstErr != nil || (len(r.queue) == 0 && r.running == 0) {
			return nil, "", false
		}
		if j, p, ok := r.nextLocked(); ok {
			r.active[p]++
			r.running++
			return j, p, true
		}
		if r.running == 0 {
			if sj := r.stuckLocked(); sj != nil {
				r.firstErr = fmt.Errorf("fetch: tensor %q: %w (%d sources, %d dropped)", sj.t.Name, ErrNoSource, len(r.sources), len(r.dropped))
				r.cancel() // stop the other transfers
				r.cond.Broadcast()
				return nil, "", false
			}
		}
		r.cond.Wait()
	}
}

// transfer downloads job j from peer p (mu not held). busy: p answered
// NO_CAPACITY and j may ask again (after a short pause, already waited).
func (r *fetchRun) transfer(j *job, p peer.ID) (busy bool, err error) {
	err = r.f.one(r.ctx, p, r.fp, j)
	busy = frame.Code(err) == meshp2pb.ErrorCode_ERROR_CODE_NO_CAPACITY && j.busy < maxBusy
	if busy {
		j.busy++
		// The server has not yet released our previous stream (it
		// does after its last write): not a failure; ask again
		// shortly.
		select {
		case <-r.ctx.Done():
		case <-time.After(busyRetry):
		}
	}
	return busy, err
}

// settle records the end of a transfer of j from p: a busy job goes back
// on the queue, a failed one too until it has failed attempts times (then
// the fetch fails), and a source that sent bad data is dropped.
func (r *fetchRun) settle(j *job, p peer.ID, err error, busy bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.active[p]--
	r.running--
	switch {
	case err == nil:
	case busy:
		r.log.Debug("peer busy; asking again", "peer", p, "tensor", j.t.Name)
	case errors.Is(err, ErrBadData):
		r.log.Warn("peer sent a tensor that does not match the manifest; dropping it for this fetch", "peer", p, "tensor", j.t.Name, "err", err)
		r.dropped[p] = true
	case r.ctx.Err() != nil:
	default:
		r.log.Info("tensor transfer failed; trying another peer", "peer", p, "tensor", j.t.Name, "err", err)
	}
	if busy {
		r.queue = append(r.queue, j)
	} else if err != nil && r.ctx.Err() == nil {
		j.attempts++
		j.tried[p] = true
		if j.attempts >= r.attempts {
			r.firstErr = fmt.Errorf("fetch: tensor %q failed %d times: %w", j.t.Name, j.attempts, err)
			r.cancel()
		} else {
			r.queue = append(r.queue, j)
		}
	}
	r.cond.Broadcast()
}

func layerIndex(name string) (int, bool) {
	s, ok := strings.CutPrefix(name, "blk.")
	if !ok {
		return 0, false
	}
	num, _, _ := strings.Cut(s, ".")
	i := 0
	for _, c := range num {
		if c < '0' || c > '9' {
			return 0, false
		}
		i = i*10 + int(c-'0')
		if i > gguf.MaxLayers {
			return 0, false
		}
	}
	return i, num != ""
}

// one downloads the rest of job j from peer p.
func (f *Fetcher) one(ctx context.Context, p peer.ID, fp string, j *job) error {
	part, err := f.Stage.open(j.hash, int64(j.t.Bytes), true)
	if err != nil {
		return err
	}
	from := part.n
	f.Progress.skip(from)
	done := false
	defer func() {
		if !done {
			f.Progress.unskip(part.n)
			part.close()
		}
	}()
	if part.complete() {
		done = true
		if err := part.finish(); err != nil {
			f.Progress.unskip(int64(j.t.Bytes))
			return err
		}
		return nil
	}
	sctx, cancel := context.WithTimeout(ctx, RequestTimeout)
	s, err := f.Host.NewStream(sctx, p, f.Host.ProtocolID(ProtoTensor, ProtoVersion))
	cancel()
	if err != nil {
		return err
	}
	defer s.Close()
	stop := context.AfterFunc(ctx, func() { _ = s.Reset() })
	defer stop()
	lim := frame.Limits{MaxHeader: headerLimit}
	_ = s.SetDeadline(time.Now().Add(RequestTimeout))
	want := uint64(j.t.Bytes) - uint64(from)
	if err := frame.NewWriter(s, lim).WriteMessage(&meshp2pb.TensorRequest{ModelFingerprint: fp, Name: j.t.Name, Offset: uint64(from), Length: want}); err != nil {
		return err
	}
	var resp meshp2pb.TensorResponse
	fr := frame.NewReader(s, lim)
	if err := fr.ReadMessage(&resp); err != nil {
		return err
	}
	if resp.GetError() != nil {
		return frame.FromProto(resp.GetError())
	}
	if resp.GetLength() != want {
		return fmt.Errorf("%w: peer announced %d bytes, asked %d", ErrBadData, resp.GetLength(), want)
	}
	budget := transferBudget(int64(want), f.MinRate, f.Grace)
	if err := copyIdle(s, part, int64(want), time.Now().Add(budget), f.Progress); err != nil {
		return err
	}
	done = true
	if err := part.finish(); err != nil {
		f.Progress.unskip(int64(j.t.Bytes))
		return err
	}
	return nil
}

// copyIdle copies n bytes from s to w, each read bounded by IdleTimeout,
// and all of them by deadline (ErrTooSlow past it).
func copyIdle(s network.Stream, w io.Writer, n int64, deadline time.Time, p *Progress) error {
	buf := make([]byte, 256<<10)
	total, t0 := n, time.Now()
	for n > 0 {
		now := time.Now()
		if !now.Before(deadline) {
			return fmt.Errorf("%w: %d of %d bytes in %s", ErrTooSlow, total-n, total, now.Sub(t0).Round(time.Millisecond))
		}
		_ = s.SetReadDeadline(now.Add(min(IdleTimeout, deadline.Sub(now))))
		k, err := s.Read(buf[:min(int64(len(buf)), n)])
		if k > 0 {
			if _, werr := w.Write(buf[:k]); werr != nil {
				return werr
			}
			n -= int64(k)
			p.add(int64(k))
		}
		if err != nil && n > 0 {
			if errors.Is(err, io.EOF) {
				return fmt.Errorf("stream ended %d bytes short", n)
			}
			if !time.Now().Before(deadline) {
				return fmt.Errorf("%w: %d of %d bytes in %s (%v)", ErrTooSlow, total-n, total, time.Since(t0).Round(time.Millisecond), err)
			}
			return err
		}
	}
	return nil
}
