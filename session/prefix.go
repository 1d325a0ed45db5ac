package session

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// The prefix cache at every hop (docs/architecture.md, "Prefix cache").
// A hop keeps the KV of a finished session's first positions; a later
// session whose tokens start the same way reuses them and the origin sends
// only the rest of its prompt. Hops after the head never see tokens, so
// the origin names a prefix by a chain of block hashes (PrefixChain) and
// each hop keys its entries by that chain within a scope (prefixScope).
//
// Whose KV may serve whom: only sessions of the same origin (the peer
// that signed the open) and, within it, the same namespace (a user of a
// gateway: GenerateRequest.CacheNamespace) reuse each other's cells. The
// reason is the timing: a prompt that reuses a cached prefix gets its
// first token sooner, so whoever can time requests could learn, one block
// at a time, what another user's prompt began with. The chain starts from
// a seed derived from the origin's private key and the namespace
// (PrefixSeed): two origins' or namespaces' chains never meet, and a hop
// cannot test a guessed prompt against a chain. Beyond the tokens, an
// entry serves only a session whose hidden states at this hop come from
// the same computation: the same model and layers here (the engine's
// cache is per shard, of one kernel class), the same wire dtype, and the
// same peers, ranges and kernel classes at every hop before this one.

// PrefixBlock is how many tokens each hash of a prefix chain covers: a
// session reuses whole blocks only.
const PrefixBlock = 32

// MaxPrefixBlocks bounds a chain (the open's, and with a close's
// continuation): 32768 positions, 16 KiB of hashes.
const MaxPrefixBlocks = 1024

// prefixHashLen is the bytes of each block's hash on the wire.
const prefixHashLen = 16

// PrefixSession is implemented by engine sessions with a prefix cache
// (node/shardengine over engine.Session).
type PrefixSession interface {
	// Adopt gives a session with no rows yet the longest prefix of p its
	// shard's cache holds: the session then starts at the returned
	// position, a multiple of p.Block; on the head the positions' tokens
	// come back too.
	Adopt(ctx context.Context, p Prefix) (int, []int32, error)
	// Keep makes Close keep the session's first positions: the whole
	// blocks p's hashes cover, up to its position then.
	Keep(p Prefix)
}

// Prefix is the engine's key for a session's first positions.
type Prefix struct {
	Owner    string // whose entry it is ("" for a trusted origin: no share)
	Scope    [32]byte
	AltScope [32]byte // the session's own scope (sessionScope)
	Block    int
	Hashes   [][16]byte
	// KeepTail keeps the positions past the whole blocks too, for this
	// session's own later epochs (a session that did not close cleanly).
	KeepTail bool
	// Epoch is the keeping session's epoch.
	Epoch uint64
	// Own is how many positions this session's own earlier epochs kept
	// that the adopter may take past whole blocks (PrefixChain.own), and
	// OwnFor bounds that for what epoch k kept (PrefixChain.earlier).
	Own    int
	OwnFor func(k uint64) int
}

// MaxEarlierEpochs bounds PrefixChain.earlier: a session re-routed more
// often adopts whole blocks only.
const MaxEarlierEpochs = 64

// ownFor is the bound on the tail of an entry a hop kept in epoch k, for
// an epoch opened with chain c: the own of the first epoch after k.
func ownFor(c *meshp2pb.PrefixChain) func(k uint64) int {
	return func(k uint64) int {
		for _, eo := range c.GetEarlier() {
			if eo.GetEpoch() > k {
				return int(min(eo.GetOwn(), c.GetOwn()))
			}
		}
		return int(c.GetOwn())
	}
}

// PrefixSeed is where an origin's prefix chains start for namespace: a
// keyed hash of its private key, so only the origin can compute its chains
// and they stay the same across its restarts (a gateway keeps its key).
func PrefixSeed(key crypto.PrivKey, namespace string) [16]byte {
	var seed [16]byte
	raw, err := key.Raw()
	if err != nil {
		return seed
	}
	m := hmac.New(sha256.New, raw)
	m.Write([]byte("meshp2p/prefix-seed/v1\x00"))
	m.Write([]byte(namespace))
	copy(seed[:], m.Sum(nil))
	return seed
}

// chainBlocks appends to hashes the blocks [len(hashes), n) of toks
// (n·PrefixBlock ≤ len(toks)), each hash chained on the one before (seed
// for the first).
func chainBlocks(seed [16]byte, hashes []byte, toks []int32, n int) []byte {
	prev := seed
	if k := len(hashes) / prefixHashLen; k > 0 {
		copy(prev[:], hashes[(k-1)*prefixHashLen:])
	}
	buf := make([]byte, 0, prefixHashLen+4*PrefixBlock)
	for b := len(hashes) / prefixHashLen; b < n; b++ {
		buf = append(buf[:0], prev[:]...)
		for _, t := range toks[b*PrefixBlock : (b+1)*PrefixBlock] {
			buf = binary.LittleEndian.AppendUint32(buf, uint32(t))
		}
		d := sha256.Sum256(buf)
		copy(prev[:], d[:])
		hashes = append(hashes, prev[:]...)
	}
	return hashes
}

// prefixOf is the chain of an epoch's prefill input: its whole blocks
// before the last token (the tail must compute the last row to sample).
func prefixOf(seed [16]byte, input []int32) *meshp2pb.PrefixChain {
	n := min((len(input)-1)/PrefixBlock, MaxPrefixBlocks)
	return &meshp2pb.PrefixChain{BlockTokens: PrefixBlock, Hashes: chainBlocks(seed, nil, input, n)}
}

// prefixMore continues chain over fed, the tokens an epoch fed the route
// (its input, then the tokens it committed but the last, which no hop has
// computed yet): what a clean close tells the hops to keep.
func prefixMore(seed [16]byte, chain *meshp2pb.PrefixChain, fed []int32) []byte {
	have := slices.Clone(chain.GetHashes())
	n := min(len(fed)/PrefixBlock, MaxPrefixBlocks)
	if n*prefixHashLen <= len(have) {
		return nil
	}
	return chainBlocks(seed, have, fed, n)[len(have):]
}

// validChain reports whether c is a chain this hop can use: its block
// size, whole hashes, within MaxPrefixBlocks (together with more).
func validChain(c *meshp2pb.PrefixChain, more []byte) bool {
	n := len(c.GetHashes()) + len(more)
	return c.GetBlockTokens() == PrefixBlock && len(c.GetHashes())%prefixHashLen == 0 &&
		len(more)%prefixHashLen == 0 && n <= MaxPrefixBlocks*prefixHashLen && len(c.GetEarlier()) <= MaxEarlierEpochs
}

func splitHashes(b []byte) [][16]byte {
	out := make([][16]byte, len(b)/prefixHashLen)
	for i := range out {
		copy(out[i][:], b[i*prefixHashLen:])
	}
	return out
}

// prefixScope is what must match besides the tokens for this hop's cells
// to serve another session (see the rule above): origin and namespace
// (the seed, in the chain), model, this hop's range and kernel class,
// wire dtype, and every hop before this one.
func (hs *hopSession) prefixScope() [32]byte {
	d := sha256.New()
	field := func(b []byte) {
		d.Write(binary.AppendUvarint(nil, uint64(len(b))))
		d.Write(b)
	}
	field([]byte("meshp2p/prefix-scope/v1"))
	field([]byte(hs.origin))
	field([]byte(hs.open.GetModelFingerprint()))
	field([]byte(hs.h.cfg.KernelClass))
	field(binary.AppendUvarint(nil, uint64(hs.wire)))
	hops := hs.hops()
	for _, x := range hops[:hs.idx+1] {
		field(x.GetPeerId())
		field(binary.AppendUvarint(binary.AppendUvarint(nil, uint64(x.GetStart())), uint64(x.GetEnd())))
		field([]byte(x.GetKernelClass()))
	}
	var s [32]byte
	copy(s[:], d.Sum(nil))
	return s
}

// sessionScope is prefixScope for this session's later epochs: the same
// but for the session id in place of the peers of the hops before this
// one. A re-routed session reuses what this hop computed in its previous
// epoch whichever peers now serve the ranges before it: their rows are
// bitwise the same (the same ranges and kernel classes), and the only
// hidden states the old peers gave it are those the session already
// generated its tokens from. Whose KV serves whom is unchanged: only the
// origin that signed both epochs has this session id.
func (hs *hopSession) sessionScope() [32]byte {
	d := sha256.New()
	field := func(b []byte) {
		d.Write(binary.AppendUvarint(nil, uint64(len(b))))
		d.Write(b)
	}
	field([]byte("meshp2p/prefix-session-scope/v1"))
	field([]byte(hs.origin))
	field(hs.open.GetSessionId())
	field([]byte(hs.open.GetModelFingerprint()))
	field([]byte(hs.h.cfg.KernelClass))
	field(binary.AppendUvarint(nil, uint64(hs.wire)))
	hops := hs.hops()
	for _, x := range hops[:hs.idx+1] {
		field(binary.AppendUvarint(binary.AppendUvarint(nil, uint64(x.GetStart())), uint64(x.GetEnd())))
		field([]byte(x.GetKernelClass()))
	}
	var s [32]byte
	copy(s[:], d.Sum(nil))
	return s
}

// enginePrefix is the engine's key for this session's first positions:
// the open's chain and more (a clean close's continuation).
func (hs *hopSession) enginePrefix(more []byte) Prefix {
	p := Prefix{Scope: hs.prefixScope(), AltScope: hs.sessionScope(), Block: PrefixBlock, Hashes: splitHashes(append(slices.Clone(hs.open.GetPrefix().GetHashes()), more...)),
		KeepTail: !hs.closing.Load(), Epoch: hs.key.Epoch, Own: int(hs.open.GetPrefix().GetOwn()), OwnFor: ownFor(hs.open.GetPrefix())}
	if !hs.h.cfg.TrustedOrigins[hs.origin] {
		p.Owner = string(hs.origin)
	}
	return p
}

// adoptPrefix (admission) adopts the longest prefix of the open's chain
// this hop's cache holds: hs.cached positions, and on the head their
// tokens (the speculative proposer's history).
func (hs *hopSession) adoptPrefix() {
	ps, ok := hs.eng.(PrefixSession)
	if !ok || !validChain(hs.open.GetPrefix(), nil) {
		return
	}
	n, toks, err := ps.Adopt(context.Background(), hs.enginePrefix(nil))
	if err != nil {
		hs.h.log.Debug("prefix cache: adopt failed", "session", hs.key, "err", err)
		return
	}
	hs.cached, hs.cachedToks = n, toks
	if ik, ok := hs.eng.(InputKeeper); ok && n > 0 {
		hs.cachedRows = ik.AdoptedInputs // a copy: taken beside the session (hopTranscripts.adopted)
	}
}

// keepPrefix (before the engine session closes) has the engine keep the
// session's blocks: the open's chain, continued by a clean close's.
func (hs *hopSession) keepPrefix() {
	ps, ok := hs.eng.(PrefixSession)
	more := hs.prefixMore.Load()
	var m []byte
	if more != nil {
		m = *more
	}
	if !validChain(hs.open.GetPrefix(), m) {
		m = nil // a torn continuation: the open's blocks still hold
	}
	if !ok || !validChain(hs.open.GetPrefix(), m) {
		return
	}
	ps.Keep(hs.enginePrefix(m))
}

// accepted is the acceptance this hop sends upstream: the positions every
// hop from here to the tail holds (the minimum with what the next hop
// said), and each one's.
func (hs *hopSession) accepted() *meshp2pb.StreamMessage {
	msg := acceptance(hs.open)
	if hs.open.GetPrefix() == nil {
		return msg
	}
	acc := msg.GetAccept()
	acc.CachedTokens = uint32(hs.cached)
	if !hs.tail {
		acc.CachedTokens = min(acc.CachedTokens, hs.downCached.GetCachedTokens())
	}
	acc.Progress = hs.tail || hs.downCached.GetProgress()
	acc.HopCached = append([]uint32{uint32(hs.cached)}, hs.downCached.GetHopCached()...)
	if len(acc.HopCached) > len(hs.route) {
		acc.HopCached = acc.HopCached[:len(hs.route)]
	}
	if hs.tail || len(hs.downCached.GetHopReplay()) > 0 {
		acc.HopReplay = append([]uint32{uint32(hs.replayTo)}, hs.downCached.GetHopReplay()...)
		if len(acc.HopReplay) > len(hs.route) {
			acc.HopReplay = acc.HopReplay[:len(hs.route)]
		}
	}
	return msg
}

// startAt (the session's first frame, a) settles where this hop starts:
// the epoch's plan (planStarts) or a's position. It drops the adopted
// positions above that start: the origin recomputes them, because a hop
// after this one holds fewer, or it knows nothing of the cache.
func (hs *hopSession) startAt(a *meshp2pb.ActivationHeader, from peer.ID) error {
	if !hs.started.CompareAndSwap(false, true) {
		return nil
	}
	pos, err := hs.planStarts(a, from)
	if err != nil {
		return err
	}
	if hs.sp != nil && pos > 0 && pos <= len(hs.cachedToks) {
		hs.sp.history(hs.cachedToks[:pos])
	}
	hs.tx.adopted(min(pos, hs.cached), hs.cachedToks, hs.cachedRows)
	hs.cachedToks, hs.cachedRows = nil, nil
	if pos >= hs.cached {
		return nil
	}
	if err := hs.eng.Truncate(context.Background(), pos); err != nil {
		return engineErr(err, from, hs.h.host.ID())
	}
	return nil
}

// withPrefix puts the chain of the epoch's prefill input in open (unless
// the origin's prefix cache is off) and remembers it for the close.
func (e *epochRun) withPrefix(o *Origin, open *meshp2pb.SessionOpen, input []int32, namespace string, res *Result) {
	if o.NoPrefixCache {
		return
	}
	e.seed, e.input = PrefixSeed(o.Key, namespace), input
	e.chain = prefixOf(e.seed, input)
	// The open must stay one header (a 32 KiB grammar and a re-routed
	// session's tokens share it): the chain gives way, the blocks it
	// drops are only not reused.
	room := frame.DefaultMaxHeader - proto.Size(open) - 1024
	if h := e.chain.GetHashes(); len(h) > room {
		e.chain.Hashes = h[:max(0, room/prefixHashLen*prefixHashLen)]
	}
	if res.Reroutes > 0 && len(res.owns) < MaxEarlierEpochs {
		// A re-routed epoch: every hop computed the rows of every token
		// fed before the last from those tokens (speculative rows past
		// the last rejection are above it), so it may adopt what its old
		// epoch held of them, past whole blocks; what an older epoch
		// kept, only below the own of the epoch after it (earlier).
		e.chain.Own = uint32(len(input) - 1)
		e.chain.Earlier = slices.Clone(res.owns)
		res.owns = append(res.owns, &meshp2pb.EpochOwn{Epoch: open.GetEpoch(), Own: e.chain.Own})
	}
	open.Prefix = e.chain
}

// cachedFrom is where the epoch's prefill starts at each hop (starts;
// nil: everywhere at the returned position, the head's): from what each
// hop said it holds of the open's chain and can re-send from its records
// (its accept: hop_cached, hop_replay; hopStarts). Every count must be
// whole blocks of the chain the open sent, or within what a re-routed
// epoch may adopt of its own (PrefixChain.own). It records the figures in
// res.
func (e *epochRun) cachedFrom(res *Result, prompt int) (int, []uint32, error) {
	res.cachedFrom, res.CachedTokens, res.HopCached = 0, 0, nil
	if e.chain == nil {
		return 0, nil, nil
	}
	acc, k := e.accept, len(e.rt.Hops)
	n := int(acc.GetCachedTokens())
	blocks := len(e.chain.GetHashes()) / prefixHashLen
	if !ownCount(e.chain, uint32(n)) || len(acc.GetHopCached()) > k || len(acc.GetHopReplay()) > k {
		return 0, nil, fmt.Errorf("head %s answered %d cached positions for %d hops, of a prefix of %d", e.head, n, len(acc.GetHopCached()), blocks*PrefixBlock)
	}
	for _, c := range acc.GetHopCached() {
		if !ownCount(e.chain, c) {
			return 0, nil, fmt.Errorf("head %s answered %d cached positions at a hop, of a prefix of %d", e.head, c, blocks*PrefixBlock)
		}
		res.HopCached = append(res.HopCached, int(c))
	}
	res.cachedFrom, res.CachedTokens = n, min(n, prompt)
	if len(acc.GetHopCached()) != k || len(acc.GetHopReplay()) != k {
		return n, nil, nil // an older hop: every hop from the minimum
	}
	starts := hopStarts(res.HopCached, acc.GetHopReplay())
	if !slices.ContainsFunc(starts, func(s uint32) bool { return s != starts[0] }) {
		return int(starts[0]), nil, nil
	}
	res.cachedFrom = int(slices.Max(starts))
	return int(starts[0]), starts, nil
}

// ownCount reports whether a hop may hold n positions of chain c: whole
// blocks of it, or what a re-routed epoch may adopt of its own (c.own).
func ownCount(c *meshp2pb.PrefixChain, n uint32) bool {
	return n%PrefixBlock == 0 && int(n) <= len(c.GetHashes())/prefixHashLen*PrefixBlock || n <= c.GetOwn()
}

// hopStarts is where each hop starts computing, from the positions it
// holds (cached) and those whose frames it can re-send the next hop
// (replay), tail first: a hop starts where its cache ends unless the next
// hop starts lower and its records do not reach that far, and then where
// the next hop starts (it recomputes the rows the next hop needs). So a
// session re-routed around one failed hop recomputes that hop's layers
// and, on the hops after it, only what none of them held.
func hopStarts(cached []int, replay []uint32) []uint32 {
	k := len(cached)
	s := make([]uint32, k)
	s[k-1] = uint32(cached[k-1])
	for i := k - 2; i >= 0; i-- {
		c := uint32(cached[i])
		if c > s[i+1] && replay[i] < c {
			c = s[i+1]
		}
		s[i] = c
	}
	return s
}

// progress (origin) sends the head the chain over the epoch's input and
// the tokens committed so far (toks) but the last, each time it grows by
// a block, when every hop takes it (SessionAccept.progress): hops whose
// session ends by a failure keep those blocks too (SessionProgress).
func (e *epochRun) progress(toks []int32) {
	if e.chain == nil || !e.accept.GetProgress() || len(toks) == 0 {
		return
	}
	n := min((len(e.input)+len(toks)-1)/PrefixBlock, MaxPrefixBlocks)
	if n <= e.sentBlocks || n*prefixHashLen <= len(e.chain.GetHashes()) {
		return
	}
	e.sentBlocks = n
	p := &meshp2pb.SessionProgress{SessionId: e.sid[:], Epoch: e.rt.Epoch, PrefixMore: e.prefixMore(toks)}
	msg := &meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Progress{Progress: p}}
	_ = e.w.WriteStream(msg) // a failed write fails the next read
	e.feed.message(msg)
}

// progress (hop) takes the origin's chain so far (SessionProgress): kept
// if the session ends before its close, and passed on down the route and
// to a standby. A torn or shorter continuation is ignored.
func (hs *hopSession) progress(msg *meshp2pb.StreamMessage) error {
	more := msg.GetProgress().GetPrefixMore()
	if cur := hs.prefixMore.Load(); !validChain(hs.open.GetPrefix(), more) || (cur != nil && len(*cur) >= len(more)) {
		return nil
	}
	hs.prefixMore.Store(&more)
	hs.mirror.message(msg)
	if hs.tail || hs.standby {
		return nil
	}
	if hs.head {
		hs.progressOut.Store(msg) // sent before the next frame (writeDown)
		return nil
	}
	if err := hs.down.Send(msg, WriteDeadline(hs.h.cfg.Idle)); err != nil {
		return linkErr("send to next hop", err, hs.route[hs.idx+1], hs.h.host.ID())
	}
	return nil
}

// prefixMore is the close's continuation of the open's chain over the
// epoch's input and the tokens it committed (toks), but the last.
func (e *epochRun) prefixMore(toks []int32) []byte {
	if e.chain == nil || len(toks) == 0 {
		return nil
	}
	return prefixMore(e.seed, e.chain, append(slices.Clone(e.input), toks[:len(toks)-1]...))
}
