package engine

/*
#include <stdlib.h>
#include "mp.h"
*/
import "C"

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync/atomic"
)

// The prefix cache keeps the KV cells of finished sessions (Session.Keep)
// so that a new session whose tokens start the same way reuses them
// (Session.Adopt) and computes only the rest. A cached prefix is a
// sequence of its own (an entry) holding the cells of the positions it
// covers; in llama.cpp's unified cache, copying a sequence's cells to
// another sequence (llama_memory_seq_cp) shares them, nothing is copied.
//
// Exactness (docs/architecture.md, "Batch invariance"): an adopted prefix
// is cells the same computation wrote — the same tokens at the same
// positions (the caller's hashes), the same layers, kernel class and inputs
// (the caller's Scope) — so they hold bitwise the values the new session
// would compute, and they lie below every cell in use: the session's own
// rows land above used, so its cells stay in position order, all flash
// attention asks.
//
// Memory: the cache has PrefixCacheCells cells of its own on top of NCtx
// (sessions reserve only NCtx), so live sessions and the cache always fit
// together after a compaction, which restores the live sessions first and
// then the entries, most recently used first, that fit with the rows to
// decode: a live session never fails for the cache. An entry leaves by
// eviction (least recently used first; owners over their share of the
// cells first) into the grave, like a closed session's cells.

// Prefix names the token prefix of a session's first positions.
type Prefix struct {
	// Owner is whose entry this is: under pressure the entries of an
	// owner holding more than its share (1/PrefixOwnerDivisor of the
	// cache) are evicted first. "": nobody's (no share).
	Owner string
	// Scope is everything besides the tokens that decides the cells'
	// values and who may reuse them (the caller hashes it: origin, model
	// range, the hops before this one, wire dtype...). Entries only serve
	// sessions of the same scope.
	Scope [32]byte
	// AltScope (zero: none) is a second scope the entry also serves, and
	// a second one an adopting session may take: a session's own scope
	// (the same session of the same origin, re-routed around a failed hop:
	// its KV is reused whichever peer now computes the hops before).
	AltScope [32]byte
	// Block is how many positions each hash covers (> 0).
	Block int
	// Hashes chain the tokens: Hashes[i] commits to the tokens of
	// positions [0, (i+1)·Block), so equal hashes mean equal prefixes.
	Hashes [][16]byte
	// KeepTail (Keep) keeps every position the session holds, past its
	// whole blocks too (at most MaxTailBlocks blocks more): the tail only
	// its own session's later epochs may adopt (Own), through AltScope.
	KeepTail bool
	// Epoch (Keep) is the keeping session's epoch: its tail serves a
	// later epoch up to OwnFor(Epoch).
	Epoch uint64
	// Own (Adopt) is how many positions of an entry kept by this
	// session's own earlier epoch (matched through AltScope, every one of
	// its blocks matching) the adopter may take past whole blocks: the
	// positions whose tokens the session's origin committed before this
	// epoch, whose cells every hop computed from those tokens (a
	// re-routed epoch adopts its hops' partial blocks; 0: whole blocks).
	Own int
	// OwnFor (Adopt; nil: Own) bounds the tail of an entry kept in epoch
	// k: the positions the session had committed when the epoch after k
	// opened (past them k's rows may be proposals a later epoch replaced).
	OwnFor func(k uint64) int
}

// MaxTailBlocks bounds a kept tail, in blocks of the prefix: a session
// that ends past its blocks by more keeps no tail (it is for a re-route
// right after a failure, whose tail is the last block and the tokens
// since the progress the origin sent: a longer one would only crowd out
// other entries).
const MaxTailBlocks = 4

// PrefixOwnerDivisor: an owner holding more than this fraction of the
// cache's cells loses its own entries first when room is needed.
const PrefixOwnerDivisor = 2

// DefaultPrefixCacheEntries is how many prefixes a cache keeps at most
// (each is a llama.cpp sequence; 256 in all, live sessions first).
const DefaultPrefixCacheEntries = 32

// DefaultPrefixCacheInputBytes bounds the input rows a shard's prefix
// cache keeps (Config.PrefixCacheInputBytes): 64 MiB, 4096 positions of
// a 4096-wide model.
const DefaultPrefixCacheInputBytes = 64 << 20

// cacheEntry is one cached prefix: sequence seq holds its positions
// [0, len(hashes)·block).
type cacheEntry struct {
	seq    int
	owner  string
	scope  [32]byte
	alt    [32]byte // zero: none
	block  int
	hashes [][16]byte
	tail   int         // positions past the whole blocks (Prefix.KeepTail): its session's own epochs only
	epoch  uint64      // the epoch of the session that kept it (Prefix.Epoch)
	toks   []int32     // head shards: the tokens of its positions
	rows   [][]float32 // shards after the head: the input rows of its positions, read only (nil: none kept)
	last   uint64      // LRU clock
}

func (e *cacheEntry) cells() int { return len(e.hashes)*e.block + e.tail }

// prefixCache is the loop's index of the cached prefixes; the counters
// are read by Capacity from other goroutines.
type prefixCache struct {
	cells   int   // budget: cells entries may hold together
	free    []int // sequence ids for entries
	entries map[int]*cacheEntry
	held    int
	clock   uint64
	// rowBytes bounds the bytes of input rows the entries keep together
	// (Config.PrefixCacheInputBytes); rowsHeld is what they keep.
	rowBytes, rowsHeld int64

	heldN, entriesN, evicted atomic.Int64
}

func (c *prefixCache) setCounts() {
	c.heldN.Store(int64(c.held))
	c.entriesN.Store(int64(len(c.entries)))
}

// match is the entry sharing the longest prefix with p (most recent on a
// tie) and that prefix's positions; nil, 0 when none.
func (c *prefixCache) match(p *Prefix) (*cacheEntry, int) {
	var best *cacheEntry
	n := 0
	for _, e := range c.entries {
		if !e.serves(p) {
			continue
		}
		m := e.positions(p)
		if m > 0 && (m > n || m == n && e.last > best.last) {
			best, n = e, m
		}
	}
	return best, n
}

// positions is how many of e's positions serve p (which e serves): its
// blocks in common, and its tail where p is a later epoch of the session
// that kept e (its session scope, every block of e matching) within p.Own.
func (e *cacheEntry) positions(p *Prefix) int {
	k := commonBlocks(e.hashes, p.Hashes)
	n := k * e.block
	var zero [32]byte
	if e.tail == 0 || k < len(e.hashes) || e.alt == zero || e.alt != p.AltScope {
		return n
	}
	own := p.Own
	if p.OwnFor != nil {
		own = min(own, p.OwnFor(e.epoch))
	}
	if own > n {
		n = min(n+e.tail, own)
	}
	return n
}

// serves reports whether e may serve a session keyed p: the same owner
// and block size, and a scope in common (an alternative one counts).
func (e *cacheEntry) serves(p *Prefix) bool {
	if e.block != p.Block || e.owner != p.Owner {
		return false
	}
	var zero [32]byte
	meet := func(a, b [32]byte) bool { return a != zero && a == b }
	return e.scope == p.Scope || meet(e.alt, p.Scope) || meet(e.scope, p.AltScope) || meet(e.alt, p.AltScope)
}

func commonBlocks(a, b [][16]byte) int {
	k := 0
	for k < len(a) && k < len(b) && a[k] == b[k] {
		k++
	}
	return k
}

// victim is the entry to evict for owner's new entry of n cells: the
// least recently used of the owner's own when it would hold more than its
// share, else of the owners over their share, else of all.
func (c *prefixCache) victim(owner string, n int) *cacheEntry {
	share := c.cells / PrefixOwnerDivisor
	held := map[string]int{}
	for _, e := range c.entries {
		held[e.owner] += e.cells()
	}
	over := func(o string) bool { return o != "" && held[o] > share }
	lru := func(keep func(*cacheEntry) bool) *cacheEntry {
		var v *cacheEntry
		for _, e := range c.entries {
			if keep(e) && (v == nil || e.last < v.last) {
				v = e
			}
		}
		return v
	}
	if owner != "" && held[owner]+n > share {
		if v := lru(func(e *cacheEntry) bool { return e.owner == owner }); v != nil {
			return v
		}
	}
	if v := lru(func(e *cacheEntry) bool { return over(e.owner) }); v != nil {
		return v
	}
	return lru(func(*cacheEntry) bool { return true })
}

// keepReq is what a closing session asks the cache to keep.
type keepReq struct {
	p    Prefix
	pos  int         // the session's positions
	toks []int32     // head: its tokens
	rows [][]float32 // KeepInputs: its input rows of every position, handed over (nil: not all known)
}

// adopt gives sequence seq (no cells yet) the longest cached prefix of p;
// it returns the positions and, on a head shard, their tokens, and with
// rows their input rows when the entry kept them (shared, read only).
func (s *Shard) adopt(seq int, p *Prefix, rows bool) (int, []int32, [][]float32) {
	c := &s.kv.cache
	e, n := c.match(p)
	if e == nil {
		return 0, nil, nil
	}
	C.llama_memory_seq_cp(C.llama_get_memory(s.lctx), C.llama_seq_id(e.seq), C.llama_seq_id(seq), 0, C.llama_pos(n))
	s.kv.live[seq] = n
	s.kv.graved[seq] = n
	c.clock++
	e.last = c.clock
	var toks []int32
	if len(e.toks) >= n {
		toks = slices.Clone(e.toks[:n])
	}
	var in [][]float32
	if w := n * s.info.NEmbd; rows && segsLen(e.rows) >= w {
		in = cutSegs(e.rows, w)
	}
	return n, toks, in
}

// keep makes the first whole blocks of seq's positions an entry (before
// release hands seq's cells to the grave): the blocks k's hashes cover, at
// most k.pos positions. An entry that already covers them is only
// touched; entries they cover are evicted (the new one serves all they
// served).
func (s *Shard) keep(seq int, k *keepReq) {
	c := &s.kv.cache
	if c.cells == 0 || k.p.Block <= 0 {
		return
	}
	// A session longer than the whole cache keeps its first blocks that
	// fit: a conversation past --prefix-cache still reuses its start.
	blocks := min(len(k.p.Hashes), k.pos/k.p.Block, c.cells/k.p.Block)
	n := blocks * k.p.Block
	tail := 0
	var zero [32]byte
	if k.p.KeepTail && k.p.AltScope != zero && blocks == min(len(k.p.Hashes), k.pos/k.p.Block) {
		if tail = min(k.pos, c.cells) - n; tail > MaxTailBlocks*k.p.Block {
			tail = 0
		}
	}
	if n+tail == 0 || s.kv.lost[seq] != nil || s.cellsOf(seq) < n+tail {
		return
	}
	hashes := k.p.Hashes[:blocks]
	c.clock++
	for _, e := range c.entries {
		if e.scope != k.p.Scope || e.alt != k.p.AltScope || e.block != k.p.Block || e.owner != k.p.Owner {
			continue
		}
		switch common := commonBlocks(e.hashes, hashes); {
		case common == blocks && e.cells() >= n+tail && e.epoch == k.p.Epoch:
			e.last = c.clock
			return
		case common == len(e.hashes):
			s.evict(e)
		}
	}
	n += tail
	for c.held+n > c.cells || len(c.free) == 0 {
		s.evict(c.victim(k.p.Owner, n))
	}
	cseq := c.free[len(c.free)-1]
	c.free = c.free[:len(c.free)-1]
	C.llama_memory_seq_cp(C.llama_get_memory(s.lctx), C.llama_seq_id(seq), C.llama_seq_id(cseq), 0, C.llama_pos(n))
	e := &cacheEntry{seq: cseq, owner: k.p.Owner, scope: k.p.Scope, alt: k.p.AltScope, block: k.p.Block, hashes: slices.Clone(hashes), tail: tail, epoch: k.p.Epoch, last: c.clock}
	if len(k.toks) >= n {
		e.toks = slices.Clone(k.toks[:n])
	}
	c.entries[cseq] = e
	c.held += n
	if w := n * s.info.NEmbd; segsLen(k.rows) >= w && c.fitRows(int64(w)*4) {
		e.rows = cutSegs(k.rows, w) // no copy while a re-routed epoch waits for this keep
		if segsLen(k.rows) > w+w/4+1024 {
			e.rows = [][]float32{flat(e.rows)} // not the closed session's much longer rows
		}
		c.rowsHeld += int64(w) * 4
	}
	c.setCounts()
}

// fitRows makes room for n bytes of input rows within the bound, taking
// the rows of the least recently used entries that keep some (they stay,
// without them); false when n is over the whole bound.
func (c *prefixCache) fitRows(n int64) bool {
	if n > c.rowBytes {
		return false
	}
	for c.rowsHeld+n > c.rowBytes {
		var v *cacheEntry
		for _, e := range c.entries {
			if e.rows != nil && (v == nil || e.last < v.last) {
				v = e
			}
		}
		if v == nil {
			return false
		}
		c.dropRows(v)
	}
	return true
}

func (c *prefixCache) dropRows(e *cacheEntry) {
	c.rowsHeld -= int64(segsLen(e.rows)) * 4
	e.rows = nil
}

// evict drops entry e. Its cells stay occupied (no holes) until the next
// compaction: every cell of an entry also carries the grave, from the
// release of the session it was kept from (keep comes just before it) or,
// after a compaction, from restoreSeq.
func (s *Shard) evict(e *cacheEntry) {
	c := &s.kv.cache
	C.llama_memory_seq_rm(C.llama_get_memory(s.lctx), C.llama_seq_id(e.seq), -1, -1)
	c.forget(e)
	c.evicted.Add(1)
}

// forget removes e from the index (its cells are the caller's business).
func (c *prefixCache) forget(e *cacheEntry) {
	c.dropRows(e)
	delete(c.entries, e.seq)
	c.free = append(c.free, e.seq)
	c.held -= e.cells()
	c.setCounts()
}

// survivors are the entries a compaction restores after live cells and n
// rows to decode, most recently used first, within the cells left; the
// others are forgotten (the compaction clears their cells).
func (s *Shard) survivors(live, n int) []*cacheEntry {
	c := &s.kv.cache
	all := make([]*cacheEntry, 0, len(c.entries))
	for _, e := range c.entries {
		all = append(all, e)
	}
	slices.SortFunc(all, func(a, b *cacheEntry) int { return cmp.Compare(b.last, a.last) })
	room := s.cells - live - n
	var keep []*cacheEntry
	for _, e := range all {
		if e.cells() <= room {
			room -= e.cells()
			keep = append(keep, e)
			continue
		}
		c.forget(e)
		c.evicted.Add(1)
	}
	return keep
}

// Adopt gives a session that has no rows yet the longest prefix of p the
// shard's cache holds: the session then starts at the returned position
// (a multiple of p.Block, 0 when nothing matched or the cache is off). On
// a head shard the positions' tokens come back too. The caller may
// Truncate below the returned position before its first Forward.
func (x *Session) Adopt(ctx context.Context, p Prefix) (int, []int32, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	switch {
	case x.closed:
		return 0, nil, ErrSessionClosed
	case x.broken != nil:
		return 0, nil, x.broken
	case x.nextPos != 0:
		return 0, nil, fmt.Errorf("%w: adopt a prefix at position %d, want a new session", ErrBadInput, x.nextPos)
	case !x.shard.cacheOn() || p.Block <= 0 || len(p.Hashes) == 0:
		return 0, nil, nil
	}
	s := x.shard
	r := &request{sess: x, adopt: &p, done: make(chan error, 1)}
	if err := s.send(ctx, r); err != nil {
		return 0, nil, err
	}
	if err := s.wait(r); err != nil {
		x.broken = err
		return 0, nil, err
	}
	x.nextPos = r.adopted
	if s.info.IsHead() {
		x.toks = r.out.Tokens
	}
	if x.keepRows {
		x.rowsOK = segsLen(r.adoptRows) == r.adopted*s.info.NEmbd
		x.rows, x.adoptedRows = rowSegs{}, nil
		if x.rowsOK {
			x.rows, x.adoptedRows = rowSegs{segs: r.adoptRows}, r.adoptRows
		}
	}
	return r.adopted, r.out.Tokens, nil
}

// AdoptedInputs are the input rows of the positions the last Adopt gave
// (positions × n_embd, row-major), as the session that computed their
// cells was fed them: nil unless the session keeps its inputs
// (SessionParams.KeepInputs) and the entry kept them. A copy: the session
// shares the entry's rows until then.
func (x *Session) AdoptedInputs() []float32 {
	x.mu.Lock()
	segs := x.adoptedRows
	x.mu.Unlock()
	return flat(segs)
}

// addRows keeps the input rows of a Forward that ran (after its
// positions are known to follow the kept ones). x.shard.kv.cache.rowBytes
// is fixed when the shard starts: read outside the loop.
func (x *Session) addRows(in []float32) {
	if !x.keepRows || !x.rowsOK {
		return
	}
	w := x.shard.info.NEmbd
	// Rows past the cache's bound could never be kept: a session holds
	// at most that much (PrefixCacheInputBytes) and then none.
	if n := x.rows.n(); n != x.nextPos*w || int64(n+len(in))*4 > x.shard.kv.cache.rowBytes {
		x.rowsOK, x.rows = false, rowSegs{}
		return
	}
	x.rows.add(in)
}

// Keep makes Close keep the session's first positions in the shard's
// prefix cache for later sessions: the whole blocks p's hashes cover, up
// to the session's position at Close. A session that failed keeps
// nothing.
func (x *Session) Keep(p Prefix) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.shard.cacheOn() {
		x.keep = &p
	}
}

// cacheOn reports whether the shard keeps prefixes: a cache of some cells,
// on a batch-invariant shard (elsewhere cells computed in another batch
// would not be the ones this session computes).
func (s *Shard) cacheOn() bool { return s.kv.cache.cells > 0 }
