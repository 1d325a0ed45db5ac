// Package specdecode proposes draft tokens for speculative decoding (issue 24):
// guesses of what the tail will choose next, which a verification window
// then checks K+1 rows at a time. A proposal is only a guess; whether it is
// right never changes the output, only how many tokens one window commits.
//
// NGram is the draft-free proposer: prompt lookup over the session's own
// tokens (prompt and output), as llama.cpp's ngram-simple / prompt-lookup
// modes do. It pays on copy-heavy work (an answer that repeats or edits a
// passage of the prompt, code, long repetitive continuations) and proposes
// nothing on novel text, where it costs nothing.
//
// Append only committed tokens (never drafts): Truncate is for rollbacks
// and walks the whole index. The route's head runs one per speculative
// session (session/spec.go).
//
// Adaptive decides how many proposals a window carries and how many
// windows go in flight, from measured acceptance (per match length) and
// costs, and turns proposals off where they do not pay.
package specdecode

import (
	"errors"
	"fmt"
)

// Bounds of an NGram (NewNGram checks them).
const (
	// MaxN is the longest n-gram matched.
	MaxN = 8
	// MaxDraft is the most tokens one proposal holds.
	MaxDraft = 64
	// MaxHistory is the most tokens an NGram keeps; beyond it, Append
	// drops the oldest half (and its index entries).
	MaxHistory = 1 << 17
)

// ErrBadParams reports NGram parameters outside the bounds.
var ErrBadParams = errors.New("spec: bad proposer parameters")

// NGram proposes the tokens that followed the most recent earlier
// occurrence of the history's last n tokens, trying n from NMax down to
// NMin. It keeps the history (bounded by MaxHistory) and, per n, the last
// position each n-gram ended at. Not safe for concurrent use: one per
// session.
type NGram struct {
	nMin, nMax int
	hist       []int32
	base       int // absolute position of hist[0] (after drops)
	// last[n-nMin] maps an n-gram to the absolute position just after its
	// most recent occurrence that is not the history's current suffix.
	// An n-gram is indexed once a token follows it, so a lookup never
	// finds the history's current suffix itself.
	last []map[string]int
	key  []byte // scratch
}

// NewNGram returns a proposer matching n-grams of nMin..nMax tokens
// (1 ≤ nMin ≤ nMax ≤ MaxN).
func NewNGram(nMin, nMax int) (*NGram, error) {
	if nMin < 1 || nMax < nMin || nMax > MaxN {
		return nil, fmt.Errorf("%w: n-gram sizes %d..%d (want 1 ≤ min ≤ max ≤ %d)", ErrBadParams, nMin, nMax, MaxN)
	}
	g := &NGram{nMin: nMin, nMax: nMax, last: make([]map[string]int, nMax-nMin+1)}
	for i := range g.last {
		g.last[i] = map[string]int{}
	}
	return g, nil
}

// Len is the number of tokens appended so far (including dropped ones).
func (g *NGram) Len() int { return g.base + len(g.hist) }

// Append adds tokens to the history (the prompt, then each committed
// token). Every n-gram that a following token now exists for is indexed.
func (g *NGram) Append(toks ...int32) {
	for _, t := range toks {
		// The n-grams ending at the current end get a follower now.
		end := g.Len()
		for n := g.nMin; n <= g.nMax && n <= len(g.hist); n++ {
			g.last[n-g.nMin][g.gram(len(g.hist)-n, n)] = end
		}
		g.hist = append(g.hist, t)
		if len(g.hist) > MaxHistory {
			g.drop(len(g.hist) / 2)
		}
	}
}

// Truncate forgets every token from absolute position pos on (a rejected
// draft that was appended, or a rollback). Index entries pointing past pos
// are removed; an older occurrence they had replaced is not restored, so
// a truncation can only make later proposals rarer, never wrong.
func (g *NGram) Truncate(pos int) {
	if pos >= g.Len() {
		return
	}
	if pos < g.base {
		pos = g.base
	}
	g.hist = g.hist[:pos-g.base]
	for _, m := range g.last {
		for k, v := range m {
			if v >= pos {
				delete(m, k)
			}
		}
	}
}

// drop removes the oldest k tokens and the index entries that point into
// them.
func (g *NGram) drop(k int) {
	g.base += k
	g.hist = append(g.hist[:0], g.hist[k:]...)
	for _, m := range g.last {
		for key, v := range m {
			if v-len(key)/4 < g.base {
				delete(m, key)
			}
		}
	}
}

// gram encodes hist[i:i+n] as a map key (4 bytes per token).
func (g *NGram) gram(i, n int) string {
	g.key = g.key[:0]
	for _, t := range g.hist[i : i+n] {
		g.key = append(g.key, byte(t), byte(t>>8), byte(t>>16), byte(t>>24))
	}
	return string(g.key)
}

// Propose returns up to k draft tokens (k ≤ MaxDraft) that followed the
// most recent earlier occurrence of the longest matching suffix, and the
// n it matched (0 and nil: no proposal). The draft may run into the
// current suffix itself (a repeating pattern continues).
func (g *NGram) Propose(k int) (draft []int32, n int) {
	k = min(k, MaxDraft)
	if k <= 0 {
		return nil, 0
	}
	for n = min(g.nMax, len(g.hist)); n >= g.nMin; n-- {
		at, ok := g.last[n-g.nMin][g.gram(len(g.hist)-n, n)]
		if !ok || at < g.base {
			continue
		}
		// Continue the match token by token: a draft longer than what
		// followed the occurrence repeats the pattern.
		i := at - g.base
		for len(draft) < k && i < len(g.hist) {
			draft = append(draft, g.hist[i])
			i++
		}
		return draft, n
	}
	return nil, 0
}
