// Package peerlimit holds per-peer state in bounded memory: Table, a map
// keyed by peer.ID that keeps at most a fixed number of peers and forgets
// the least recently used one in O(1), and Limiter, a token bucket
// (golang.org/x/time/rate) per peer in such a table.
//
// Peer identities are free to make, so every per-peer table a remote peer
// can grow must be bounded; forgetting a peer gives it a fresh entry (a
// full bucket) when it comes back, which is what the bound costs.
package peerlimit

import (
	"container/list"
	"fmt"
	"iter"

	"github.com/libp2p/go-libp2p/core/peer"
)

// Table maps peers to values of type V and holds at most Max of them:
// putting a new peer into a full table forgets the least recently used one
// (by Put and Get; Peek does not count as a use). Not safe for concurrent
// use: callers hold their own lock, usually over other state too.
type Table[V any] struct {
	max   int
	order *list.List // of *entry[V], least recently used first
	index map[peer.ID]*list.Element
}

type entry[V any] struct {
	p peer.ID
	v V
}

// NewTable returns an empty table of at most maxPeers peers. maxPeers
// must be positive (NewTable panics otherwise: a programming error).
func NewTable[V any](maxPeers int) *Table[V] {
	if maxPeers <= 0 {
		panic(fmt.Sprintf("peerlimit: table bound %d, want > 0", maxPeers))
	}
	return &Table[V]{max: maxPeers, order: list.New(), index: make(map[peer.ID]*list.Element)}
}

// Max is the table's bound.
func (t *Table[V]) Max() int { return t.max }

// Len is the number of peers held.
func (t *Table[V]) Len() int { return len(t.index) }

// Get returns p's value and marks p most recently used.
func (t *Table[V]) Get(p peer.ID) (V, bool) {
	e, ok := t.index[p]
	if !ok {
		var zero V
		return zero, false
	}
	t.order.MoveToBack(e)
	return e.Value.(*entry[V]).v, true
}

// Peek returns p's value without marking it used.
func (t *Table[V]) Peek(p peer.ID) (V, bool) {
	e, ok := t.index[p]
	if !ok {
		var zero V
		return zero, false
	}
	return e.Value.(*entry[V]).v, true
}

// Put sets p's value and marks p most recently used. When p is new and the
// table is full, the least recently used peer is forgotten first; it is
// returned with evicted true.
func (t *Table[V]) Put(p peer.ID, v V) (evicted peer.ID, ok bool) {
	if e, found := t.index[p]; found {
		e.Value.(*entry[V]).v = v
		t.order.MoveToBack(e)
		return "", false
	}
	if len(t.index) >= t.max {
		oldest := t.order.Front()
		evicted, ok = t.remove(oldest), true
	}
	t.index[p] = t.order.PushBack(&entry[V]{p: p, v: v})
	return evicted, ok
}

// Delete forgets p.
func (t *Table[V]) Delete(p peer.ID) {
	if e, ok := t.index[p]; ok {
		t.remove(e)
	}
}

// DeleteFunc forgets every peer for which del returns true.
func (t *Table[V]) DeleteFunc(del func(peer.ID, V) bool) {
	for e := t.order.Front(); e != nil; {
		next := e.Next()
		if en := e.Value.(*entry[V]); del(en.p, en.v) {
			t.remove(e)
		}
		e = next
	}
}

// All yields the peers and their values, least recently used first,
// without marking them used. The loop body may Delete the peer it is given
// (not others).
func (t *Table[V]) All() iter.Seq2[peer.ID, V] {
	return func(yield func(peer.ID, V) bool) {
		for e := t.order.Front(); e != nil; {
			next := e.Next()
			en := e.Value.(*entry[V])
			if !yield(en.p, en.v) {
				return
			}
			e = next
		}
	}
}

func (t *Table[V]) remove(e *list.Element) peer.ID {
	p := t.order.Remove(e).(*entry[V]).p
	delete(t.index, p)
	return p
}
