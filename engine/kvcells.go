package engine

/*
#include <stdlib.h>
#include "mp.h"
*/
import "C"

import (
	"fmt"
	"slices"
	"sync/atomic"
	"time"
	"unsafe"
)

// kvState is the loop's view of the unified KV cache. The invariant it
// keeps: occupied cells are exactly [0, used) and llama.cpp's search head is
// at used, so every new row lands above every cell in use and each
// session's cells stay in position order. Flash attention visits a row's
// cells in cell order and skips other sessions' (masked) ones, so with that
// order a session's attention is computed the same way whatever else shares
// the cache: batch invariance (docs/architecture.md, "Batch invariance").
//
// Freed cells would be holes that llama.cpp fills next, below cells of
// sessions still running. So a closed session's cells are handed to the
// grave sequence instead (still occupied, masked for everyone), and when a
// decode does not fit above used, compact saves every live sequence
// (llama_state_seq_get_data), clears the cache and restores them one after
// another into contiguous cells: same bytes, same order, no holes. The
// prefix cache's entries (prefixcache.go) are sequences too, restored
// after the live ones.
type kvState struct {
	used  int         // cells occupied: live sessions', the prefix cache's and the grave's
	live  map[int]int // sequence id -> cells it holds
	cache prefixCache // finished sessions' prefixes (prefixcache.go)
	// graved: a live sequence's positions [0, n) that already carry the
	// grave (an adopted prefix: every cell of a cache entry does), so
	// that handing its cells to the grave starts at n (llama.cpp asserts
	// that a cell it adds a sequence to does not hold it already).
	graved      map[int]int
	lost        map[int]error
	dirty       bool         // a failed decode may have left holes: compact first
	compactions atomic.Int64 // read by tests while the loop runs
	merged      atomic.Int64 // compactions restored in one piece (restoreMerged)
}

// makeRoom ensures n rows fit above used, compacting when they do not.
func (s *Shard) makeRoom(n int) error {
	if s.cfg.Baseline {
		return nil
	}
	if !s.kv.dirty && s.kv.used+n <= s.cells {
		return nil
	}
	if len(s.kv.live) == 0 && len(s.kv.cache.entries) == 0 {
		s.clearKV()
	} else if err := s.compact(n); err != nil {
		return err
	}
	if s.kv.used+n > s.cells {
		return fmt.Errorf("%w: %d rows do not fit: live sessions hold %d of %d KV cells", ErrNoCapacity, n, s.kv.used, s.cells)
	}
	return nil
}

// release frees a closed session's sequence: its cells go to the grave, or
// the whole cache is cleared when no session is left (no copy needed).
func (s *Shard) release(seq int) {
	mem := C.llama_get_memory(s.lctx)
	delete(s.kv.lost, seq)
	if s.cfg.Baseline {
		C.llama_memory_seq_rm(mem, C.llama_seq_id(seq), -1, -1)
		return
	}
	delete(s.kv.live, seq)
	from := s.kv.graved[seq]
	delete(s.kv.graved, seq)
	if len(s.kv.live) == 0 && len(s.kv.cache.entries) == 0 {
		s.clearKV()
		return
	}
	// Always, even when the loop counted no cells: a failed decode may have
	// left some, and the next session in this slot must start empty.
	C.llama_memory_seq_cp(mem, C.llama_seq_id(seq), C.llama_seq_id(s.grave), C.llama_pos(from), -1)
	C.llama_memory_seq_rm(mem, C.llama_seq_id(seq), -1, -1)
}

// trim drops seq's cells from position pos on: into the grave, so no hole
// opens below cells still in use.
func (s *Shard) trim(seq, pos int) {
	mem := C.llama_get_memory(s.lctx)
	if !s.cfg.Baseline {
		g := s.kv.graved[seq]
		C.llama_memory_seq_cp(mem, C.llama_seq_id(seq), C.llama_seq_id(s.grave), C.llama_pos(max(pos, g)), -1)
		if pos < g {
			s.kv.graved[seq] = pos
		}
	}
	C.llama_memory_seq_rm(mem, C.llama_seq_id(seq), C.llama_pos(pos), -1)
	if _, ok := s.kv.live[seq]; ok {
		s.kv.live[seq] = min(s.kv.live[seq], pos)
	}
}

// clearKV empties the cache (metadata only: stale bytes in free cells are
// never read, flash attention skips masked cells). The prefix cache's
// index is the caller's: empty, or restored by compact.
func (s *Shard) clearKV() {
	C.llama_memory_clear(C.llama_get_memory(s.lctx), C.bool(false))
	s.kv.used, s.kv.dirty = 0, false
	clear(s.kv.live)
	clear(s.kv.graved)
}

// cellsOf is how many cells llama.cpp holds for seq (positions are
// consecutive from the session's start).
func (s *Shard) cellsOf(seq int) int {
	mem := C.llama_get_memory(s.lctx)
	hi := int(C.llama_memory_seq_pos_max(mem, C.llama_seq_id(seq)))
	if hi < 0 {
		return 0
	}
	return hi - int(C.llama_memory_seq_pos_min(mem, C.llama_seq_id(seq))) + 1
}

// compact rewrites the cache as the live sessions' cells, contiguous and
// in sequence-id order, then the prefix cache's entries that fit beside
// them and n rows to decode (most recently used first; survivors), and
// drops the grave. It holds a copy of every sequence it restores in memory
// while it runs.
func (s *Shard) compact(n int) error {
	start := time.Now()
	var all []savedSeq
	defer func() {
		for _, v := range all {
			C.free(v.buf)
		}
	}()
	seqs := make([]int, 0, len(s.kv.live))
	live := 0
	for seq := range s.kv.live {
		seqs = append(seqs, seq)
		live += s.cellsOf(seq)
	}
	slices.Sort(seqs)
	bytes := 0
	for _, seq := range seqs {
		if s.cellsOf(seq) == 0 {
			continue
		}
		v, err := s.saveSeq(seq)
		if v.buf != nil {
			all = append(all, v)
		}
		if err != nil {
			return err
		}
		bytes += int(v.n)
	}
	for _, e := range s.survivors(live, n) {
		v, err := s.saveSeq(e.seq)
		if err != nil {
			C.free(v.buf) // free(NULL) is fine
			s.kv.cache.forget(e)
			continue
		}
		v.entry = e
		all = append(all, v)
		bytes += int(v.n)
	}
	s.clearKV()
	if !s.mrope || !s.restoreMerged(all, bytes) {
		for _, v := range all {
			s.restoreSeq(v)
		}
	}
	s.kv.compactions.Add(1)
	s.log.Debug("KV cache compacted", "sequences", len(all), "cells", s.kv.used, "bytes", bytes, "took", time.Since(start))
	return nil
}

// savedSeq is one sequence's cells saved for a compaction; entry is set
// for a prefix cache entry.
type savedSeq struct {
	seq   int
	buf   unsafe.Pointer
	n     C.size_t
	entry *cacheEntry
}

// saveSeq copies seq's cells out of the cache (llama_state_seq_get_data);
// v.buf is the caller's to free when set, also on an error.
func (s *Shard) saveSeq(seq int) (savedSeq, error) {
	n := C.llama_state_seq_get_size(s.lctx, C.llama_seq_id(seq))
	buf := C.malloc(n)
	if buf == nil {
		return savedSeq{}, fmt.Errorf("%w: compacting the KV cache: cannot allocate %d bytes", ErrNoCapacity, int(n))
	}
	v := savedSeq{seq: seq, buf: buf, n: n}
	if got := C.llama_state_seq_get_data(s.lctx, (*C.uint8_t)(buf), n, C.llama_seq_id(seq)); got != n {
		return v, fmt.Errorf("%w: saving sequence %d for compaction: %d of %d bytes", ErrDecode, seq, int(got), int(n))
	}
	return v, nil
}

// restoreSeq puts a saved sequence back above the cells in use.
func (s *Shard) restoreSeq(v savedSeq) {
	if rd := C.llama_state_seq_set_data(s.lctx, (*C.uint8_t)(v.buf), v.n, C.llama_seq_id(v.seq)); rd == 0 {
		// Cannot happen with the cells just freed; a session is gone if
		// it does, and says so on its next request; an entry is dropped.
		C.llama_memory_seq_rm(C.llama_get_memory(s.lctx), C.llama_seq_id(v.seq), -1, -1)
		s.kv.dirty = true
		if v.entry != nil {
			s.kv.cache.forget(v.entry)
			return
		}
		s.kv.lost[v.seq] = fmt.Errorf("%w: KV of sequence %d could not be restored after compaction", ErrDecode, v.seq)
		return
	}
	s.account(v)
}

// account books a restored sequence: a session's cells, or an entry's
// (which carry the grave).
func (s *Shard) account(v savedSeq) {
	c := s.cellsOf(v.seq)
	if v.entry == nil {
		s.kv.live[v.seq] = c
	} else {
		// An entry's cells carry the grave (evict leaves them to it).
		C.llama_memory_seq_cp(C.llama_get_memory(s.lctx), C.llama_seq_id(v.seq), C.llama_seq_id(s.grave), -1, -1)
	}
	s.kv.used += c
}

// restoreMerged restores all at once as one whole-cache blob
// (kvmerge.go): what an M-RoPE shard's compaction does, since llama.cpp's
// one-sequence restore over-reads there. It reports false, with the cache
// still empty, when the blobs cannot be merged (restore them one by one).
// A failed restore loses every sequence, as one-by-one restores that all
// failed would.
func (s *Shard) restoreMerged(all []savedSeq, bytes int) bool {
	if len(all) == 0 {
		return true
	}
	dst := C.malloc(C.size_t(bytes))
	if dst == nil {
		return false
	}
	defer C.free(dst)
	blobs := make([][]byte, len(all))
	for i, v := range all {
		blobs[i] = unsafe.Slice((*byte)(v.buf), int(v.n))
	}
	n, _, err := mergeSeqStates(unsafe.Slice((*byte)(dst), bytes), blobs)
	if err != nil {
		s.log.Warn("KV compaction: restoring sequences one by one", "err", err)
		return false
	}
	if rd := C.llama_state_seq_set_data(s.lctx, (*C.uint8_t)(dst), C.size_t(n), -1); rd == 0 {
		C.llama_memory_clear(C.llama_get_memory(s.lctx), C.bool(false))
		s.kv.dirty = true
		for _, v := range all {
			if v.entry != nil {
				s.kv.cache.forget(v.entry)
				continue
			}
			s.kv.lost[v.seq] = fmt.Errorf("%w: KV of sequence %d could not be restored after compaction", ErrDecode, v.seq)
		}
		return true
	}
	for _, v := range all {
		s.account(v)
	}
	s.kv.merged.Add(1)
	return true
}
