package engine

import "slices"

// rowSegs are a session's or a cache entry's input rows (KeepInputs): f32
// rows in segments that are only read (a cache entry's, shared by every
// session that adopted them) then the session's own, which it appends
// to. A session that adopts a prefix shares the entry's segments and a
// closing one hands its own over to the entry it keeps: a failover's
// critical path (the old epoch's keep, the new one's adopt and first
// rows) copies no row. Floats are counted, not rows.
type rowSegs struct {
	segs [][]float32 // read only
	own  []float32
}

// n is how many floats r holds.
func (r *rowSegs) n() int { return segsLen(r.segs) + len(r.own) }

// add appends in to r's own rows.
func (r *rowSegs) add(in []float32) { r.own = append(r.own, in...) }

// cut keeps r's first n floats (n ≤ r.n()).
func (r *rowSegs) cut(n int) {
	k := segsLen(r.segs)
	if n <= k {
		r.segs, r.own = cutSegs(r.segs, n), r.own[:0]
		return
	}
	r.own = r.own[:n-k]
}

// cutSegs is the first n floats of segs (n ≤ their length) as read-only
// segments, sharing their memory.
func cutSegs(segs [][]float32, n int) [][]float32 {
	var out [][]float32
	for _, s := range segs {
		if n == 0 {
			break
		}
		k := min(n, len(s))
		out = append(out, s[:k:k])
		n -= k
	}
	return out
}

// frozen is r as read-only segments, its own rows handed over (the caller
// no longer writes them): copied only when their buffer is much larger
// than they are, so a kept entry does not hold on to unused room.
func (r *rowSegs) frozen() [][]float32 {
	own := r.own[:len(r.own):len(r.own)]
	if cap(r.own) > len(r.own)+len(r.own)/4+1024 {
		own = slices.Clone(r.own)
	}
	out := slices.Clip(r.segs)
	if len(own) > 0 {
		out = append(out, own)
	}
	return out
}

// flat is segs as one slice (a copy; nil when empty).
func flat(segs [][]float32) []float32 {
	var out []float32
	for _, s := range segs {
		out = append(out, s...)
	}
	return out
}

// segsLen is how many floats segs hold.
func segsLen(segs [][]float32) int {
	n := 0
	for _, s := range segs {
		n += len(s)
	}
	return n
}
