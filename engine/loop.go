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
	"slices"
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
			// nil, or the request's own sampling error (its grammar): the
			// batch's other requests are not affected.
			p.r.done <- p.r.serr
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
	for _, g := range r.group {
		decodes, prefills = s.enqueue(g, decodes, prefills)
	}
	if r.group != nil {
		return decodes, prefills
	}
	if r.free {
		if r.keep != nil {
			s.keep(r.sess.seq, r.keep)
		}
		s.release(r.sess.seq)
		r.done <- nil
		return decodes, prefills
	}
	if r.adopt != nil {
		r.adopted, r.out.Tokens, r.adoptRows = s.adopt(r.sess.seq, r.adopt, r.sess.keepRows)
		r.done <- nil
		return decodes, prefills
	}
	if r.trimTo {
		s.trim(r.sess.seq, r.trim)
		r.done <- nil
		return decodes, prefills
	}
	if err := s.kv.lost[r.sess.seq]; err != nil {
		r.done <- err
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
	if n <= 0 || n > s.cfg.NBatch {
		return fmt.Errorf("%w: batch of %d rows (n_batch %d)", ErrBadInput, n, s.cfg.NBatch)
	}
	s.applyThreads()
	s.fillBatch(parts)
	if err := s.decode(parts, n); err != nil {
		return err
	}
	if s.capture != nil {
		return s.copyCaptured(parts, n)
	}
	for _, p := range parts {
		if err := s.output(p); err != nil {
			return err
		}
	}
	return nil
}

// fillBatch writes the rows of parts into the batch: tokens (head) or
// hidden states, positions, sequences and which rows are outputs.
func (s *Shard) fillBatch(parts []part) {
	info := s.info
	b := s.batch
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
			if info.IsTail() && !p.r.in.AllLogits && !p.r.in.Verify {
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
}

// decode runs llama_decode over the batch's first n rows, the rows of
// parts, and counts them in the cache.
func (s *Shard) decode(parts []part, n int) error {
	b := s.batch
	b.n_tokens = C.int32_t(n)
	if s.mrope {
		C.mp_batch_spread_pos(b)
	}
	if s.capture != nil {
		s.capture.n, s.capture.fired, s.capture.err = 0, 0, 0
	}
	if err := s.makeRoom(n); err != nil {
		return err
	}
	if g := s.cfg.Gate; g != nil {
		k := g.Acquire(s.threads)
		defer g.Release(k)
		if k != s.running {
			C.llama_set_n_threads(s.lctx, C.int32_t(k), C.int32_t(k))
			s.running = k
		}
	}
	if rc := C.llama_decode(s.lctx, *b); rc != 0 {
		// llama.cpp removes a failed ubatch's positions again, which can
		// leave holes: compact before the next decode.
		s.kv.dirty = true
		return fmt.Errorf("%w: rc=%d (%d rows)", ErrDecode, int(rc), n)
	}
	s.freeRetired()
	s.kv.used += n
	for _, p := range parts {
		s.kv.live[p.r.sess.seq] += p.rows
	}
	return nil
}

// copyCaptured copies the captured hidden states of a decode of n rows
// into the parts' outputs.
func (s *Shard) copyCaptured(parts []part, n int) error {
	if err := s.checkCapture(n); err != nil {
		return err
	}
	ne := s.info.NEmbd
	got := unsafe.Slice((*float32)(unsafe.Pointer(s.capture.buf)), n*ne)
	for _, p := range parts {
		copy(p.r.out.Hidden[p.from*ne:(p.from+p.rows)*ne], got[p.at*ne:(p.at+p.rows)*ne])
	}
	return nil
}

// output gives p's request what the tail decoded for it: verified
// tokens, every row's logits, or its last row's logits and sampled token.
func (s *Shard) output(p part) error {
	if p.r.in.Verify {
		return s.verify(p)
	}
	nv := s.info.NVocab
	if p.r.in.AllLogits {
		for i := 0; i < p.rows; i++ {
			lp := C.llama_get_logits_ith(s.lctx, C.int32_t(p.at+i))
			if lp == nil {
				return fmt.Errorf("%w: no logits for row %d", ErrDecode, p.at+i)
			}
			p.r.out.Logits = append(p.r.out.Logits, unsafe.Slice((*float32)(unsafe.Pointer(lp)), nv)...)
		}
	}
	if p.from+p.rows != p.r.rows || !(p.r.in.Sample || p.r.in.Logits) {
		return nil
	}
	lp := C.llama_get_logits_ith(s.lctx, C.int32_t(p.at+p.rows-1))
	if lp == nil {
		return fmt.Errorf("%w: no logits for row %d", ErrDecode, p.at+p.rows-1)
	}
	logits := unsafe.Slice((*float32)(unsafe.Pointer(lp)), nv)
	if p.r.in.Logits && !p.r.in.AllLogits {
		p.r.out.Logits = append([]float32(nil), logits...)
	}
	if p.r.in.Sample {
		p.r.out.Token, p.r.out.Logprob, p.r.serr = p.r.sess.smp.sample(s.cands, logits)
	}
	return nil
}

// verify samples the targets of a Verify part's rows in order until one
// differs from the proposed token (see Input.Verify).
func (s *Shard) verify(p part) error {
	r := p.r
	for i := 0; i < p.rows && !r.stopped; i++ {
		row := p.from + i
		lp := C.llama_get_logits_ith(s.lctx, C.int32_t(p.at+i))
		if lp == nil {
			return fmt.Errorf("%w: no logits for row %d", ErrDecode, p.at+i)
		}
		tok, _, err := r.sess.smp.sample(s.cands, unsafe.Slice((*float32)(unsafe.Pointer(lp)), s.info.NVocab))
		if err != nil {
			r.serr, r.stopped = err, true
			break
		}
		r.out.Tokens = append(r.out.Tokens, tok)
		r.out.Token = tok
		r.stopped = row >= len(r.in.Draft) || tok != r.in.Draft[row]
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
// name l_out-<il>, all rows captured in batch order) and batch invariance
// (invariance.go) on scratch sequences. It runs before the loop starts, so
// it owns the context, and leaves the cache empty.
func (s *Shard) selfTest() error {
	defer s.clearKV()
	if !s.cfg.Baseline {
		if err := checkInvariantBuild(); err != nil {
			return err
		}
	}
	const rows = 3
	batched, err := s.probe([][]probeRow{{{s.scratch, 0}, {s.scratch, 1}, {s.scratch, 2}}})
	if err != nil {
		return err
	}
	vals := batched[s.scratch]
	if len(vals) == 0 {
		return fmt.Errorf("%w: no output", ErrSelfTest)
	}
	for _, v := range vals {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return fmt.Errorf("%w: non-finite output", ErrSelfTest)
		}
	}
	// Rows must differ (they had different inputs): a capture that
	// returned one row three times would pass the size check.
	w := len(vals) / rows
	if slices.Equal(vals[:w], vals[w:2*w]) {
		return fmt.Errorf("%w: output rows are identical", ErrSelfTest)
	}
	if s.cfg.Baseline || !s.BatchInvariant() {
		return nil
	}
	// The same rows one at a time and next to another sequence's rows
	// (interleaved cells, a 1-row and a 2-row batch): bitwise the same.
	s.clearKV()
	mixed, err := s.probe([][]probeRow{
		{{s.grave, 0}},
		{{s.scratch, 0}},
		{{s.grave, 1}, {s.scratch, 1}},
		{{s.scratch, 2}, {s.grave, 2}},
	})
	if err != nil {
		return err
	}
	if i := firstDiff(vals, mixed[s.scratch]); i >= 0 {
		return fmt.Errorf("%w: row %d of 3 differs between one 3-row batch and single or mixed batches (value %d: %g vs %g); "+
			"this build or CPU does not compute every row the same way (kernel class %s)",
			ErrNotInvariant, i/w, i, vals[i], mixed[s.scratch][i], KernelClass())
	}
	return nil
}

// probeRow is one self-test row: sequence id and position (the input is a
// function of the position and the sequence).
type probeRow struct{ seq, pos int }

// probe decodes batches of probe rows and returns each sequence's output
// rows in position order: hidden states, or every row's logits on the tail.
func (s *Shard) probe(batches [][]probeRow) (map[int][]float32, error) {
	out := map[int][]float32{}
	for _, rows := range batches {
		var parts []part
		for i, pr := range rows {
			sess := &Session{shard: s, seq: pr.seq, kv: 1 << 20}
			r := &request{sess: sess, rows: 1, done: make(chan error, 1)}
			r.in.Pos = pr.pos
			if s.info.IsHead() {
				r.in.Tokens = []int32{int32((pr.pos + 7*pr.seq) % s.info.NVocab)}
			} else {
				r.in.Hidden = make([]float32, s.info.NEmbd)
				for j := range r.in.Hidden {
					r.in.Hidden[j] = float32(math.Sin(float64(j+pr.pos*s.info.NEmbd+pr.seq*31))) * 0.1
				}
			}
			if s.info.IsTail() {
				r.in.AllLogits = true
			} else {
				r.out.Hidden = make([]float32, s.info.NEmbd)
			}
			parts = append(parts, part{r: r, rows: 1, at: i})
		}
		if err := s.step(parts, len(parts)); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrSelfTest, err)
		}
		for _, p := range parts {
			v := p.r.out.Hidden
			if s.info.IsTail() {
				v = p.r.out.Logits
			}
			out[p.r.sess.seq] = append(out[p.r.sess.seq], v...)
		}
	}
	return out, nil
}

// firstDiff is the first index where a and b differ bitwise (NaN-safe), -1
// when equal.
func firstDiff(a, b []float32) int {
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return i
		}
	}
	return -1
}
