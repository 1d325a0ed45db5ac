package p2p

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/event"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/host/eventbus"
	manet "github.com/multiformats/go-multiaddr/net"
	"golang.org/x/time/rate"

	"github.com/neuron-tai/meshp2p/p2p/peerlimit"
)

// Advert sync: pull on connect.
//
// Gossip only carries adverts published while a peer listens, and nodes
// re-publish every RepublishInterval (2 minutes): a newcomer would see an
// empty swarm until then. So when identify completes on a connection to a
// peer that speaks the sync protocol, the node pulls from it, once, a
// bounded batch of the signed adverts it holds: its own first, then the
// freshest of its table. Every advert in the batch is verified on its own
// signature exactly as gossip is (advertChecker.open, signer = the record's
// peer); a peer can hand over other peers' adverts but cannot forge or alter
// one. Pulled adverts enter the table only if newer than what is there and
// than the newest seq gossip has shown for that peer; they do not update the
// gossip replay state, so the same advert arriving later by gossip is still
// accepted and forwarded to the mesh.
//
// Bounds: a batch holds at most syncMaxAdverts adverts and syncMaxBytes
// bytes (both sides enforce them); each peer may pull from us syncBurst
// times at once and then once per syncRefill (a token bucket per peer,
// p2p/peerlimit, at most syncMaxBuckets tracked: past it the least
// recently seen peer is forgotten); we pull from one peer at most once per
// syncRepull (the last syncMaxBuckets pulls are remembered), and at most
// syncParallel pulls run at once.
const (
	syncMaxAdverts  = 512
	syncMaxBytes    = 2 << 20
	syncBurst       = 5
	syncRefill      = 2 * time.Second
	syncMaxBuckets  = 4096
	syncRepull      = 2 * time.Second
	syncParallel    = 4
	syncTimeout     = 10 * time.Second
	syncFollowUp    = 3 * time.Second
	syncServiceName = "meshp2p.advert-sync"
)

// ErrSyncRefused is returned by a pull the peer refused (rate limit).
var ErrSyncRefused = errors.New("advert sync refused by peer")

// syncState is the pull-on-connect bookkeeping of one Discovery.
type syncState struct {
	serve *peerlimit.Limiter // pulls peers make from us

	mu     sync.Mutex
	pulled *peerlimit.Table[time.Time] // last pull from each peer
	looks  *peerlimit.Table[pullLook]  // what each peer's pulls gave (advertsettle.go)
	sem    chan struct{}
}

func newSyncState() *syncState {
	return &syncState{
		serve:  peerlimit.NewLimiter(rate.Every(syncRefill), syncBurst, syncMaxBuckets),
		pulled: peerlimit.NewTable[time.Time](syncMaxBuckets),
		looks:  peerlimit.NewTable[pullLook](syncMaxBuckets),
		sem:    make(chan struct{}, syncParallel),
	}
}

// allow takes one token from p's bucket.
func (s *syncState) allow(p peer.ID, now time.Time) bool {
	return s.serve.Allow(p, now)
}

// claim reports whether a pull from p may start now (none in the last
// syncRepull), and records it.
func (s *syncState) claim(p peer.ID, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if at, ok := s.pulled.Peek(p); ok && now.Sub(at) < syncRepull {
		return false
	}
	s.pulled.Put(p, now)
	return true
}

// syncLoop pulls from every peer whose identification completes and that
// speaks the sync protocol.
func (d *Discovery) syncLoop(sub event.Subscription) {
	defer d.wg.Done()
	defer sub.Close()
	for {
		select {
		case <-d.ctx.Done():
			return
		case e, ok := <-sub.Out():
			if !ok {
				return
			}
			ev, ok := e.(event.EvtPeerIdentificationCompleted)
			if !ok {
				continue
			}
			if ev.ObservedAddr != nil && manet.IsPublicAddr(ev.ObservedAddr) {
				d.observedPublic.Store(true)
			}
			d.identified.Store(true)
			if !slices.Contains(ev.Protocols, d.syncPID) {
				continue
			}
			d.pullAsync(ev.Peer)
			d.followUp(ev.Peer)
		}
	}
}

// subscribeIdentify subscribes to identify completions (for syncLoop).
func (d *Discovery) subscribeIdentify() (event.Subscription, error) {
	return d.n.host.EventBus().Subscribe(new(event.EvtPeerIdentificationCompleted), eventbus.Name("meshp2p advert sync"))
}

// followUp pulls from p once more syncFollowUp after connecting. Adverts
// that reach p while we connect (a node that joined a moment before us
// publishes its first advert) miss both our first pull and, until p's
// gossip mesh includes us, p's forwarding; the second pull closes that
// window (found with a tracker swarm: one of six adverts missing for the
// whole 2-minute republish interval).
func (d *Discovery) followUp(p peer.ID) {
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		t := time.NewTimer(syncFollowUp)
		defer t.Stop()
		select {
		case <-d.ctx.Done():
			return
		case <-t.C:
		}
		if d.n.host.Network().Connectedness(p) == network.Connected {
			d.pullAsync(p)
		}
	}()
}

// pullAsync starts a pull from p unless one ran within syncRepull.
func (d *Discovery) pullAsync(p peer.ID) {
	if p == d.n.host.ID() || !d.sync.claim(p, time.Now()) {
		return
	}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		d.pullLimited(d.ctx, p)
	}()
}

// Sync pulls adverts from every connected peer that speaks the sync
// protocol (each at most once per syncRepull) and waits for the pulls, or
// for ctx. It returns how many adverts were new or newer. Callers waiting
// for a model use it instead of waiting for the next gossip round.
func (d *Discovery) Sync(ctx context.Context) int {
	h := d.n.host
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		total int
	)
	now := time.Now()
	for _, p := range h.Network().Peers() {
		if ok, _ := h.Peerstore().SupportsProtocols(p, d.syncPID); len(ok) == 0 {
			continue
		}
		if !d.sync.claim(p, now) {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := d.pullLimited(ctx, p)
			mu.Lock()
			total += n
			mu.Unlock()
		}()
	}
	wg.Wait()
	return total
}

// pullLimited pulls from p once a pull slot is free (syncParallel at a
// time) and returns how many adverts were new or newer.
func (d *Discovery) pullLimited(ctx context.Context, p peer.ID) int {
	select {
	case d.sync.sem <- struct{}{}:
	case <-ctx.Done():
		return 0
	}
	defer func() { <-d.sync.sem }()
	began := time.Now()
	d.sync.pullBegins(p, began)
	n, err := d.pull(ctx, p)
	d.sync.pullEnds(p, began, err == nil)
	if err != nil {
		d.log.Debug("advert sync failed", "peer", p, "err", err)
		return n
	}
	d.log.Debug("advert sync", "peer", p, "new", n)
	return n
}

// handleSyncStream serves one pull: the asker half-closes; we answer with a
// status byte (1: batch follows, 0: refused, rate limit), then adverts as
// uvarint length + signed envelope, our own first, then the freshest of the
// table, ending with a zero length.
func (d *Discovery) handleSyncStream(s network.Stream) {
	defer s.Close()
	if err := s.Scope().SetService(syncServiceName); err != nil {
		s.Reset()
		return
	}
	_ = s.SetDeadline(time.Now().Add(syncTimeout))
	if !d.sync.allow(s.Conn().RemotePeer(), time.Now()) {
		_, _ = s.Write([]byte{0})
		return
	}
	batch := d.syncBatch(s.Conn().RemotePeer(), time.Now())
	buf := make([]byte, 0, 1+len(batch)*binary.MaxVarintLen32+sumLen(batch)+1)
	buf = append(buf, 1)
	for _, env := range batch {
		buf = binary.AppendUvarint(buf, uint64(len(env)))
		buf = append(buf, env...)
	}
	buf = append(buf, 0)
	if _, err := s.Write(buf); err != nil {
		s.Reset()
	}
}

func sumLen(bs [][]byte) int {
	n := 0
	for _, b := range bs {
		n += len(b)
	}
	return n
}

// syncBatch picks what one pull gets: the local advert, then fresh table
// entries newest first (never the asker's own), within the batch bounds.
func (d *Discovery) syncBatch(asker peer.ID, now time.Time) [][]byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out [][]byte
	size := 0
	add := func(env []byte) bool {
		if len(out) >= syncMaxAdverts || size+len(env)+binary.MaxVarintLen32 > syncMaxBytes {
			return false
		}
		out = append(out, env)
		size += len(env) + binary.MaxVarintLen32
		return true
	}
	if d.localEnv != nil && !d.leaving {
		add(d.localEnv)
	}
	entries := make([]*Advert, 0, len(d.table))
	for p, ad := range d.table {
		if p != asker && ad.env != nil && ad.ExpiresAt.After(now) {
			entries = append(entries, ad)
		}
	}
	slices.SortFunc(entries, func(a, b *Advert) int { return b.IssuedAt.Compare(a.IssuedAt) })
	for _, ad := range entries {
		if !add(ad.env) {
			break
		}
	}
	return out
}

// pull asks p for its batch and ingests every advert that verifies. A bad
// advert in the batch is skipped (and counted against nothing else); a
// batch that breaks the bounds ends the pull.
func (d *Discovery) pull(ctx context.Context, p peer.ID) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, syncTimeout)
	defer cancel()
	s, err := d.n.NewStream(ctx, p, d.syncPID)
	if err != nil {
		return 0, err
	}
	defer s.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = s.SetDeadline(dl)
	}
	_ = s.CloseWrite()
	fresh := 0
	err = readSyncBatch(s, maxEnvelopeSize(d.cfg), func(env []byte) {
		if d.ingestPulled(env, time.Now()) {
			fresh++
		}
	})
	if err != nil && !errors.Is(err, ErrSyncRefused) {
		s.Reset()
	}
	return fresh, err
}

// readSyncBatch decodes one sync response (status byte, then uvarint
// length + envelope until a zero length) and hands each envelope to fn. It
// enforces the batch bounds and allocates only what has arrived.
func readSyncBatch(rd io.Reader, maxEnv int, fn func(env []byte)) error {
	r := &byteReader{r: rd}
	status, err := r.ReadByte()
	if err != nil {
		return fmt.Errorf("reading sync status: %w", err)
	}
	switch status {
	case 1:
	case 0:
		return ErrSyncRefused
	default:
		return fmt.Errorf("%w: sync status %d", ErrAdvertMalformed, status)
	}
	total := 0
	for i := 0; ; i++ {
		size, err := binary.ReadUvarint(r)
		if err != nil {
			return fmt.Errorf("reading advert %d length: %w", i, err)
		}
		if size == 0 {
			return nil
		}
		if i >= syncMaxAdverts || size > uint64(maxEnv) || total+int(size) > syncMaxBytes {
			return fmt.Errorf("%w: sync batch over its bounds (advert %d, %d bytes)", ErrAdvertOversized, i, size)
		}
		total += int(size)
		env := make([]byte, size)
		if _, err := io.ReadFull(rd, env); err != nil {
			return fmt.Errorf("reading advert %d: %w", i, err)
		}
		fn(env)
	}
}

// ingestPulled verifies one pulled envelope on its own signature and
// applies it. It reports whether the table changed.
func (d *Discovery) ingestPulled(env []byte, now time.Time) bool {
	signer, err := envelopeSigner(env)
	if err != nil {
		d.log.Debug("pulled advert rejected", "err", err)
		return false
	}
	rec, err := d.checker.open(signer, env, now)
	if err != nil {
		d.log.Debug("pulled advert rejected", "signer", signer, "err", err)
		return false
	}
	if rec.Withdrawn || rec.Peer == d.n.host.ID() {
		return false
	}
	if last, ok := d.checker.lastSeen(rec.Peer); ok && rec.Seq < last {
		return false // gossip already showed something newer (or a tombstone)
	}
	return d.ingest(rec, env, now)
}
