package engine

/*
#include <stdlib.h>
#include "mp.h"
*/
import "C"

import (
	"fmt"
	"math"
	"runtime"
	"unsafe"
)

// loop owns the llama context. Each iteration it takes every queued request,
// frees closed sessions, then fills one batch: single-row (decode) requests
// first, then prefill chunks in arrival order, splitting the last one that
// does not fit. Decode rows never exceed MaxSessions and NBatch is at least
// twice that, so prefill always progresses (no starvation).
//
// The batch is filled here, not in a helper: parts does not escape loop, so
// the compiler may back a small batch (one decode) with stack memory, which
// a helper returning parts would turn into a heap allocation per token.
func (s *Shard) loop() {
	defer close(s.done)
	// Every decode on one OS thread: ggml's calling thread is worker 0 of
	// the pool, and a goroutine hopping threads between decodes loses its
	// caches and the pool's affinity to it.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var decodes, prefills []*request
	for {
		var open bool
		if decodes, prefills, open = s.collect(decodes, prefills); !open {
			return
		}
		if len(decodes) == 0 && len(prefills) == 0 {
			continue
		}
		var parts []part
		n := 0
		for _, r := range decodes {
			parts = append(parts, part{r: r, from: r.off, rows: r.rows - r.off, at: n})
			n += r.rows - r.off
		}
		decodes = decodes[:0]
		keep := prefills[:0]
		for _, r := range prefills {
			room := s.cfg.NBatch - n
			if room <= 0 {
				keep = append(keep, r)
				continue
			}
			take := min(room, r.rows-r.off)
			parts = append(parts, part{r: r, from: r.off, rows: take, at: n})
			n += take
			if r.off+take < r.rows {
				keep = append(keep, r)
			}
		}
		prefills = keep
		err := s.step(parts, n)
		deliver(parts, err)
		if err != nil {
			// A failed request must not linger in the prefill queue.
			prefills = dropFailed(prefills)
		}
	}
}

// collect waits for a request when both queues are empty, then takes every
// queued request without blocking. It reports false when the shard is
// closing; requests taken by then are answered ErrClosed.
func (s *Shard) collect(decodes, prefills []*request) ([]*request, []*request, bool) {
	if len(decodes) == 0 && len(prefills) == 0 {
		select {
		case r := <-s.reqs:
			decodes, prefills = s.enqueue(r, decodes, prefills)
		case <-s.quit:
			return decodes, prefills, false
		}
	}
	for {
		select {
		case r := <-s.reqs:
			decodes, prefills = s.enqueue(r, decodes, prefills)
		case <-s.quit:
			for _, r := range append(decodes, prefills...) {
				r.done <- ErrClosed
			}
			return decodes, prefills, false
		default:
			return decodes, prefills, true
		}
	}
}

// deliver answers the requests of a decoded batch: with err nil each part's
// request advances past its rows and is answered nil once all are done;
// otherwise each request is answered err once (and marked failed).
func deliver(parts []part, err error) {
	for _, p := range parts {
		if err != nil {
			if !p.r.failed {
				p.r.done <- err
				p.r.failed = true
			}
			continue
		}
		p.r.off += p.rows
		if p.r.off == p.r.rows {
			p.r.done <- nil
		}
	}
}

// dropFailed removes the failed requests from prefills, in place.
func dropFailed(prefills []*request) []*request {
	keep := prefills[:0]
	for _, r := range prefills {
		if !r.failed {
			keep = append(keep, r)
		}
	}
	return keep
}

func (s *Shard) enqueue(r *request, decodes, prefills []*request) ([]*request, []*request) {
	if r.free {
		mem := C.llama_get_memory(s.lctx)
		C.llama_memory_seq_rm(mem, C.llama_seq_id(r.sess.seq), -1, -1)
		r.done <- nil
		return decodes, prefills
	}
	if r.rows == 1 {
		return append(decodes, r), prefills
	}
	return decodes, append(prefills, r)
}

// part is a slice [from, from+rows) of a request placed at batch row at.
type part struct {
	r              *request
	from, rows, at int
}

// step fills the batch from parts and runs one llama_decode.
func (s *Shard) step(parts []part, n int) error {
	info := s.info
	b := s.batch
	if n <= 0 || n > s.cfg.NBatch {
		return fmt.Errorf("%w: batch of %d rows (n_batch %d)", ErrBadInput, n, s.cfg.NBatch)
	}
	ne := info.NEmbd
	var embd []float32
	if b.embd != nil {
		embd = unsafe.Slice((*float32)(unsafe.Pointer(b.embd)), s.cfg.NBatch*ne)
	}
	for _, p := range parts {
		last := p.from+p.rows == p.r.rows
		for i := 0; i < p.rows; i++ {
			row := p.from + i
			out := C.int8_t(1) // non-tail: every row is an output, or l_out drops rows
			if info.IsTail() {
				out = 0
				if last && i == p.rows-1 && (p.r.in.Sample || p.r.in.Logits) {
					out = 1
				}
			}
			tok := C.llama_token(0)
			if info.IsHead() {
				tok = C.llama_token(p.r.in.Tokens[row])
			} else {
				copy(embd[(p.at+i)*ne:(p.at+i+1)*ne], p.r.in.Hidden[row*ne:(row+1)*ne])
			}
			C.mp_batch_set(b, C.int(p.at+i), tok, C.llama_pos(p.r.in.Pos+row), C.llama_seq_id(p.r.sess.seq), out)
		}
	}
	b.n_tokens = C.int32_t(n)
	if s.capture != nil {
		s.capture.n, s.capture.fired, s.capture.err = 0, 0, 0
	}
	if rc := C.llama_decode(s.lctx, *b); rc != 0 {
		return fmt.Errorf("%w: rc=%d (%d rows)", ErrDecode, int(rc), n)
	}
	if s.capture != nil {
		if err := s.checkCapture(n); err != nil {
			return err
		}
		got := unsafe.Slice((*float32)(unsafe.Pointer(s.capture.buf)), n*ne)
		for _, p := range parts {
			copy(p.r.out.Hidden[p.from*ne:(p.from+p.rows)*ne], got[p.at*ne:(p.at+p.rows)*ne])
		}
		return nil
	}
	for _, p := range parts {
		if p.from+p.rows != p.r.rows || !(p.r.in.Sample || p.r.in.Logits) {
			continue
		}
		lp := C.llama_get_logits_ith(s.lctx, C.int32_t(p.at+p.rows-1))
		if lp == nil {
			return fmt.Errorf("%w: no logits for row %d", ErrDecode, p.at+p.rows-1)
		}
		logits := unsafe.Slice((*float32)(unsafe.Pointer(lp)), info.NVocab)
		if p.r.in.Logits {
			p.r.out.Logits = append([]float32(nil), logits...)
		}
		if p.r.in.Sample {
			p.r.out.Token = p.r.sess.smp.sample(s.cands, logits)
		}
	}
	return nil
}

func (s *Shard) checkCapture(n int) error {
	c := s.capture
	switch {
	case c.err == 1:
		return fmt.Errorf("%w: captured rows overflow the buffer", ErrSelfTest)
	case c.err == 2:
		return fmt.Errorf("%w: %s is not contiguous", ErrSelfTest, C.GoString(&c.name[0]))
	case c.err == 3:
		return fmt.Errorf("%w: %s is not f32", ErrSelfTest, C.GoString(&c.name[0]))
	case c.fired != 1:
		return fmt.Errorf("%w: %s fired %d times in one decode, want 1", ErrSelfTest, C.GoString(&c.name[0]), int(c.fired))
	case int(c.n) != n*s.info.NEmbd:
		return fmt.Errorf("%w: captured %d floats, want %d rows × %d", ErrSelfTest, int(c.n), n, s.info.NEmbd)
	}
	return nil
}

// selfTest checks the llama.cpp conventions the engine relies on (tensor
// name l_out-<il>, all rows captured in batch order) on a scratch sequence.
// It runs before the loop starts, so it owns the context.
func (s *Shard) selfTest() error {
	const rows = 3
	sess := &Session{shard: s, seq: s.scratch, kv: rows}
	r := &request{sess: sess, rows: rows, done: make(chan error, 1)}
	if s.info.IsHead() {
		r.in.Tokens = make([]int32, rows)
		for i := range r.in.Tokens {
			r.in.Tokens[i] = int32(i % s.info.NVocab)
		}
	} else {
		r.in.Hidden = make([]float32, rows*s.info.NEmbd)
		for i := range r.in.Hidden {
			r.in.Hidden[i] = float32(math.Sin(float64(i))) * 0.1
		}
	}
	if s.info.IsTail() {
		r.in.Logits = true
	} else {
		r.out.Hidden = make([]float32, rows*s.info.NEmbd)
	}
	defer C.llama_memory_seq_rm(C.llama_get_memory(s.lctx), C.llama_seq_id(s.scratch), -1, -1)
	if err := s.step([]part{{r: r, rows: rows}}, rows); err != nil {
		return fmt.Errorf("%w: %v", ErrSelfTest, err)
	}
	vals := r.out.Hidden
	if s.info.IsTail() {
		vals = r.out.Logits
	}
	if len(vals) == 0 {
		return fmt.Errorf("%w: no output", ErrSelfTest)
	}
	for _, v := range vals {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return fmt.Errorf("%w: non-finite output", ErrSelfTest)
		}
	}
	if !s.info.IsTail() {
		// Rows must differ (they had different inputs): a capture that
		// returned one row three times would pass the size check.
		ne := s.info.NEmbd
		same := true
		for j := 0; j < ne; j++ {
			if vals[j] != vals[ne+j] {
				same = false
				break
			}
		}
		if same {
			return fmt.Errorf("%w: captured rows are identical", ErrSelfTest)
		}
	}
	return nil
}
